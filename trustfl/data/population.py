"""Populations generated on demand: FedProx's Synthetic(α, β) with any number of clients
(``data.dataset = "synthetic"``).

A population's memory is its per-client sizes; client ``k``'s examples are generated from a generator keyed by
``(seed, "synthetic", k)`` only when ``k`` is needed (when it is sampled into a cohort), so a population of 10⁶
clients costs about 24 MB (sizes and offsets) and a round costs its cohort's examples. The federation's training
rows are virtual: client ``k`` owns rows ``offsets[k] .. offsets[k+1]``, and the engine materialises a group's
clients once per round (:meth:`trustfl.engine.local.TrainData.for_cohort`).

Client ``k`` of Synthetic(α, β) (Li et al. 2020, §5.1; Shamir et al. 2014) draws its own model and inputs:

    u_k ~ N(0, α),  W_k ~ N(u_k, 1)^{C×d},  b_k ~ N(u_k, 1)^{C}             (how different the local models are)
    B_k ~ N(0, β),  v_k ~ N(B_k, 1)^{d},    x ~ N(v_k, Σ), Σ = diag(j^{−1.2})  (how different the local data are)
    y = argmax softmax(W_k x + b_k)

(d = 60, C = 10 in the paper; ``dim`` and ``classes`` here) and holds ``n_k = min(⌊LogNormal(4, 2)⌋ + 50,
max_samples)`` examples (the authors' power law, capped; ``min_samples`` is the shift 50; ``samples`` > 0 gives
every client exactly that many, for benchmarks). The sizes of all clients are drawn at once from
``(seed, "synthetic", "sizes")``. Each client's first ``round(0.2·n_k)`` examples are its share of the test set and
the rest its training data. The held-out test set is the test shares of clients ``0 .. test_clients − 1``
(materialised once): the clients are i.i.d. by construction, so the first ones are a random sample.

The population is its own partition (client ``k`` is device ``k``): ``data.partition`` must be ``"natural"`` and
``data.num_clients`` is the population's size. Parts that read the whole training set at once (representation
evaluators, client statistics, the vertical engine) are refused with a ConfigError naming ``data.dataset``.

Reference: Li et al., *Federated optimization in heterogeneous networks*, MLSys 2020, https://arxiv.org/abs/1812.06127
"""
from __future__ import annotations

import abc
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import torch

from trustfl.core.memory import refuse_beyond_free
from trustfl.core.registry import register
from trustfl.core.rng import numpy_rng
from trustfl.data.datasets import TEST_FRACTION, Dataset
from trustfl.errors import ConfigError


class AbstractPopulation(abc.ABC):
    """Clients whose training examples are generated when asked for.

    Attributes:
      offsets: int64 ``(num_clients + 1,)``; client ``k`` owns the virtual training rows
        ``offsets[k] .. offsets[k+1]``.
    """

    offsets: torch.Tensor

    @property
    def num_clients(self) -> int:
        return int(self.offsets.numel()) - 1

    @abc.abstractmethod
    def client_train(self, k: int) -> dict[str, torch.Tensor]:
        """Client ``k``'s training examples as named tensors (``x``, ``y``), examples first."""

    @property
    @abc.abstractmethod
    def example_bytes(self) -> int:
        """Bytes of one materialised training example (all its named tensors)."""

    def materialise(self, clients: Sequence[int]) -> dict[str, torch.Tensor]:
        """The training examples of ``clients``, concatenated in that order; a MemoryError before anything is
        generated when they (twice: the clients' parts and their concatenation) exceed the free memory."""
        ids = torch.as_tensor([int(k) for k in clients], dtype=torch.long)
        rows = int((self.offsets[ids + 1] - self.offsets[ids]).sum()) if len(ids) else 0
        refuse_beyond_free(2 * rows * self.example_bytes)
        parts = [self.client_train(int(k)) for k in clients]
        if not parts:
            empty = self.client_train(0)
            return {key: v[:0] for key, v in empty.items()}
        return {key: torch.cat([p[key] for p in parts]) for key in parts[0]}

    def size_summary(self) -> dict[str, float]:
        """min / quartiles / max of the clients' training sizes (a population's run info lists no per-client
        values)."""
        sizes = self.offsets.diff().numpy()
        return {str(q): float(np.quantile(sizes, q)) for q in (0, 0.25, 0.5, 0.75, 1)}


class NotMaterialised(Mapping):
    """``TrainData.tensors`` of a population: the whole training set is never built, so every read is refused."""

    def __init__(self, name: str) -> None:
        self.name = name

    def _refuse(self):
        raise ConfigError(f"`data.dataset` = {self.name!r} generates each client's examples when the client is "
                          f"sampled; the whole training set is never built, so a part that reads all of it (a "
                          f"representation evaluator, client statistics, the vertical engine) cannot run with it.")

    def __getitem__(self, key: str) -> torch.Tensor:
        self._refuse()

    def __iter__(self) -> Iterator[str]:
        self._refuse()

    def __len__(self) -> int:
        self._refuse()


@dataclass(frozen=True, eq=False)
class SyntheticPopulation(AbstractPopulation):
    """Synthetic(α, β) clients, each generated from ``(seed, "synthetic", k)`` alone (see the module docstring).

    Attributes:
      seed, alpha, beta, dim, classes: the generator's key and the data set's parameters.
      sizes: int64 ``(num_clients,)`` examples per client (training + test share).
    """

    seed: int
    alpha: float
    beta: float
    dim: int
    classes: int
    sizes: np.ndarray
    offsets: torch.Tensor = field(init=False)
    _sd: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        train = self.sizes - np.round(TEST_FRACTION * self.sizes).astype(np.int64)
        object.__setattr__(self, "offsets", torch.from_numpy(np.concatenate([[0], np.cumsum(train)])))
        # Σ = diag(j^{−1.2}): the standard deviations of the input's coordinates, j = 1..d
        object.__setattr__(self, "_sd", (np.arange(1, self.dim + 1, dtype=np.float64) ** -1.2) ** 0.5)

    @property
    def example_bytes(self) -> int:
        return 4 * self.dim + 8  # x float32, y int64

    def client_model(self, k: int,
                     rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Client ``k``'s labelling model and input mean ``(W_k (C, d), b_k (C,), v_k (d,))``, float64."""
        rng = numpy_rng(self.seed, "synthetic", int(k)) if rng is None else rng
        u, big_b = rng.normal(0.0, math.sqrt(self.alpha)), rng.normal(0.0, math.sqrt(self.beta))
        w, b = rng.normal(u, 1.0, (self.classes, self.dim)), rng.normal(u, 1.0, self.classes)
        return w, b, rng.normal(big_b, 1.0, self.dim)

    def client(self, k: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Client ``k``'s examples ``(x float32 (n_k, d), y int64 (n_k,), n_test)``; the first ``n_test`` rows are
        its test share."""
        n = int(self.sizes[k])
        rng = numpy_rng(self.seed, "synthetic", int(k))
        w, b, v = self.client_model(k, rng)
        x = rng.standard_normal((n, self.dim))  # float64 draws: numpy's float32 path is slower
        x *= self._sd
        x += v
        # The labels' product in torch, not NumPy: NumPy's OpenBLAS threads keep spinning after a call and, on a
        # small machine, slow the torch training that follows in the same process by up to 3x.
        y = torch.argmax(torch.from_numpy(x) @ torch.from_numpy(w).T + torch.from_numpy(b), dim=1).numpy()
        return x.astype(np.float32), y, int(round(TEST_FRACTION * n))

    def client_train(self, k: int) -> dict[str, torch.Tensor]:
        x, y, n_test = self.client(k)
        return {"x": torch.from_numpy(x[n_test:]), "y": torch.from_numpy(y[n_test:].astype(np.int64))}

    def client_test(self, k: int) -> dict[str, torch.Tensor]:
        x, y, n_test = self.client(k)
        return {"x": torch.from_numpy(x[:n_test].copy()), "y": torch.from_numpy(y[:n_test].astype(np.int64))}


def _integer(name: str, value: object, low: int, high: float = math.inf) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        bound = f"in [{low}, {high}]" if high != math.inf else f">= {low}"
        raise ConfigError(f"`{name}` of data set 'synthetic' must be an integer {bound}, found {value!r}.")
    return int(value)


def power_law_sizes(seed: int, num_clients: int, min_samples: int = 50, max_samples: int = 1000) -> np.ndarray:
    """``n_k = min(⌊LogNormal(4, 2)⌋ + min_samples, max_samples)`` for every client, drawn at once (int64)."""
    rng = numpy_rng(seed, "synthetic", "sizes")
    draws = rng.lognormal(4.0, 2.0, num_clients)
    return np.minimum(np.minimum(draws, 2.0 ** 62).astype(np.int64) + min_samples, max_samples)


MAX_TEST_CLIENTS = 100_000
"""The most clients whose test shares make the synthetic test set (generated at start, one client at a time:
``test_clients = 10**12`` ran for hours before the first round)."""
BYTES_PER_CLIENT = 128
"""Peak memory a population costs per client while a run is built (the sizes, their offsets and the draw's
intermediates: ``trustfl validate`` of ``configs/scale/synthetic_million.toml`` peaked 361 MB higher at 4·10⁶ clients
than at 10⁶, 120 bytes a client). A population larger than the free memory allows is refused before anything is
drawn (``num_clients = 2·10⁹`` was killed by the kernel after two minutes)."""


@register("dataset", "synthetic")
def synthetic(data_dir: str | None = None, seed: int = 0, *, num_clients: int = 30, alpha: float = 1.0,
              beta: float = 1.0, min_samples: int = 50, max_samples: int = 1000, samples: int = 0, dim: int = 60,
              classes: int = 10, test_clients: int = 1000) -> Dataset:
    """Synthetic(α, β) with ``num_clients`` clients generated on demand (``data.num_clients`` in a config).

    Args:
      data_dir: unused.
      seed: the run seed; client ``k``'s data depend on ``(seed, k)`` only.
      num_clients: the population's size (a config passes ``data.num_clients``).
      alpha: α >= 0, the spread of the local models (u_k ~ N(0, α)).
      beta: β >= 0, the spread of the local input means (B_k ~ N(0, β)).
      min_samples: the power law's shift (50 in the paper), >= 1.
      max_samples: the cap on a client's examples, >= ``min_samples``.
      samples: > 0: every client holds exactly this many examples instead of the power law (0: the power law).
      dim: d, the number of features (60 in the paper; 784 gives MNIST-shaped inputs).
      classes: C >= 2.
      test_clients: the test set is the test shares of the first ``min(test_clients, num_clients)`` clients; at most
        :data:`MAX_TEST_CLIENTS` (the test set is generated, one client after another, before the first round).

    Returns:
      A :class:`Dataset` whose ``population`` generates the training data; ``train_x`` / ``train_y`` are empty
      (the training set is never built) and ``test_x`` / ``test_y`` hold the test clients' shares.

    Raises:
      ConfigError: an option out of range (the message names it).

    Example:
      >>> ds = synthetic(seed=0, num_clients=1_000, test_clients=5)
      >>> ds.population.num_clients, ds.input_shape, ds.num_classes, ds.train_x.shape[0]
      (1000, (60,), 10, 0)
    """
    for name, value in (("alpha", alpha), ("beta", beta)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise ConfigError(f"`{name}` of data set 'synthetic' must be a finite number >= 0, found {value!r}.")
    num_clients = _integer("num_clients", num_clients, 1)
    min_samples = _integer("min_samples", min_samples, 1)
    max_samples = _integer("max_samples", max_samples, min_samples)
    samples = _integer("samples", samples, 0)
    dim = _integer("dim", dim, 1)
    classes = _integer("classes", classes, 2)
    test_clients = _integer("test_clients", test_clients, 1, MAX_TEST_CLIENTS)
    refuse_beyond_free(num_clients * BYTES_PER_CLIENT)
    sizes = (np.full(num_clients, samples, dtype=np.int64) if samples
             else power_law_sizes(seed, num_clients, min_samples, max_samples))
    # The largest client's generation (float64 draws and model, float32 copy) and the test set, before either runs.
    test_rows = int(np.round(TEST_FRACTION * sizes[:test_clients]).sum())
    refuse_beyond_free(8 * dim * (classes + 2) + 12 * int(sizes.max()) * dim + 8 * test_rows * dim)
    population = SyntheticPopulation(seed, float(alpha), float(beta), dim, classes, sizes)
    tests = [population.client_test(k) for k in range(min(test_clients, num_clients))]
    law = f"{samples} examples each" if samples else f"min(LogNormal(4, 2) + {min_samples}, {max_samples}) examples"
    return Dataset(
        name="synthetic",
        train_x=torch.zeros((0, dim)), train_y=torch.zeros(0, dtype=torch.int64),
        test_x=torch.cat([t["x"] for t in tests]), test_y=torch.cat([t["y"] for t in tests]),
        input_shape=(dim,), num_classes=classes, task="classification",
        source=f"Synthetic(alpha={alpha}, beta={beta}) of FedProx, {num_clients} clients of {law}, generated on "
               f"demand from the seed; test set: the 20% shares of the first {len(tests)} clients",
        population=population)
