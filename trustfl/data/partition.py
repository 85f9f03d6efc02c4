"""Horizontal partitioners: split a training set's indices among clients (IID, Dirichlet, shards, quantity skew).

Each partitioner is a frozen dataclass registered as ``@register("partitioner", name)`` and called as
``partitioner(labels, num_clients, rng) -> Partition``. Every partition is disjoint, covers every index exactly once
(no remainder is dropped), gives every client at least one example (refused otherwise, naming the empty clients;
only ``dirichlet`` with ``min_size = 0`` allows empty clients, and its summary's ``notice`` names them), and is a
deterministic function of ``rng``'s state. ``Partition.summary`` is plain JSON
(sizes, per-client label histograms, the partitioner's name and parameters) and is saved with the run.

Example:
  >>> import numpy as np
  >>> labels = np.repeat(np.arange(4), 25)
  >>> part = Dirichlet(alpha=0.5)(labels, 5, np.random.default_rng(0))
  >>> sum(part.summary["sizes"]), part.summary["num_clients"], part.summary["partitioner"]
  (100, 5, 'dirichlet')
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from trustfl.core.registry import register
from trustfl.data.own_targets import _list
from trustfl.errors import ConfigError


@dataclass(frozen=True, eq=False)  # holds tensors/arrays: compare by identity
class Partition:
    """Per-client index arrays and a JSON-serialisable summary.

    Attributes:
      indices: ``num_clients`` sorted int64 arrays of indices into the labels passed to the partitioner.
      summary: ``{"partitioner", "params", "num_clients", "num_samples", "num_classes", "sizes",
        "label_histograms"}``; ``label_histograms[i][c]`` counts client i's examples of class c (left out above
        :data:`SUMMARY_MAX_CELLS` clients × classes), ``notice`` where some client holds no example.
    """

    indices: list[np.ndarray]
    summary: dict


SUMMARY_MAX_CLIENTS = 10_000
"""Above this many clients a partition summary holds size quantiles instead of per-client lists."""
SUMMARY_MAX_CELLS = 10_000_000
"""Above this many clients × classes (class ids 0..max label) a summary holds no ``label_histograms``."""


def _check_call(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> np.ndarray:
    """``labels`` as int64 after checking the arguments every partitioner takes (ConfigError naming the argument)."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ConfigError(f"`labels` must be a 1-D integer array, found shape {labels.shape} dtype {labels.dtype}.")
    if labels.size and int(labels.min()) < 0:
        raise ConfigError(f"`labels` must be >= 0, found {int(labels.min())}.")
    if labels.size and int(labels.max()) > np.iinfo(np.int64).max:  # uint64 beyond int64
        raise ConfigError(f"`labels` must fit in int64, found {int(labels.max())}.")
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)) \
            or not 1 <= num_clients <= labels.size:
        raise ConfigError(f"`num_clients` must be an int in [1, {labels.size}] (the number of examples), "
                          f"found {num_clients!r}.")
    if not isinstance(rng, np.random.Generator):
        raise ConfigError(f"`rng` must be a numpy Generator (numpy.random.default_rng(seed)), found {rng!r}.")
    return labels.astype(np.int64, copy=False)


def _empty(ids: np.ndarray | list[int]) -> str:
    """``client 2 holds no training examples`` / ``clients 1, 2 hold …``."""
    many = len(ids) > 1
    return f"client{'s' if many else ''} {_list([int(i) for i in ids])} hold{'' if many else 's'} no training examples"


def check_cover(name: str, indices: list[np.ndarray], n: int) -> None:
    """Refuse (ConfigError naming the partitioner) parts that are not a partition of ``range(n)``: an index outside
    it, an example given to two clients (or twice to one), or one given to none."""
    flat = np.concatenate(indices) if indices else np.zeros(0, dtype=np.int64)
    outside = flat[(flat < 0) | (flat >= n)]
    if outside.size:
        raise ConfigError(f"partitioner {name!r} gave index {int(outside[0])}, outside the {n} examples.")
    counts = np.bincount(flat, minlength=n)
    if (counts > 1).any():
        raise ConfigError(f"partitioner {name!r} gave example {int(np.argmax(counts > 1))} to "
                          f"{int(counts.max())} clients (or twice to one); a partition gives each example to one.")
    if (counts == 0).any():
        raise ConfigError(f"partitioner {name!r} gave {int((counts == 0).sum())} of the {n} examples to no client "
                          f"(first: {int(np.argmax(counts == 0))}); a partition gives every example to one.")


def _split_by_sizes(order: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    return np.split(order, np.cumsum(sizes)[:-1])


def _largest_remainder(weights: np.ndarray, total: int) -> np.ndarray:
    """Integers proportional to ``weights`` summing to ``total`` (Hamilton's method)."""
    quota = weights / weights.sum() * total
    counts = np.floor(quota).astype(np.int64)
    counts[np.argsort(-(quota - counts), kind="stable")[: total - int(counts.sum())]] += 1
    return counts


def _dirichlet(rng: np.random.Generator, alpha: float, m: int) -> np.ndarray:
    """One draw of Dir(α·1_m); a degenerate draw (tiny α underflowing to 0/0) becomes a random vertex."""
    p = rng.dirichlet(np.full(m, float(alpha)))
    if not np.all(np.isfinite(p)) or p.sum() <= 0:
        p = np.eye(m)[rng.integers(m)]
    return p


class AbstractPartitioner:
    """Base of the partitioners: ``__call__(labels, num_clients, rng, groups=None) -> Partition``.

    Attributes:
      needs_groups: ``True`` for partitioners that follow a data set's own per-example owners (``groups``).
      splits_by_class: ``True`` for partitioners that skew the clients' classes (on real-valued targets, which have
        none, they would be a random split).
    """

    name: ClassVar[str]
    needs_groups: ClassVar[bool] = False
    splits_by_class: ClassVar[bool] = False

    def __call__(self, labels: np.ndarray, num_clients: int, rng: np.random.Generator,
                 groups: np.ndarray | None = None) -> Partition:
        labels = _check_call(labels, num_clients, rng)
        parts = self._split(labels, int(num_clients), rng)
        return self._finish(labels, parts)

    def _empty_allowed_by(self) -> str:
        """The setting by which the user allowed clients without examples (``dirichlet``'s ``min_size = 0``), or
        ``""``: empty clients are refused."""
        return ""

    def _split(self, labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        raise NotImplementedError

    def _finish(self, labels: np.ndarray, parts: list[np.ndarray]) -> Partition:
        num_classes = int(labels.max()) + 1 if labels.size else 0
        indices = [np.sort(p).astype(np.int64) for p in parts]
        name = getattr(self, "name", type(self).__name__)
        check_cover(name, indices, labels.size)
        sizes = np.array([p.size for p in indices], dtype=np.int64)
        empty = np.flatnonzero(sizes == 0)
        if empty.size and not self._empty_allowed_by():
            raise ConfigError(f"partitioner {name!r}: {_empty(empty)} ({empty.size} of the {sizes.size} clients); "
                              f"every client must hold data: use fewer clients or another partition.")
        params: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore
        summary: dict[str, Any] = {
            "partitioner": self.name,
            "params": params,
            "num_clients": len(indices),
            "num_samples": int(labels.size),
            "num_classes": num_classes,
        }
        if len(indices) <= SUMMARY_MAX_CLIENTS:
            summary["sizes"] = sizes.tolist()
            if len(indices) * num_classes <= SUMMARY_MAX_CELLS:  # class ids as large as 10**12: no histograms
                owner = np.repeat(np.arange(len(indices)), sizes)
                flat = np.concatenate(indices) if indices else np.zeros(0, dtype=np.int64)
                hist = np.bincount(owner * num_classes + labels[flat], minlength=len(indices) * num_classes)
                summary["label_histograms"] = hist.reshape(len(indices), num_classes).tolist()
        else:  # a large population: quantiles instead of one list per client
            summary["size_quantiles"] = {str(q): float(np.quantile(sizes, q)) for q in (0, 0.25, 0.5, 0.75, 1)}
        if empty.size:  # allowed by the user's choice, said
            summary["notice"] = (f"NOTICE: partitioner {name!r}: {_empty(empty)} ({empty.size} of the {sizes.size} "
                                 f"clients, as {self._empty_allowed_by()} allows); they train on nothing.")
        return Partition(indices=indices, summary=summary)


@register("partitioner", "iid")
@dataclass(frozen=True)
class IID(AbstractPartitioner):
    """Uniformly random split into near-equal parts (sizes differ by at most 1)."""

    name: ClassVar[str] = "iid"

    def _split(self, labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        return np.array_split(rng.permutation(labels.size), num_clients)


@register("partitioner", "class_groups")
@dataclass(frozen=True)
class ClassGroups(AbstractPartitioner):
    """Two groups of clients with disjoint classes: clients ``0 … ⌈share·n⌉−1`` hold every example of ``classes``,
    the others every other example; i.i.d. within each group (near-equal sizes).

    With the ``exponential_groups`` speed model (whose slow clients are the same leading ids) this is QuAFL's
    Fig. 4 setting: the slow clients own a few classes that an algorithm favouring fast clients under-learns.

    Args:
      classes: the first group's classes.
      share: the first group's share of the clients, in (0, 1).
    """

    name: ClassVar[str] = "class_groups"
    splits_by_class: ClassVar[bool] = True
    classes: tuple[int, ...] = (0, 1, 2)
    share: float = 0.25

    def __post_init__(self) -> None:
        object.__setattr__(self, "classes", tuple(self.classes))
        if not self.classes or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0
                                       for c in self.classes):
            raise ConfigError(f"`classes` must be a non-empty list of class ids >= 0, found {list(self.classes)}.")
        if not (isinstance(self.share, (int, float)) and 0 < self.share < 1):
            raise ConfigError(f"`share` must be a number in (0, 1), found {self.share!r}.")

    def _split(self, labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        first = int(np.ceil(self.share * num_clients))
        if not 0 < first < num_clients:
            raise ConfigError(f"`share` = {self.share} leaves a group of {num_clients} clients empty.")
        in_first = np.isin(labels, self.classes)
        if not in_first.any() or in_first.all():
            raise ConfigError(f"`classes` {list(self.classes)} must hold some but not all of the examples.")
        a = np.array_split(rng.permutation(np.flatnonzero(in_first)), first)
        b = np.array_split(rng.permutation(np.flatnonzero(~in_first)), num_clients - first)
        empty = [i for i, p in enumerate(a + b) if p.size == 0]
        if empty:  # name the group short of examples
            n, m, what = ((int(in_first.sum()), first, f"`classes` {list(self.classes)}") if empty[0] < first
                          else (int((~in_first).sum()), num_clients - first, "the other classes"))
            raise ConfigError(f"class_groups: {_empty(empty)}: {m} clients share the {n} examples of {what}; use "
                              f"fewer clients or {'lower' if empty[0] < first else 'raise'} `share`.")
        return a + b


@register("partitioner", "dirichlet")
@dataclass(frozen=True)
class Dirichlet(AbstractPartitioner):
    """Label skew: each class is spread over the clients with Dirichlet(α) proportions.

    For each class k, draw ``p_k ~ Dir(α·1_M)`` over the M clients, shuffle class k's indices and cut them at
    ``floor(cumsum(p_k)·n_k)``. Redraw everything until every client holds at least ``min_size`` examples. Small α
    gives few classes per client; α → ∞ tends to IID.

    Args:
      alpha: concentration α > 0 (0.1 is strongly skewed, 1 moderately, 100 nearly IID).
      min_size: the least number of examples each client must get (>= 0).
      max_tries: redraws allowed before giving up.

    References:
      Hsu, Qi, Brown, "Measuring the effects of non-identical data distribution for federated visual
      classification", 2019, https://arxiv.org/abs/1909.06335
    """

    alpha: float
    min_size: int = 2
    max_tries: int = 1000
    name: ClassVar[str] = "dirichlet"
    splits_by_class: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not isinstance(self.alpha, (int, float)) or isinstance(self.alpha, bool) or not self.alpha > 0 \
                or not np.isfinite(self.alpha):
            raise ConfigError(f"`alpha` must be a finite number > 0, found {self.alpha!r}.")
        if isinstance(self.min_size, bool) or not isinstance(self.min_size, int) or self.min_size < 0:
            raise ConfigError(f"`min_size` must be an int >= 0, found {self.min_size!r}.")
        if isinstance(self.max_tries, bool) or not isinstance(self.max_tries, int) or self.max_tries < 1:
            raise ConfigError(f"`max_tries` must be an int >= 1, found {self.max_tries!r}.")

    def _split(self, labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        if self.min_size * num_clients > labels.size:
            raise ConfigError(f"`min_size`={self.min_size} × {num_clients} clients exceeds the {labels.size} "
                              f"examples; lower `min_size` or use fewer clients.")
        by_class = [np.flatnonzero(labels == k) for k in np.unique(labels)]
        smallest = 0
        for _ in range(self.max_tries):
            parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
            for idx in by_class:
                p = _dirichlet(rng, self.alpha, num_clients)
                cuts = np.floor(np.cumsum(p)[:-1] * idx.size).astype(np.int64)
                for client, piece in enumerate(np.split(rng.permutation(idx), cuts)):
                    parts[client].append(piece)
            merged = [np.concatenate(pieces) for pieces in parts]
            smallest = min(m.size for m in merged)
            if smallest >= self.min_size:
                return merged
        raise ConfigError(
            f"dirichlet partition: after `max_tries`={self.max_tries} draws some client still had {smallest} < "
            f"`min_size`={self.min_size} examples ({labels.size} examples, {num_clients} clients, "
            f"`alpha`={self.alpha}); raise `alpha`, lower `min_size` or use fewer clients."
        )

    def _empty_allowed_by(self) -> str:
        return "`min_size` = 0" if self.min_size == 0 else ""


@register("partitioner", "shards")
@dataclass(frozen=True)
class Shards(AbstractPartitioner):
    """Pathological label skew (McMahan et al.): sort by label, cut into shards, deal each client k shards.

    The indices are shuffled, sorted by label (stable), and cut into ``S = num_clients·labels_per_client`` shards;
    a random permutation of the shards deals ``labels_per_client`` to each client. Nothing is dropped: shard sizes
    differ by at most one within a class.

    With ``class_aligned=True`` (default) no shard crosses a class boundary: class c gets a share of the S shards
    proportional to its size (Hamilton's method, at least one each), so a client holds at most
    ``labels_per_client`` labels ("max k labels"). This needs S >= the number of classes present. With
    ``class_aligned=False`` the sorted indices are cut into S near-equal contiguous shards exactly as in McMahan et
    al.; a shard may then straddle two classes and a client may hold up to ``2·labels_per_client`` labels
    (``labels_per_client=1`` is CafCor's "extreme" split: sorted by label and split evenly).

    Args:
      labels_per_client: shards per client (k >= 1).
      class_aligned: keep every shard inside one class.

    References:
      McMahan et al., "Communication-efficient learning of deep networks from decentralized data", AISTATS 2017,
      https://arxiv.org/abs/1602.05629
    """

    labels_per_client: int
    class_aligned: bool = True
    name: ClassVar[str] = "shards"
    splits_by_class: ClassVar[bool] = True

    def __post_init__(self) -> None:
        k = self.labels_per_client
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"`labels_per_client` must be an int >= 1, found {k!r}.")
        if not isinstance(self.class_aligned, bool):
            raise ConfigError(f"`class_aligned` must be a bool, found {self.class_aligned!r}.")

    def _split(self, labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        num_shards = num_clients * self.labels_per_client
        if num_shards > labels.size:
            raise ConfigError(f"shards: {num_clients} clients × `labels_per_client`={self.labels_per_client} = "
                              f"{num_shards} shards exceed the {labels.size} examples.")
        perm = rng.permutation(labels.size)
        ordered = perm[np.argsort(labels[perm], kind="stable")]
        if self.class_aligned:
            _, counts = np.unique(labels, return_counts=True)
            if num_shards < counts.size:
                raise ConfigError(
                    f"shards: {num_shards} shards ({num_clients} clients × `labels_per_client`="
                    f"{self.labels_per_client}) cannot cover {counts.size} classes without crossing a class; "
                    f"raise `labels_per_client` or set `class_aligned` = false.")
            per_class = _class_shard_counts(counts, num_shards)
            shards = [s for block, m in zip(np.split(ordered, np.cumsum(counts)[:-1]), per_class)
                      for s in np.array_split(block, m)]
        else:
            shards = np.array_split(ordered, num_shards)
        deal = rng.permutation(num_shards).reshape(num_clients, self.labels_per_client)
        return [np.concatenate([shards[s] for s in row]) for row in deal]


def _class_shard_counts(counts: np.ndarray, num_shards: int) -> np.ndarray:
    """Shards per class: proportional to class size, at least 1, at most the class size, summing to S."""
    alloc = np.maximum(_largest_remainder(counts.astype(np.float64), num_shards), 1)
    alloc = np.minimum(alloc, counts)
    while alloc.sum() > num_shards:  # the floor of 1 over-allocated: take from the most over-served class
        excess = np.where(alloc > 1, alloc - counts * num_shards / counts.sum(), -np.inf)
        alloc[int(np.argmax(excess))] -= 1
    while alloc.sum() < num_shards:  # the cap at class size under-allocated: give to the roomiest class
        room = np.where(alloc < counts, counts / alloc, -np.inf)
        alloc[int(np.argmax(room))] += 1
    return alloc


@register("partitioner", "quantity_skew")
@dataclass(frozen=True)
class QuantitySkew(AbstractPartitioner):
    """Quantity skew: client sizes follow Dirichlet(α) proportions, the data itself is IID.

    Draw ``q ~ Dir(α·1_M)``; client i gets ``1 + n_i`` examples where the ``n_i`` split the other ``N − M``
    examples in proportion to q (Hamilton's method), so every client has at least one. The examples are a uniformly
    random permutation cut at those sizes.

    Args:
      alpha: concentration α > 0; small α gives very unequal sizes.
    """

    alpha: float
    name: ClassVar[str] = "quantity_skew"

    def __post_init__(self) -> None:
        if not isinstance(self.alpha, (int, float)) or isinstance(self.alpha, bool) or not self.alpha > 0 \
                or not np.isfinite(self.alpha):
            raise ConfigError(f"`alpha` must be a finite number > 0, found {self.alpha!r}.")

    def _split(self, labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        q = _dirichlet(rng, self.alpha, num_clients)
        sizes = 1 + _largest_remainder(q, labels.size - num_clients)
        return _split_by_sizes(rng.permutation(labels.size), sizes)


@register("partitioner", "natural")
@dataclass(frozen=True)
class Natural(AbstractPartitioner):
    """The data set's own split: client ``g`` holds the examples whose group is ``g`` (e.g. FedProx's synthetic
    devices, or the sorted distinct values of a file's ``client_id`` column). ``data.num_clients`` must equal the
    number of groups (with ``attack.byzantine_hold_data = false``: the groups plus ``attack.num_byzantine``); it is
    never chosen for you, so a config states how many clients it runs."""

    name: ClassVar[str] = "natural"
    needs_groups: ClassVar[bool] = True

    def __call__(self, labels: np.ndarray, num_clients: int, rng: np.random.Generator,
                 groups: np.ndarray | None = None) -> Partition:
        if groups is None:
            raise ConfigError("partitioner 'natural' needs a data set with per-example groups, saying which client "
                              "owns each example (a csv or parquet file with a `client_id` column, an npz file "
                              "with a `client_id` array, or fedprox_synthetic); this data set has none.")
        groups, count = _check_groups(groups, np.shape(labels))
        if num_clients != count:
            raise ConfigError(f"partitioner 'natural' gives each of the data set's {count} clients (distinct "
                              f"client ids) its own examples, so {count} clients must hold data, found "
                              f"{num_clients}: set `data.num_clients` = {count} (with "
                              f"`attack.byzantine_hold_data` = false: {count} + `attack.num_byzantine`).")
        labels = _check_call(labels, num_clients, rng)
        order = np.argsort(groups, kind="stable")
        return self._finish(labels, np.split(order, np.cumsum(np.bincount(groups, minlength=count))[:-1]))


def _check_groups(groups: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray, int]:
    """``natural``'s ``groups`` as int64 client indices 0..G−1 (each one used) and G; ConfigError otherwise."""
    groups = np.asarray(groups)
    if groups.ndim != 1 or not np.issubdtype(groups.dtype, np.integer):
        raise ConfigError(f"partitioner 'natural': `groups` must be a 1-D integer array (the client index of every "
                          f"example), found shape {groups.shape} dtype {groups.dtype}.")
    if groups.shape != shape:
        raise ConfigError(f"partitioner 'natural': {groups.shape[0]} group ids for {shape[0] if shape else 0} "
                          f"examples.")
    if groups.size and int(groups.min()) < 0:
        raise ConfigError(f"partitioner 'natural': `groups` must be client indices >= 0, found "
                          f"{int(groups.min())} (example {int(np.argmin(groups))}).")
    ids = np.unique(groups)
    count = int(ids[-1]) + 1 if ids.size else 0
    if ids.size < count:  # a gap: the client of an unused id would hold no example
        first = int(np.argmax(ids != np.arange(ids.size)))
        raise ConfigError(f"partitioner 'natural': no example has group {first} ({count - ids.size} of the ids "
                          f"0..{count - 1} unused), so client {first} would hold none; `groups` must number the "
                          f"clients 0..G-1, each with examples.")
    return groups.astype(np.int64), count


@register("partitioner", "classes_per_client")
@dataclass(frozen=True)
class ClassesPerClient(AbstractPartitioner):
    """Label skew with exactly k classes per client: client i holds classes {(i·k + c) mod C : c < k}.

    Contiguous classes, as the FedSC authors' code deals them (e.g. 5 clients × 2 classes: {0,1}, {2,3}, …;
    10 × 1: one digit each). With ``shuffle_classes`` the class order is a seeded permutation first. Every class must
    be held by some client (``num_clients·k >= C``); each class's examples are split near-equally and at random among
    the clients that hold it, so nothing is dropped.

    Args:
      classes_per_client: k, between 1 and the number of classes.
      shuffle_classes: deal a random permutation of the classes instead of 0..C−1.
    """

    classes_per_client: int = 1
    shuffle_classes: bool = False
    name: ClassVar[str] = "classes_per_client"
    splits_by_class: ClassVar[bool] = True

    def __post_init__(self) -> None:
        k = self.classes_per_client
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"`classes_per_client` must be an int >= 1, found {k!r}.")
        if not isinstance(self.shuffle_classes, bool):
            raise ConfigError(f"`shuffle_classes` must be a bool, found {self.shuffle_classes!r}.")

    def _split(self, labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        classes = np.unique(labels)
        c, k = classes.size, self.classes_per_client
        if k > c:
            raise ConfigError(f"`classes_per_client` = {k} exceeds the {c} classes of the data set.")
        if num_clients * k < c:
            raise ConfigError(f"classes_per_client: {num_clients} clients × {k} classes cannot hold all {c} classes "
                              f"(need num_clients·classes_per_client >= {c}).")
        order = rng.permutation(classes) if self.shuffle_classes else classes
        holders: dict[int, list[int]] = {int(cl): [] for cl in classes}
        for i in range(num_clients):
            for j in range(k):
                holders[int(order[(i * k + j) % c])].append(i)
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for cl in classes:
            owners = holders[int(cl)]
            for owner, chunk in zip(owners, np.array_split(rng.permutation(np.flatnonzero(labels == cl)), len(owners))):
                parts[owner].append(chunk)
        merged = [np.concatenate(p) if p else np.zeros(0, dtype=np.int64) for p in parts]
        empty = [i for i, m in enumerate(merged) if m.size == 0]
        if empty:  # name the classes short of examples
            short = sorted({int(order[(i * k + j) % c]) for i in empty for j in range(k)})
            counts = [f"class {cl} has {int((labels == cl).sum())} for {len(holders[cl])} clients" for cl in short]
            raise ConfigError(f"classes_per_client: {_empty(empty)} ({_list(counts, 3)}); use fewer clients.")
        return merged
