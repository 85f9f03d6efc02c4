"""The pre-training exchange of client statistics (:mod:`trustfl.client.statistics`) in a synchronous round.

After the downlink and before local training: each statistic names its uploaders; the engine gathers their data
(padded, masked), lets the statistic compute one value per uploader at the received model, screens the uploads
(finite, right shape), charges each released upload's DP event to the client's ledger (an upload that would
overspend is not made: the client keeps its last stored value on the server), folds the accepted uploads into the
statistic's server state and hands each cohort client what the server half sends it alone
(``CohortContext.personal``). Bytes are counted from what is sent.
"""
from __future__ import annotations

from typing import Any

import torch

from trustfl.core.rng import make_generator
from trustfl.engine.federation import EngineState, Federation
from trustfl.engine.local import ClientPlan
from trustfl.errors import ConfigError


def padded_rows(fed: Federation, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The clients' training rows padded to the longest ``(m, N)`` (pads point at the client's first row, or 0) and
    the mask of real rows, on the data's device."""
    sizes = [int(fed.client_rows[c].numel()) for c in ids]
    longest = max(sizes, default=0) or 1
    rows = torch.zeros((len(ids), longest), dtype=torch.long)
    for i, c in enumerate(ids):
        if sizes[i]:
            rows[i, :sizes[i]] = fed.client_rows[c]
            rows[i, sizes[i]:] = fed.client_rows[c][0]
    mask = torch.arange(longest).unsqueeze(0) < torch.tensor(sizes).unsqueeze(1)
    device = next(iter(fed.train_data.tensors.values())).device
    return rows.to(device), mask.to(device)


def exchange(fed: Federation, state: EngineState, r: int, plans: list[ClientPlan],
             received: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, Any], int, int,
                                                          dict[str, Any]]:
    """Run every statistic's exchange of round ``r``.

    Returns:
      ``(personal, statistics state, bytes up, bytes down, metrics)``; ``personal`` stacked in ``plans`` order.
    """
    if not fed.statistics:
        return {}, state.statistics, 0, 0, {}
    cohort = [p.client_id for p in plans]
    params = fed.layout.unflatten(received["model"])
    x_all = fed.train_data.tensors["x"]

    @torch.no_grad()
    def represent(x: torch.Tensor) -> torch.Tensor:
        return fed.objective.forward(fed.model, params, {"x": x})

    personal: dict[str, torch.Tensor] = {}
    states = dict(state.statistics)
    up = down = 0
    metrics: dict[str, Any] = {}
    for name, stat in fed.statistics:
        st = states[name] if name in states else stat.server_init(fed.client_rows.sizes())
        ids = stat.uploaders(r, cohort, st, fed.num_clients)
        events = {c: stat.release(c) for c in ids}
        if fed.ledger is not None:
            over = {c for c in ids if events[c] is not None and c in fed.ledger
                    and fed.ledger[c].would_exceed(events[c])}
            ids = [c for c in ids if c not in over]
            metrics[f"{name}/out_of_budget"] = len(over)
        if ids:
            rows, mask = padded_rows(fed, ids)
            values = stat.compute(represent, x_all[rows], mask, ids,
                                  lambda c, stream: make_generator(fed.seed, r, c, f"{name}/{stream}",
                                                                   device=x_all.device), fed.augment)
            flat = values.reshape(len(ids), -1)
            ok = stat.admissible(ids, values).tolist()
            charged = [(c, events[c]) for c in ids if events[c] is not None]
            if fed.ledger is not None and charged:  # released (sent), so charged, accepted or not
                fed.ledger.charge([(c, e) for c, e in charged if c in fed.ledger])
            keep = [i for i, good in enumerate(ok) if good]
            up += len(keep) * flat.shape[1] * flat.element_size()
            metrics[f"{name}/uploads"] = len(keep)
            metrics[f"{name}/rejected"] = len(ids) - len(keep)
            if keep:
                st = stat.server_update(st, [ids[i] for i in keep], values[keep])
        else:
            metrics[f"{name}/uploads"] = 0
        states[name] = st
        sent = stat.personal(st, r, cohort)
        clash = set(sent) & set(personal)
        if clash:
            raise ConfigError(f"`client.statistics`: two statistics send {sorted(clash)[0]!r} to the clients.")
        down += sum(int(v.numel()) * v.element_size() for v in sent.values())
        personal.update(sent)
    return personal, states, up, down, metrics
