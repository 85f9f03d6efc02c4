"""The model a config names: built from the registry with seeded weights, or started from ``model.init_from``."""
from __future__ import annotations

import itertools
import zipfile
from pathlib import Path

import torch

from trustfl.config.schema import ExperimentConfig
from trustfl.core.memory import out_of_memory_as_error
from trustfl.core.paths import looked_up
from trustfl.core.registry import lookup
from trustfl.core.rng import derive_seed
from trustfl.data.datasets import Dataset
from trustfl.errors import ConfigError, DataError, RegistryError, ResourceError, TrustFLError
from trustfl.evaluate.base import eval_mode
from trustfl.models.zoo import build_model
from trustfl.objectives.base import AbstractObjective
from trustfl.types import ParamLayout


def build_config_model(cfg: ExperimentConfig, dataset: Dataset, seed: int, num_outputs: int,
                       blocks: list | None = None) -> torch.nn.Module:
    """The model ``[model]`` names, built with weights drawn from ``seed`` (or loaded from ``model.init_from``),
    ``num_outputs`` outputs and, for the vertical model, the feature ``blocks``; errors name the ``model`` key."""
    try:
        lookup("model", cfg.model.name)
    except RegistryError as err:
        raise ConfigError(f"`model.name`: {err}") from None
    params = {k: v for k, v in cfg.model.params.items() if k != "init_from"}
    if "blocks" in params:
        raise ConfigError("`model.blocks` is set by the feature split (`data.features`); remove it.")
    if blocks is not None:
        params["blocks"] = blocks
    try:
        with out_of_memory_as_error(f"the model {cfg.model.name!r}", "its sizes in `[model]`"):
            model = build_model(cfg.model.name, dataset.input_shape, num_outputs, derive_seed(seed, "model"), **params)
    except TypeError as err:
        raise ConfigError(f"`model` ({cfg.model.name!r}): {err}") from None
    except ResourceError:  # a model larger than the machine: said as every failed allocation is
        raise
    except TrustFLError as err:
        raise ConfigError(f"`model`: {err}") from None
    except (RuntimeError, OverflowError) as err:  # e.g. a size torch refuses
        raise ConfigError(f"`model` ({cfg.model.name!r}) cannot be built: {str(err).splitlines()[0]}") from None
    meta = next((n for n, t in itertools.chain(model.named_parameters(), model.named_buffers()) if t.is_meta), None)
    if meta is not None:  # moving it to `engine.device` raised a raw NotImplementedError
        raise ConfigError(f"`model` ({cfg.model.name!r}): its tensor {meta!r} is on the meta device (a shape without "
                          f"values), so it cannot be trained; build the model's layers without device=\"meta\" "
                          f"(trustfl builds every model on the CPU and moves it to `engine.device`).")
    check_parameters(model, f"`model` ({cfg.model.name!r})")
    if cfg.model.params.get("init_from"):
        load_initial_weights(model, cfg.model.params["init_from"], cfg.model.name)
    return model


def check_parameters(model: torch.nn.Module, who: str) -> None:
    """Refuse (ConfigError starting with ``who``) a model some of whose parameters are frozen (trustfl trains
    every parameter: a flat vector of them all) or whose parameters mix dtypes (the flat vector has one)."""
    named = list(model.named_parameters())
    frozen = [n for n, p in named if not p.requires_grad]
    if frozen and len(frozen) < len(named):  # none trainable: said by check_model_fits
        raise ConfigError(f"{who} has parameters with requires_grad=False ({', '.join(map(repr, frozen))}), which "
                          f"trustfl would train (it trains every parameter); register a fixed tensor as a buffer "
                          f"(register_buffer) instead.")
    dtypes: dict[torch.dtype, list[str]] = {}
    for n, p in named:
        dtypes.setdefault(p.dtype, []).append(n)
    if len(dtypes) > 1:
        found = "; ".join(f"{str(d).removeprefix('torch.')}: {', '.join(map(repr, ns))}" for d, ns in dtypes.items())
        raise ConfigError(f"{who} mixes parameter dtypes ({found}); trustfl trains one flat vector of them, so give "
                          f"every parameter one dtype (cast inputs inside forward instead).")


def _shape(t: torch.Tensor) -> str:
    return str(tuple(t.shape))


def load_initial_weights(model: torch.nn.Module, source: str, name: str = "") -> None:
    """Load ``model.init_from`` into ``model`` in place: a file holding a ``state_dict()`` of the model (keys and
    shapes as ``model.state_dict()``; e.g. a run's ``model.pt``) or a flat tensor of all its parameters in
    ``named_parameters()`` order (the layout of trustfl's messages).

    Raises:
      ConfigError: the file does not exist.
      DataError: the file is not a tensor file, or its keys, shapes, length or values do not fit the model.
    """
    path = looked_up(Path(source).expanduser(), "`model.init_from`").resolve()
    what = f"model {name!r}" if name else "the model"
    if not path.is_file():
        raise ConfigError(f"`model.init_from`: no file {str(path)!r} (a path is read from the working directory).")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a truncated or foreign file, or pickled objects (never unpickled here)
        if zipfile.is_zipfile(path) and "weights only" in str(err).lower():
            raise DataError(f"`model.init_from`: {path} holds objects other than tensors (e.g. a pickled module), "
                            f"which are not loaded; save the model's state_dict() (as a run's model.pt) or a flat "
                            f"parameter tensor.") from None
        raise DataError(f"`model.init_from`: {path} is not a tensor file written by torch.save "
                        f"({type(err).__name__}).") from None
    own = model.state_dict()
    if isinstance(data, torch.Tensor):
        names = [k for k, _ in model.named_parameters()]
        layout = ParamLayout.of({k: own[k] for k in names})
        if data.dim() != 1 or data.numel() != layout.numel:
            raise DataError(f"`model.init_from`: {path} holds a tensor of shape {_shape(data)}; {what} takes a "
                            f"flat tensor of shape ({layout.numel},) (all its parameters in named_parameters() "
                            f"order) or a state_dict().")
        loaded = dict(layout.unflatten(data))
    elif isinstance(data, dict) and all(isinstance(v, torch.Tensor) for v in data.values()):
        loaded = data
        missing = [k for k in own if k not in loaded]
        if missing:
            raise DataError(f"`model.init_from`: {path} has no tensor {missing[0]!r}, which {what} has "
                            f"({len(missing)} of its {len(own)} keys missing).")
        extra = [k for k in loaded if k not in own]
        if extra:
            raise DataError(f"`model.init_from`: {path} has a tensor {extra[0]!r}, which {what} does not have "
                            f"(its keys: {', '.join(own)}).")
        for k, v in own.items():
            if loaded[k].shape != v.shape:
                raise DataError(f"`model.init_from`: {k!r} has shape {_shape(loaded[k])} in {path}, {what} "
                                f"expects {_shape(v)}.")
    else:
        raise DataError(f"`model.init_from`: {path} holds a {type(data).__name__}, not a state_dict (a mapping of "
                        f"names to tensors) or a flat parameter tensor.")
    for k, v in loaded.items():
        if v.is_complex():  # copy_ would drop the imaginary part (a complex NaN got through the check below)
            raise DataError(f"`model.init_from`: {k!r} in {path} holds complex values ({v.dtype}); a model's "
                            f"parameters are real.")
        if v.is_floating_point() and not bool(torch.isfinite(v).all()):
            raise DataError(f"`model.init_from`: {k!r} in {path} holds non-finite values (NaN or Inf).")
    with torch.no_grad():
        for k, v in own.items():
            if k in loaded:
                v.copy_(loaded[k])
                if v.is_floating_point() and not bool(torch.isfinite(v).all()):  # e.g. float64 1e39 into float32
                    raise DataError(f"`model.init_from`: {k!r} in {path} holds values beyond the model's {v.dtype} "
                                    f"range ({loaded[k].dtype} in the file).")


SUPERVISED_TASKS = ("classification", "regression", "multilabel")


def check_model_fits(cfg: ExperimentConfig, model: torch.nn.Module, objective: AbstractObjective,
                     dataset: Dataset, objective_name: str) -> None:
    """Refuse (ConfigError naming ``model``) a model with no trainable parameters, or whose outputs for two
    training examples the supervised ``objective`` cannot turn into two losses (e.g. 3 outputs for 10 classes),
    before any round runs; or whose forward in training writes a buffer or draws random numbers
    (:func:`check_training_forward`). The shape probe runs in eval mode without gradients."""
    who = f"`model` ({cfg.model.name!r})"
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(f"{who} has no trainable parameters: federated training would have nothing to learn.")
    x, y = (dataset.train_x, dataset.train_y) if len(dataset.train_x) else (dataset.test_x, dataset.test_y)
    if objective.input_key != "x" or not len(x):
        return
    device = next(model.parameters()).device
    batch = {"x": x[:2].to(device), "y": y[:2].to(device)}
    supervised = objective.task in SUPERVISED_TASKS and not objective.batch_coupled
    if supervised or type(objective).forward is AbstractObjective.forward:  # a plain call of the model on x
        check_training_forward(who, model, objective, batch)
    if not supervised:
        return
    needed = objective.num_outputs(dataset.train_y, dataset.num_classes)
    fit = f"objective {objective_name!r} on this data needs {needed} output(s) per example"
    try:
        with eval_mode(model), torch.no_grad():
            outputs = objective.forward(model, {k: v.detach() for k, v in model.named_parameters()}, batch)
            if not isinstance(outputs, torch.Tensor) or outputs.shape[:1] != (2,) or outputs[0].numel() != needed:
                found = tuple(outputs.shape) if isinstance(outputs, torch.Tensor) else type(outputs).__name__
                raise ConfigError(f"{who} gives outputs of shape {found} for 2 examples; {fit}.")
            losses = objective.losses(outputs, batch)
    except ConfigError:
        raise
    except (RuntimeError, IndexError, ValueError, TypeError) as err:
        raise ConfigError(f"{who} fails on 2 training examples ({fit}): {str(err).splitlines()[0]}") from None
    if not isinstance(losses, torch.Tensor) or tuple(losses.shape) != (2,):
        found = tuple(losses.shape) if isinstance(losses, torch.Tensor) else type(losses).__name__
        raise ConfigError(f"{who}: objective {objective_name!r} gives losses of shape {found} for its "
                          f"outputs of shape {tuple(outputs.shape)} for 2 examples; it must give (2,).")


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(
        ((a == b) | (a != a) & (b != b)).all() if a.is_floating_point() else torch.equal(a, b))


def _rng_states(cuda: list[int]) -> list[torch.Tensor]:
    return [torch.get_rng_state(), *(torch.cuda.get_rng_state(i) for i in cuda)]


def check_training_forward(who: str, model: torch.nn.Module, objective: AbstractObjective, batch: dict) -> None:
    """Refuse (ConfigError starting with ``who``) a model whose forward, in the mode training runs it in, writes a
    buffer (e.g. BatchNorm's running statistics): the clients share one model object, so the buffer would carry
    one client's data into another's, and a checkpoint holds only the flat parameters; or draws random numbers
    (e.g. dropout), which the vectorised executors' ``vmap`` refuses. Probed twice on ``batch`` without gradients,
    under a forked RNG (the global RNG is left as it was)."""
    device = next(model.parameters()).device
    cuda = [torch.cuda.current_device() if device.index is None else device.index] if device.type == "cuda" else []
    params = {k: v.detach() for k, v in model.named_parameters()}
    before = {k: b.detach().clone() for k, b in model.named_buffers()}
    try:
        with torch.random.fork_rng(devices=cuda), torch.no_grad():
            states = _rng_states(cuda)
            first = objective.forward(model, params, batch)
            drew = any(not torch.equal(a, b) for a, b in zip(states, _rng_states(cuda)))
            second = objective.forward(model, params, batch)
    except (RuntimeError, IndexError, ValueError, TypeError):
        return  # said by the shape probe that follows, in eval mode
    after = dict(model.named_buffers())
    changed = [k for k in before if k not in after or not _same(before[k], after[k])] + [
        k for k in after if k not in before]
    if changed:
        owners = {type(model.get_submodule(k.rpartition(".")[0])) for k in changed if k in after}
        hint = (" (BatchNorm's running statistics: use GroupNorm or LayerNorm, or track_running_stats=False)"
                if any(issubclass(t, torch.nn.modules.batchnorm._NormBase) for t in owners) else "")
        raise ConfigError(f"{who}: its forward in training writes the buffer(s) {', '.join(map(repr, changed))}"
                          f"{hint}; the clients share one model object, so a buffer written in training would carry "
                          f"one client's data into another's (and is not checkpointed): keep state in parameters.")
    # outputs that differ: a private generator (compared on the CPU only: a GPU's kernels may differ call to call)
    differ = device.type == "cpu" and all(isinstance(t, torch.Tensor) for t in (first, second)) and not _same(
        first, second)
    if drew or differ:
        raise ConfigError(f"{who}: its forward in training draws random numbers (e.g. dropout in training mode), "
                          f"which trustfl's vectorised training (torch.func.vmap) refuses and a seeded run cannot "
                          f"replay; remove the dropout or call it with training=False.")
