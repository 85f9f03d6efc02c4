"""The experiment schema: one frozen dataclass per TOML table, validated at construction.

Scalar settings are typed fields. Pluggable components (model, partitioner, aggregator, stages, attack) are
``Component`` tables: a registry ``name`` plus the factory's own parameters, checked against the factory's
signature when the experiment is built (``config/build.py``). Compatibility contract: fields are
never removed or re-purposed; new fields are optional.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from typing import Any, Literal

FLOAT32_MAX = 3.4028234663852886e38
"""float32's largest value (core.checks.FLOAT32_MAX; the schema imports nothing of trustfl): a step size or decay
beyond it cannot scale float32 tensors."""


class FieldError(Exception):
    """Raised by ``__post_init__``; the loader turns it into a ConfigError carrying the full key path."""

    def __init__(self, name: str, value: Any, allowed: str) -> None:
        super().__init__(name, value, allowed)
        self.name, self.value, self.allowed = name, value, allowed


def check(ok: bool, name: str, value: Any, allowed: str) -> None:
    if not ok:
        raise FieldError(name, value, allowed)


def keys_set(table: Any, keys: tuple[str, ...] | None = None) -> list[str]:
    """Those of ``keys`` (default: all its fields) that the table ``table`` (a schema dataclass) holds away from
    their defaults, in order."""
    default = type(table)()
    keys = tuple(f.name for f in fields(table)) if keys is None else keys
    return [key for key in keys if getattr(table, key) != getattr(default, key)]


@dataclass(frozen=True)
class Component:
    """A registry entry chosen by ``name`` with its parameters (any other keys of the table)."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DataConfig:
    dataset: str = "digits"
    num_clients: int = 20
    partition: Component = field(default_factory=lambda: Component("iid"))
    options: dict[str, Any] = field(default_factory=dict)
    data_dir: str = ""
    fallback: str = ""
    """Data set to use, with a printed notice, when ``dataset`` is not on this machine (e.g. "digits")."""
    path: str = ""
    """Your own file or folder for ``dataset`` = ``npz``, ``csv``, ``parquet`` or ``image_folder`` (docs/data.md);
    a relative path is read from the working directory, like ``plugins``. It reaches the loader as its ``path``
    argument."""
    features: Component = field(default_factory=lambda: Component("contiguous"))
    """``vertical`` engine: how the features are split among the ``num_clients`` parties: ``contiguous`` (blocks
    of whole ``unit``s, e.g. image rows; ``unit = 0``: the image width, or 1 for tables), ``shuffled`` (random
    units, seeded), or ``columns`` (``columns = [[...], ...]``: one list of column indices per party)."""

    def __post_init__(self) -> None:
        check(self.num_clients >= 1, "num_clients", self.num_clients, "an integer >= 1")
        check("path" not in self.options, "options.path", self.options.get("path"),
              "absent: give the file or folder as `data.path`")


@dataclass(frozen=True)
class CohortConfig:
    sampler: Literal["all", "uniform", "poisson"] = "all"
    size: int = 0
    rate: float = 0.0

    def __post_init__(self) -> None:
        if self.sampler == "uniform":
            check(self.size >= 1, "size", self.size, "an integer >= 1 with sampler = \"uniform\"")
        if self.sampler == "poisson":
            check(0 < self.rate <= 1, "rate", self.rate, "a number in (0, 1] with sampler = \"poisson\"")


@dataclass(frozen=True)
class SampleDPConfig:
    """Sample-level DP-SGD inside local training (issue #3); ``mode = "off"`` disables it."""

    mode: Literal["off", "per_example", "batch_clip"] = "off"
    clip: float = 1.0
    noise_multiplier: float = 0.0
    epsilon: float = 0.0
    """Per-client budget ε (0 = unlimited, track only). With ``noise_multiplier = 0`` each client's noise is
    calibrated to spend exactly this over the whole schedule; with a given ``noise_multiplier`` the schedule is
    checked against it and refused if it would overspend."""
    epsilons: list[float] = field(default_factory=list)
    """Per-client ε targets (heterogeneous budgets); overrides ``epsilon``."""
    epsilon_distribution: str = ""
    delta: float = 1e-5
    accountant: Literal["rdp", "pld"] = "rdp"
    calibration: Literal["accountant", "rhdp"] = "accountant"
    """How z is calibrated from ε: with ``accountant`` itself, or Robust-HDP's code (classic RDP conversion,
    bisection, fractional orders). The accountant still enforces the budget: at large ε over few steps (ε = 8,
    q = 0.036, 28 steps) Robust-HDP's z spends more under its integer orders (8.55), and the run is refused."""
    method: Literal["ghost", "vmap"] = "ghost"
    round_noise_to: int = -1
    """Round calibrated noise multipliers to this many decimals (Robust-HDP's code uses 2); -1 = no rounding."""

    def __post_init__(self) -> None:
        check(0 < self.clip < math.inf, "clip", self.clip, "a finite number > 0")
        check(0 <= self.noise_multiplier < math.inf, "noise_multiplier", self.noise_multiplier,
              "a finite number >= 0")
        check(0 <= self.epsilon < math.inf, "epsilon", self.epsilon,
              "a finite number >= 0 (0 = use noise_multiplier)")
        check(all(0 < e < math.inf for e in self.epsilons), "epsilons", self.epsilons,
              "a list of finite numbers > 0")
        check(0 < self.delta < 1, "delta", self.delta, "a number in (0, 1)")
        check(-1 <= self.round_noise_to <= 15, "round_noise_to", self.round_noise_to,
              "-1 (no rounding) or a number of decimals from 0 to 15 (a float holds no digit beyond)")


@dataclass(frozen=True)
class ClientConfig:
    epochs: int = 1
    steps: int = 0
    """Local steps per round; when > 0 it replaces ``epochs``."""
    batch_size: int = 32
    batch_sizes: list[int] = field(default_factory=list)
    """Per-client batch sizes (cycled over clients); overrides ``batch_size``."""
    lr: float = 0.05
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """The local learning rate over rounds: ``constant``, or ``cosine`` annealing from ``lr`` towards 0 over the
    run's rounds (synchronous engine)."""
    momentum: float = 0.0
    weight_decay: float = 0.0
    batch_sampler: str = "shuffle"
    dp: SampleDPConfig = field(default_factory=SampleDPConfig)
    transforms: list[Component] = field(default_factory=list)
    """Gradient transforms (``trustfl list``: proximal, scaffold, ...) applied after the gradient method and DP
    noise, before weight decay, momentum and the SGD step."""
    step_budget: Component = field(default_factory=lambda: Component("full"))
    """How many planned local steps each client completes (``full``; ``stragglers`` with ``fraction``)."""
    augment: Component = field(default_factory=lambda: Component("none"))
    """How every local batch is augmented before the objective sees it (``views``: 2V augmented views of every
    image under ``views``, for self-supervised objectives); ``none``: batches as stored."""
    statistics: list[Component] = field(default_factory=list)
    """Client statistics exchanged before local training (``fedsc_correlation``: FedSC's DP-CalR matrices and
    R̃_{−j}); the synchronous engine only. Recipes set them."""

    def __post_init__(self) -> None:
        check(self.epochs >= 1, "epochs", self.epochs, "an integer >= 1")
        check(self.steps >= 0, "steps", self.steps, "an integer >= 0 (0 = use epochs)")
        check(self.batch_size >= 1, "batch_size", self.batch_size, "an integer >= 1")
        check(all(b >= 1 for b in self.batch_sizes), "batch_sizes", self.batch_sizes, "integers >= 1")
        check(0 < self.lr <= FLOAT32_MAX, "lr", self.lr, f"a number > 0 and <= {FLOAT32_MAX:.4g} (it scales float32 steps)")
        check(0 <= self.momentum < 1, "momentum", self.momentum, "a number in [0, 1)")
        check(0 <= self.weight_decay <= FLOAT32_MAX, "weight_decay", self.weight_decay,
              f"a number >= 0 and <= {FLOAT32_MAX:.4g} (it scales float32 parameters)")


@dataclass(frozen=True)
class ServerConfig:
    optimizer: Literal["sgd", "fedadam"] = "sgd"
    lr: float = 1.0
    momentum: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3
    weighting: Literal["num_samples", "uniform"] = "num_samples"
    extras: Literal["mean", "median"] = "mean"
    """How the server combines what gradient transforms send beside the message (SCAFFOLD's control-variate
    deltas): ``mean``, the algorithm's own average; ``median``, every client's replaced by their coordinate-wise
    median first, so that a minority of Byzantine clients cannot move the server's state far (one huge delta stops
    training under ``mean``). Refused without a transform that sends any."""

    def __post_init__(self) -> None:
        check(self.lr > 0 and math.isfinite(self.lr), "lr", self.lr, "a finite number > 0")
        check(0 <= self.momentum < 1, "momentum", self.momentum, "a number in [0, 1)")
        check(0 <= self.beta1 < 1, "beta1", self.beta1, "a number in [0, 1)")
        check(0 <= self.beta2 < 1, "beta2", self.beta2, "a number in [0, 1)")
        check(0 < self.tau < math.inf, "tau", self.tau, "a finite number > 0")


@dataclass(frozen=True)
class AttackConfig:
    name: str = "none"
    num_byzantine: int = 0
    params: dict[str, Any] = field(default_factory=dict)
    byzantine_hold_data: bool = True
    """False: the data are split among the honest clients only (CafCor's setting)."""
    view: Literal["transmitted", "noiseless"] = "transmitted"
    """What an update-level attack sees of the honest clients: the messages they send ("transmitted", after
    every client stage; docs/papers/cafcor.md, "What the attacker sees"), or the messages their client stages
    would produce without the privacy-noise stages ("noiseless", a simulation-only oracle kept with its own stage
    state)."""
    extras: Literal["zero", "crafted"] = "zero"
    """What an update-level attack's clients send beside the message (SCAFFOLD's control-variate delta): "zero", or
    "crafted", the attack applied to the honest clients' extras as to their messages (what a real Byzantine node
    can send; ``server.extras = "median"`` is the defence). Refused without a transform that sends extras."""

    def __post_init__(self) -> None:
        check(self.num_byzantine >= 0, "num_byzantine", self.num_byzantine, "an integer >= 0")
        check(self.view in ("transmitted", "noiseless"), "view", self.view, '"transmitted" or "noiseless"')
        check(self.extras in ("zero", "crafted"), "extras", self.extras, '"zero" or "crafted"')


MAX_ROUNDS = 10_000_000
"""The most ``rounds`` a run may ask for: far beyond any run's length, short of what building it would spend on
per-round plans (an absurd count used to hang or exhaust memory at build time)."""
DEVICE_PATTERN = re.compile(r"cpu|auto|cuda(:(0|[1-9][0-9]*))?")
"""The values ``engine.device`` takes (whether a CUDA device is present is checked when the run is built)."""


@dataclass(frozen=True)
class EngineConfig:
    kind: str = "sync"
    """The engine registered under this name (``trustfl list``): ``sync`` (rounds that wait for every sampled
    client), ``async`` (server steps on a virtual clock) or ``vertical`` (feature-partitioned parties; set by
    the vertical algorithms ``dpzv``, ``vafl``, ``zoo_vfl``, ``czofo``)."""
    schedule: Component = field(default_factory=lambda: Component("synchronous"))
    """``async`` engine: who reports at each server step (``polling`` = QuAFL, ``synchronous`` = FedAvg/FedNova in
    simulated time, ``buffered`` = FedBuff/FedAsync); recipes set it."""
    speed: Component = field(default_factory=lambda: Component("exponential_groups"))
    """``async`` engine: how long each client's local steps take (``exponential_groups``,
    ``exponential_uniform_means``, ``deterministic``, ``trace``)."""
    interaction_time: float = 1.0
    """Server interaction time ``sit`` of one step with 32-bit messages (scaled by the links' bits / 32)."""
    wait_time: float = 0.0
    """Server waiting time ``swt`` between two steps."""
    time_limit: float = 0.0
    """Stop once the simulated time reaches this (0: run ``rounds`` server steps)."""
    executor: Literal["vectorized", "sequential"] = "vectorized"
    activation: Literal["shuffled", "uniform", "clock"] = "shuffled"
    """``vertical`` engine: which party each server iteration activates (``clock``: in the order the parties
    finish on a virtual clock with the ``engine.speed`` model)."""
    iterations_per_round: int = 0
    """``vertical`` engine: server iterations per round (0: ``num_clients·⌈D/batch_size⌉``, one pass of every
    party over the data)."""
    eval_every: int = 1
    checkpoint_every: int = 10
    eval_batch_size: int = 2048
    max_clients_per_batch: int | Literal["auto"] = 0
    """Vectorized executor: run at most this many clients in one batched computation (0 = the whole cohort;
    ``"auto"``: as many as fit in the free memory of the run's device, estimated from the model's size and one
    example's activations)."""
    eval_initial: bool = False
    """Also evaluate the initial (untrained) model: ``initial_<metric>`` in ``summary.json`` and ``run_info.json``
    (the floor of a representation metric)."""
    device: str = "cpu"
    """Where the run computes: ``cpu``, ``cuda`` (the current CUDA device), ``cuda:N`` or ``auto`` (``cuda`` when
    a CUDA device is present, else ``cpu``; the choice is recorded in ``run_info.json``). The model, the data and
    every round's tensors live there from the start; a CUDA device that is not present is refused when the
    experiment is built (``config/build.py``), never silently replaced by the CPU."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """The dtype of local training's forward computation (``bfloat16``: autocast around the objective; the
    stacked parameters, updates, aggregation, noise and accounting stay float32/float64)."""

    def __post_init__(self) -> None:
        check(DEVICE_PATTERN.fullmatch(self.device) is not None, "device", self.device,
              '"cpu", "cuda", "cuda:N" (N = 0, 1, ...) or "auto"')
        check(self.eval_every >= 1, "eval_every", self.eval_every, "an integer >= 1")
        check(self.checkpoint_every >= 0, "checkpoint_every", self.checkpoint_every, "an integer >= 0 (0 = never)")
        check(self.eval_batch_size >= 1, "eval_batch_size", self.eval_batch_size, "an integer >= 1")
        check(self.max_clients_per_batch == "auto" or self.max_clients_per_batch >= 0, "max_clients_per_batch",
              self.max_clients_per_batch, 'an integer >= 0 or "auto"')
        check(self.iterations_per_round >= 0, "iterations_per_round", self.iterations_per_round,
              "an integer >= 0 (0 = one pass of every party over the data)")
        for name in ("interaction_time", "wait_time", "time_limit"):
            value = getattr(self, name)
            check(math.isfinite(value) and value >= 0, name, value, "a finite number >= 0")


@dataclass(frozen=True)
class CompressConfig:
    uplink: Component = field(default_factory=lambda: Component("none"))
    """The compressor of the clients' messages (``identity``, ``lattice``, ``qsgd``, ``qsgd_minmax``); ``none``:
    float32 messages."""
    downlink: Component = field(default_factory=lambda: Component("none"))
    """The compressor of the server's model on its way to the clients."""


@dataclass(frozen=True)
class DeployConfig:
    """A real deployment through Flower (``trustfl deploy``, docs/deployment.md); the simulator ignores it."""

    round_timeout_s: float = 120.0
    """How long the server waits for a round's replies; a node that has not answered by then is dropped from the
    round (counted in ``dropped``)."""
    startup_timeout_s: float = 120.0
    """How long the server waits for all ``data.num_clients`` nodes to connect before it refuses to start."""
    secrets: Literal["node", "run_seed"] = "node"
    """Where a node's private randomness comes from (its X25519 key, its DP noise, its batches): ``node`` (the
    node's operating system; nothing the server holds reproduces it) or ``run_seed`` (derived from ``seed`` as
    in the simulator, so a deployment equals the simulation; the server knows the seed and could remove the
    noise: for testing the deployment only)."""

    def __post_init__(self) -> None:
        for name in ("round_timeout_s", "startup_timeout_s"):
            value = getattr(self, name)
            check(math.isfinite(value) and value > 0, name, value, "a finite number of seconds > 0")


@dataclass(frozen=True)
class ReportConfig:
    primary_metric: str = ""
    """The metric the progress bar, the CLI and the summary lead with (default: the first evaluator's first
    metric, e.g. ``accuracy`` for classification, ``mse`` for regression)."""
    tensorboard: bool = False
    """Also write every ``metrics.jsonl`` row's numbers as TensorBoard scalars into ``<run_dir>/tensorboard/``
    (needs the optional ``tensorboard`` package: ``pip install tensorboard``)."""


@dataclass(frozen=True)
class ExperimentConfig:
    name: str = "experiment"
    """The run's name, the first part of its default directory ``runs/<name>-<dataset>-seed<seed>-<time>``: 1 to
    100 characters, no path separator or control character, not starting with a dot."""
    algorithm: str = "fedavg"
    seed: int = 0
    rounds: int = 10
    data: DataConfig = field(default_factory=DataConfig)
    model: Component = field(default_factory=lambda: Component("mlp"))
    """The registered model and its parameters; ``init_from = "path.pt"`` starts the run from saved weights
    instead of the seeded initialisation: a ``state_dict()`` of the model (e.g. a run's ``model.pt``) or a flat
    tensor of all its parameters, read from the working directory like ``data.path``."""
    objective: Component = field(default_factory=lambda: Component("auto"))
    """The registered objective (``cross_entropy``, ``mse``, ``bce``, a plugin's own); ``auto`` picks
    ``cross_entropy`` for class labels and ``mse`` for real-valued targets."""
    evaluators: list[Component] = field(default_factory=list)
    """Registered evaluators (``accuracy``, ``loss``, ``mse``, ``mae``, ``r2``, ...); empty: the objective's
    task's defaults."""
    cohort: CohortConfig = field(default_factory=CohortConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    client_stages: list[Component] = field(default_factory=list)
    attack: AttackConfig = field(default_factory=AttackConfig)
    pre_aggregators: list[Component] = field(default_factory=list)
    aggregator: Component = field(default_factory=lambda: Component("mean"))
    server_stages: list[Component] = field(default_factory=list)
    server: ServerConfig = field(default_factory=ServerConfig)
    downlink: list[Component] = field(default_factory=list)
    """Downlink stages (e.g. ``cast`` to bfloat16) the server's messages to clients go through."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    compress: CompressConfig = field(default_factory=CompressConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    deploy: DeployConfig = field(default_factory=DeployConfig)
    """Settings of a real deployment through Flower; the simulator ignores them."""
    plugins: list[str] = field(default_factory=list)
    """Python modules imported before the experiment is built: they register a user's own data sets, models,
    objectives or evaluators (``@trustfl.register``)."""
    recipe: dict[str, Any] = field(default_factory=dict)
    """Algorithm-specific settings read by the recipe named in ``algorithm``."""

    def __post_init__(self) -> None:
        check(0 < len(self.name) <= 100 and self.name.strip() == self.name and not self.name.startswith(".")
              and not any(c in "/\\" or ord(c) < 32 or ord(c) == 127 for c in self.name), "name", self.name,
              "1 to 100 characters without a path separator or control character, not starting with a dot or "
              "space (it names the run directory)")
        check(1 <= self.rounds <= MAX_ROUNDS, "rounds", self.rounds,
              f"an integer from 1 to {MAX_ROUNDS:,} (schedules, evaluation and privacy plans are laid out per "
              f"round when the run is built)")
        check(self.seed >= 0, "seed", self.seed, "an integer >= 0")
        init_from = self.model.params.get("init_from", "")
        check(isinstance(init_from, str), "model.init_from", init_from,
              "the path of a .pt file (a string) holding the model's state_dict or a flat parameter tensor")
