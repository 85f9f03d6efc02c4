"""Sample-level DP set-up: per-client budgets → per-client noise multipliers, ledgers, and the pre-flight check.

Each client calibrates its own noise multiplier once, up front, for the worst case that it takes part in every
round (``rounds × local steps``), with its own sampling rate ``b_i / N_i``. A schedule that would spend more than
a client's budget is refused before training, naming the client, its budget and the planned spend.
"""
from __future__ import annotations

import math
from typing import Any

from trustfl.config.inert import check_budget_has_a_use
from trustfl.config.schema import ExperimentConfig
from trustfl.engine.local import ClientPlan, LocalTraining, num_local_steps, replace_one, step_event, step_sensitivity
from trustfl.errors import ConfigError, PrivacyError
from trustfl.privacy.accountant import Budget, LedgerBook, check_schedule
from trustfl.privacy.events import composed, describe, self_composed
from trustfl.privacy.budgets import calibrate_clients, client_epsilons, round_up

import torch


def setup_privacy(cfg: ExperimentConfig, training: LocalTraining, sizes: list[int], batch_sizes: list[int],
                  byzantine: frozenset[int], info: dict[str, Any],
                  round_events: list[Any], for_client: int | None = None, checked_noise: float | None = None
                  ) -> tuple[list[float], LedgerBook | None]:
    """Noise multipliers per client and the ledger book.

    ``round_events`` are the events the client and server stages charge every participating client per round
    (local noise, central noise, SecLDP steps). Without sample-level DP and without such events there is no
    ledger; otherwise every honest client gets one, with the budget of ``client.dp`` (unlimited if none).

    ``for_client``: a deployed node's build. Only that client's noise multiplier is calibrated and only its
    schedule checked (the server's build does every client's); every other calibrated multiplier is NaN.
    ``checked_noise``: that client's multiplier as its node calibrated and checked it at an earlier message of the
    run (it keeps it in its state): used as it is, neither calibrated nor checked again.
    """
    n = len(sizes)
    dp = cfg.client.dp
    eps = client_epsilons(cfg.client.dp, n, cfg.seed)
    honest = [i for i in range(n) if i not in byzantine and (sizes[i] > 0 or dp.mode == "off")]
    mine = honest if for_client is None else [i for i in honest if i == for_client]  # calibrated and checked here
    if checked_noise is not None and for_client is None:
        raise ValueError("checked_noise is a deployed node's (for_client)")
    known = {} if checked_noise is None else {i: float(checked_noise) for i in mine}
    mine = [i for i in mine if i not in known]
    if dp.mode == "off":
        check_budget_has_a_use(cfg, round_events)
        if not round_events:
            return [0.0] * n, None
        budgets = {i: Budget(eps[i] if eps is not None else math.inf, dp.delta) for i in honest}
        per_round = round_events[0] if len(round_events) == 1 else composed(round_events)
        for i in mine:
            if not budgets[i].unlimited:
                check_schedule(i, budgets[i], per_round, cfg.rounds, dp.accountant)
        info["privacy"] = {"mode": "stages", "delta": dp.delta, "accountant": dp.accountant,
                           "epsilon_budget": None if eps is None else eps,
                           "round_events": [describe(e) for e in round_events]}
        return [0.0] * n, LedgerBook(budgets, dp.accountant)
    sampled = [i for i in mine if batch_sizes[i] < sizes[i]]
    if dp.accountant == "pld" and replace_one(training) and sampled and (eps is not None or dp.noise_multiplier > 0):
        raise ConfigError(f"`client.dp.accountant` = \"pld\" cannot analyse DP-SGD on batches drawn without "
                          f"replacement (`client.batch_sampler` = {cfg.client.batch_sampler!r}, client {sampled[0]}: "
                          f"{batch_sizes[sampled[0]]} of {sizes[sampled[0]]} examples; dp_accounting analyses it "
                          f"only with RDP); use accountant \"rdp\", or batch_sampler \"poisson\".")
    steps = [cfg.rounds * num_local_steps(training, sizes[i], batch_sizes[i]) for i in range(n)]
    sampling = "poisson" if training.sampler.accounting == "poisson" else "without_replacement"
    if eps is None or dp.noise_multiplier > 0:
        noise = [dp.noise_multiplier] * n
    elif known:
        noise = [known.get(i, math.nan if i in honest else 0.0) for i in range(n)]
    else:
        rates = [1.0 if dp.mode == "batch_clip" else min(1.0, batch_sizes[i] / max(sizes[i], 1)) for i in range(n)]
        z_mine = calibrate_clients([eps[i] for i in mine], dp.delta, [rates[i] for i in mine],
                                   [steps[i] for i in mine],
                                   accountant="rhdp" if dp.calibration == "rhdp" else dp.accountant,
                                   sampling="poisson" if dp.mode == "batch_clip" or dp.calibration == "rhdp"
                                   else sampling, round_decimals=None)
        others = set(honest).difference(mine)  # honest clients of other nodes: not calibrated here
        noise = [math.nan if i in others else 0.0 for i in range(n)]
        # The calibrated z is σ over the sensitivity the steps are charged at: 2C under replace-one and for a
        # clipped batch mean (step_event), so the noise std σ = z·2C is a multiplier of 2z on the clip norm C.
        scale = step_sensitivity(training)
        for i, z in zip(mine, z_mine):
            # Rounding (Robust-HDP's code keeps 2 decimals) goes up, so a client never spends past its budget.
            z = scale * z
            noise[i] = round_up(z, dp.round_noise_to) if dp.round_noise_to >= 0 else z
    # dp_accounting analyses sampling without replacement only under replace-one adjacency.
    neighboring = "replace_one" if replace_one(training) else "add_remove"
    budgets = {i: Budget(eps[i] if eps is not None else math.inf, dp.delta) for i in honest}
    for i in mine:
        if noise[i] <= 0 and not budgets[i].unlimited:
            raise ConfigError(f"`client.dp.noise_multiplier` is 0 for client {i} with a finite budget: no privacy.")
        plan = ClientPlan(i, torch.arange(sizes[i]), batch_sizes[i], noise[i])
        event = step_event(training, plan)
        if event is not None and not budgets[i].unlimited:
            if round_events:  # local steps and the stages' events, every round
                per_round = composed([self_composed(event, num_local_steps(training, sizes[i], batch_sizes[i])),
                                      *round_events])
                check_schedule(i, budgets[i], per_round, cfg.rounds, dp.accountant, neighboring)
            else:
                check_schedule(i, budgets[i], event, steps[i], dp.accountant, neighboring)
    info["privacy"] = {"mode": dp.mode, "delta": dp.delta, "accountant": dp.accountant, "clip": dp.clip,
                       "epsilon_budget": None if eps is None else [eps[i] for i in range(n)],
                       "noise_multiplier": noise, "planned_steps": steps, "neighboring": neighboring}
    return noise, LedgerBook(budgets, dp.accountant, neighboring)
