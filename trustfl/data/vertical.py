"""Feature-wise (vertical) splits: which columns of a flattened example each of M parties holds.

In vertical FL every party holds the same samples (IDs aligned) but a different block of features. A split is a
list of M disjoint, sorted column-index arrays covering ``0..num_features−1``.

For images flattened row-major, contiguous blocks are bands of rows: MNIST's 784 = 28×28 features over 7 parties
give 4 rows each (DPZV's split), and digits' 64 features over 4 parties give 2 rows each. ``unit`` keeps blocks on
row boundaries when the rows do not divide evenly.

Example:
  >>> [b.tolist() for b in split_features(5, 2)]
  [[0, 1, 2], [3, 4]]
  >>> [b.size for b in split_features(28 * 28, 3, unit=28)]
  [280, 252, 252]
"""
from __future__ import annotations

import numpy as np

from trustfl.data.own_targets import _list
from trustfl.errors import ConfigError


def split_features(num_features: int, num_parties: int, rng: np.random.Generator | None = None, *,
                   shuffle: bool = False, unit: int = 1) -> list[np.ndarray]:
    """Split ``num_features`` columns among ``num_parties`` parties.

    The features are grouped into ``U = num_features / unit`` consecutive units (e.g. image rows); party m gets
    ``⌊U/M⌋`` or ``⌈U/M⌉`` units (the first ``U mod M`` parties get one more), contiguous unless ``shuffle``.

    Args:
      num_features: d, the number of features of a flattened example (>= 1).
      num_parties: M, between 1 and the number of units.
      rng: required when ``shuffle`` is true; draws which units each party gets.
      shuffle: give each party a random set of units (blocks of equal sizes as without shuffling) instead of a
        contiguous band.
      unit: the indivisible group of consecutive features (1 = single columns, 28 = MNIST rows); must divide
        ``num_features``.

    Returns:
      ``num_parties`` sorted int64 arrays that partition ``range(num_features)``.

    Raises:
      ConfigError: a value out of range, ``unit`` not dividing ``num_features``, or ``shuffle`` without ``rng``.
    """
    for name, value in (("num_features", num_features), ("num_parties", num_parties), ("unit", unit)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ConfigError(f"`{name}` must be an int >= 1, found {value!r}.")
    if num_features % unit:
        raise ConfigError(f"`unit`={unit} must divide `num_features`={num_features}.")
    units = num_features // unit
    if num_parties > units:
        raise ConfigError(f"`num_parties` must be <= {units} (the number of {unit}-feature units), "
                          f"found {num_parties}.")
    if shuffle and rng is None:
        raise ConfigError("`shuffle`=True needs `rng` (a numpy Generator); randomness is always explicit.")
    order = rng.permutation(units) if shuffle else np.arange(units)
    blocks = np.array_split(order, num_parties)
    columns = np.arange(num_features, dtype=np.int64).reshape(units, unit)
    return [np.sort(columns[b].reshape(-1)) for b in blocks]


def check_columns(columns: object, num_features: int, num_parties: int) -> list[np.ndarray]:
    """Validate explicit per-party column sets: ``num_parties`` non-empty lists of distinct integers in
    ``[0, num_features)``, no column held by two parties. Columns held by nobody are allowed and unused (no party
    trains on them); :func:`unused_columns_notice` says which.

    Raises:
      ConfigError: naming the party and the offending column.
    """
    if not isinstance(columns, (list, tuple)) or len(columns) != num_parties:
        found = len(columns) if isinstance(columns, (list, tuple)) else type(columns).__name__
        raise ConfigError(f"`columns` must hold one list of column indices per party ({num_parties}), found "
                          f"{found}.")
    owner: dict[int, int] = {}
    out = []
    for m, cols in enumerate(columns):
        if not isinstance(cols, (list, tuple)) or not cols:
            raise ConfigError(f"`columns[{m}]`: party {m} must hold at least one column (a non-empty list), "
                              f"found {cols!r}.")
        for c in cols:
            if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or not 0 <= c < num_features:
                raise ConfigError(f"`columns[{m}]`: column {c!r} is not an integer in [0, {num_features}).")
            if int(c) in owner:
                who = "twice" if owner[int(c)] == m else f"by parties {owner[int(c)]} and {m}"
                raise ConfigError(f"`columns[{m}]`: column {c} is held {who}; the parties' columns must be "
                                  f"disjoint.")
            owner[int(c)] = m
        out.append(np.sort(np.asarray(cols, dtype=np.int64)))
    return out


def unused_columns_notice(blocks: list[np.ndarray], num_features: int) -> str | None:
    """The one-line notice naming the columns that no party holds (explicit ``columns`` may leave some out), or
    ``None`` when the parties hold every column."""
    held = np.zeros(num_features, dtype=bool)
    if blocks:
        held[np.concatenate(blocks)] = True
    unused = np.flatnonzero(~held)
    if not unused.size:
        return None
    return (f"NOTICE: `data.features` leaves column{'s' if unused.size > 1 else ''} {_list(unused.tolist())} of the "
            f"{num_features} features to no party ({unused.size} unused); no party trains on them.")
