"""Which party the server updates at each iteration: the activation order of asynchronous vertical FL.

DPZV activates one "ready-to-update" party per server iteration (Alg. 1; the paper leaves the schedule open).
Three schedules, each drawn for the whole run from the seed before training (so the number of releases every
party makes is known when its privacy noise is calibrated, and a resumed run continues the same order):

- ``shuffled``: each round is a random permutation of every party repeated ``iterations/M`` times (the
  VFL-CZOFO code's order: every party equally often per round).
- ``uniform``: an independent uniform party per iteration.
- ``clock``: a virtual clock. Party ``m``'s k-th computation takes a duration drawn from the asynchronous
  engine's speed models (``engine.speed``); the server takes the parties in the order they finish (ties: lower
  id first). With equal deterministic durations this is round robin.
"""
from __future__ import annotations

import torch

from trustfl.core.checks import check_number, describe_value
from trustfl.core.rng import make_generator
from trustfl.errors import ConfigError
from trustfl.simtime.speed import AbstractSpeedModel

ACTIVATIONS = ("shuffled", "uniform", "clock")


def activation_order(kind: str, num_parties: int, rounds: int, per_round: int, seed: int,
                     speed: AbstractSpeedModel | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(parties, times)``: the party of each of the ``rounds·per_round`` iterations (int64), and for ``clock``
    the simulated time each finishes (float64; ``None`` otherwise).

    Raises:
      ConfigError: an unknown ``kind``, ``num_parties`` < 1, ``rounds`` or ``per_round`` < 0 (naming the argument).
    """
    check_number("num_parties", num_parties, integer=True, low=1)
    check_number("rounds", rounds, integer=True, low=0)
    check_number("per_round", per_round, integer=True, low=0)
    total = rounds * per_round
    if kind == "shuffled":
        reps = -(-per_round // num_parties)
        base = torch.arange(num_parties).repeat(reps)
        order = [base[torch.randperm(base.numel(), generator=make_generator(seed, r, "activation"))][:per_round]
                 for r in range(rounds)]
        return (torch.cat(order) if order else torch.zeros(0, dtype=torch.long)), None
    if kind == "uniform":
        gen = make_generator(seed, "activation")
        return torch.randint(num_parties, (total,), generator=gen), None
    if kind == "clock":
        if speed is None:
            raise ConfigError("`engine.activation` = \"clock\" needs `engine.speed`.")
        ids = torch.arange(num_parties)
        durations = speed.durations(ids, torch.full((num_parties,), -1, dtype=torch.long), seed, total)
        finish = durations.cumsum(dim=1)  # (M, T): party m's k-th computation ends at finish[m, k]
        times = finish.flatten()
        parties = ids.repeat_interleave(total)
        # ``parties`` is grouped by id in increasing order, so a stable sort by time breaks ties by the lower id
        # (equal durations give round robin)
        order = torch.sort(times, stable=True).indices[:total]
        return parties[order], times[order]
    raise ConfigError(f"`engine.activation` must be one of {', '.join(map(repr, ACTIVATIONS))}, found {kind!r}.")


def releases_per_party(parties: torch.Tensor, num_parties: int) -> torch.Tensor:
    """How many iterations activate each party: ``(num_parties,)`` int64.

    Raises:
      ConfigError: ``num_parties`` < 1, or ``parties`` not a 1-D integer tensor of ids in ``[0, num_parties)``.
    """
    check_number("num_parties", num_parties, integer=True, low=1)
    if not isinstance(parties, torch.Tensor) or parties.dim() != 1 or parties.is_floating_point() \
            or parties.is_complex() or parties.dtype == torch.bool:
        raise ConfigError(f"`parties` must be a 1-D integer tensor of party ids, found {describe_value(parties)}.")
    if parties.numel() and (int(parties.min()) < 0 or int(parties.max()) >= num_parties):
        raise ConfigError(f"`parties` must hold party ids in [0, {num_parties}) (`num_parties` = {num_parties}), "
                          f"found values in [{int(parties.min())}, {int(parties.max())}].")
    return torch.bincount(parties, minlength=num_parties)
