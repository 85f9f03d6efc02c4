"""What the privacy stages charge must hold for the rows they noise: refused before training otherwise.

A noise stage charges every client ``GaussianDpEvent(σ/Δ)`` for the sensitivity ``Δ`` it is given; nothing in the
stage makes its input that sensitive. The run must, so each stage's precondition is checked on the built chains:

* ``gaussian_noise`` with a ``sensitivity`` (local DP): an earlier ``clip_l2`` stage with ``max_norm <= sensitivity``
  bounds the rows, and only noise stages lie between them (momentum there would noise a sum of rounds).
* ``central_gaussian_noise`` (DP-FedAvg): the message every client sends is clipped that way (the client chain
  ends in ``clip_l2`` with ``max_norm <= clip_norm``, noise stages aside), arrives as it was clipped
  (``compress.uplink`` none or identity; not the async engine's polling, whose message adds the client's own earlier,
  un-noised model), nothing else of the client's reaches the server (``client.transforms`` extras), and the server
  takes their unweighted mean (``aggregator`` mean, no ``pre_aggregators``, ``server.weighting`` uniform), with only
  noise stages before it.
* ``secldp_accounting`` charges the step ε that algorithm ``cafcor`` calibrated for its correlated noise; in another
  run it would charge privacy for noise nobody adds.

Without these the ledgers and ``summary.json`` would report an ε the run does not have (a run without a clip stage
has none at all). Each refusal is a ConfigError naming the stage's key.
"""
from __future__ import annotations

from typing import Any

from trustfl.config.schema import ExperimentConfig
from trustfl.core.stage import Chain
from trustfl.errors import ConfigError
from trustfl.privacy.clip import ClipL2
from trustfl.privacy.noise import CentralGaussianNoise, GaussianNoise
from trustfl.privacy.secldp_events import SecLdpAccounting

__all__ = ["check_privacy_stages"]

_LOSSLESS_UPLINKS = ("none", "identity")


def _clip_before(stages: list[Any], end: int) -> tuple[ClipL2 | None, Any]:
    """The ``clip_l2`` stage that last bounds the rows entering ``stages[end]`` (noise stages passed over), and
    the stage found instead (``None``: the chain's start)."""
    for stage in reversed(stages[:end]):
        if isinstance(stage, ClipL2):
            return stage, stage
        if not stage.privacy_noise:
            return None, stage
    return None, None


def _found(stage: Any) -> str:
    return "nothing before it" if stage is None else f"{type(stage).__name__} before it"


def _check_local(stages: list[Any], i: int, noise: GaussianNoise) -> None:
    clip, found = _clip_before(stages, i)
    delta = float(noise.sensitivity)  # type: ignore[arg-type]
    if clip is None or float(clip.max_norm) > delta:
        what = (f"clip_l2 with max_norm = {float(clip.max_norm):g}" if clip is not None else _found(found))
        raise ConfigError(f"`client_stages[{i}]` (gaussian_noise) charges each client for sensitivity = {delta:g}, "
                          f"but its rows are not clipped to that norm ({what}); put a clip_l2 stage with max_norm <= "
                          f"{delta:g} right before it (only noise stages may lie between them).")


def _check_central(cfg: ExperimentConfig, client: list[Any], server: list[Any], j: int, noise: CentralGaussianNoise,
                   extras: bool) -> None:
    key, c = f"`server_stages[{j}]` (central_gaussian_noise)", float(noise.clip_norm)
    before = next((s for s in server[:j] if not s.privacy_noise), None)
    clip, found = _clip_before(client, len(client))
    problems = []
    if clip is None or float(clip.max_norm) > c:
        problems.append(f"the client chain does not end in clip_l2 with max_norm <= {c:g} "
                        f"({'clip_l2 with max_norm = %g' % float(clip.max_norm) if clip else _found(found)})")
    if before is not None:
        problems.append(f"server stage {type(before).__name__} runs before it")
    if cfg.aggregator.name != "mean" or cfg.pre_aggregators:
        problems.append(f"`aggregator` is {cfg.aggregator.name!r}"
                        + (" with `pre_aggregators`" if cfg.pre_aggregators else "") + ", not the plain mean")
    if cfg.server.weighting != "uniform":
        problems.append(f"`server.weighting` is {cfg.server.weighting!r}, not \"uniform\"")
    if cfg.compress.uplink.name not in _LOSSLESS_UPLINKS:
        problems.append(f"`compress.uplink` {cfg.compress.uplink.name!r} changes the clipped messages")
    if cfg.engine.kind == "async" and cfg.engine.schedule.name == "polling":
        problems.append("the async engine's polling schedule sends each client's own earlier, un-noised model "
                        "with its progress")
    if extras:
        problems.append("`client.transforms` send values beside the message that it does not noise")
    if problems:
        raise ConfigError(f"{key} charges each client for sum sensitivity clip_norm = {c:g}, which holds only for "
                          f"the unweighted mean of messages clipped to it: {'; '.join(problems)}.")


def check_privacy_stages(cfg: ExperimentConfig, client_stages: Chain, server_stages: Chain, extras: bool) -> None:
    """Refuse (ConfigError naming the stage's key) a privacy stage whose charged sensitivity the run does not
    guarantee (see the module docstring). ``extras``: the local chain sends values beside the message."""
    client = [s for _, s in client_stages.stages]
    server = [s for _, s in server_stages.stages]
    for i, stage in enumerate(client):
        if isinstance(stage, GaussianNoise) and stage.sensitivity is not None:
            _check_local(client, i, stage)
        if isinstance(stage, SecLdpAccounting) and cfg.algorithm != "cafcor":
            raise ConfigError(f"`client_stages[{i}]` (secldp_accounting) charges the step ε that algorithm \"cafcor\" "
                              f"calibrates for its correlated noise, and adds no noise itself; with algorithm "
                              f"{cfg.algorithm!r} it would report privacy nobody provides: run algorithm \"cafcor\".")
    for j, stage in enumerate(server):
        if isinstance(stage, CentralGaussianNoise):
            _check_central(cfg, client, server, j, stage, extras)
