"""What a run's parts need of each other and of its data, refused when the run is built: settings that would stop
the run in its first round, or leave a part doing nothing, each named by its key."""
from __future__ import annotations

from typing import Any, Sequence

from trustfl.config.schema import ExperimentConfig
from trustfl.core.registry import component_name
from trustfl.errors import ConfigError


def check_enough_messages(cfg: ExperimentConfig, aggregator: Any) -> None:
    """Refuse a rule (with its pre-aggregators) that needs more messages than a round (a server step of the async
    engine) can ever bring: every round would stop with the rule's error, or be skipped (e.g. cwtm with f = 100 on a
    cohort of 10, krum under FedAsync's one client per step)."""
    most = cfg.data.num_clients if cfg.cohort.sampler != "uniform" else min(cfg.cohort.size, cfg.data.num_clients)
    problem = aggregator.too_few(most)
    if problem is not None:
        key = "cohort.size" if cfg.cohort.sampler == "uniform" else "data.num_clients"
        raise ConfigError(f"`aggregator`: {problem} (a round brings at most {most} messages: `{key}`); lower `f`, "
                          f"or aggregate more clients.")


def _short_clients(sizes: Sequence[int], batch_sizes: Sequence[int]) -> list[int]:
    """The clients holding some rows, but fewer than their batch size."""
    return [i for i, (rows, batch) in enumerate(zip(sizes, batch_sizes)) if 0 < rows < batch]


def _short_what(short: list[int], sizes: Sequence[int], batch_sizes: Sequence[int]) -> str:
    i = short[0]
    return (f"{len(short)} of the {len(sizes)} clients hold fewer rows than their batch size (client {i}: {sizes[i]} "
            f"rows, batch {batch_sizes[i]})")


def check_batches_fit(sampler: Any, sizes: Sequence[int], batch_sizes: Sequence[int], key: str) -> None:
    """Refuse a batch larger than a client's rows where the sampler cannot draw one (Poisson and fixed-size sampling
    draw b of n: the run failed in its first round, after a notice that such clients step on all their rows, which
    only the shuffle sampler does)."""
    short = [] if getattr(sampler, "max_batch_is_n", True) else _short_clients(sizes, batch_sizes)
    if short:
        raise ConfigError(f"`{key}`: {_short_what(short, sizes, batch_sizes)}, which "
                          f"{component_name('batch_sampler', sampler)} cannot draw; lower the batch size, or use "
                          f"`client.batch_sampler = \"shuffle\"`, which steps on all their rows.")


def whole_data_batches(sizes: Sequence[int], batch_sizes: Sequence[int]) -> str | None:
    """The notice that clients holding fewer rows than their batch size step on all of them (never silent)."""
    short = _short_clients(sizes, batch_sizes)
    if not short:
        return None
    return f"NOTICE: {_short_what(short, sizes, batch_sizes)}; each of their local steps uses all their rows."


def check_pair_noise(cfg: ExperimentConfig) -> None:
    """Refuse ``correlated_noise`` where some client may be absent from a round: the pair terms cancel only when
    every client sends (a partial cohort kept the absent clients' pair noise in the aggregate)."""
    pairs = next((i for i, c in enumerate(cfg.client_stages) if c.name == "correlated_noise"), None)
    if pairs is not None and (cfg.cohort.sampler != "all" or cfg.engine.kind != "sync"):
        raise ConfigError(f"`client_stages[{pairs}]`: correlated_noise's pair terms cancel only when every client "
                          f"sends in the same round: it needs `cohort.sampler = \"all\"` and `engine.kind = "
                          f"\"sync\"`, found {cfg.cohort.sampler!r} and {cfg.engine.kind!r} (the aggregate kept the "
                          f"absent clients' pair noise).")


def check_data_attack(cfg: ExperimentConfig, attack: Any, task: str, objective: Any, dataset: str) -> None:
    """Refuse a data-level attack (label flipping) where it poisons nothing: real-valued targets, an objective that
    reads no label (the self-supervised ones: the run was bitwise the run without it), or Byzantine clients that
    hold no data."""
    if not attack.data_level:
        return
    if task != "classification":
        raise ConfigError(f"`attack.name`: {cfg.attack.name!r} poisons class labels, but data set {dataset!r} has "
                          f"real-valued targets.")
    if not getattr(objective, "reads_labels", True):
        raise ConfigError(f"`attack.name`: {cfg.attack.name!r} poisons class labels, but objective "
                          f"{type(objective).__name__} reads no label: the run would be bitwise the run without the "
                          f"attack.")
    if not cfg.attack.byzantine_hold_data:
        raise ConfigError(f"`attack.byzantine_hold_data` = false: {cfg.attack.name!r} poisons the Byzantine clients' "
                          f"own data, and they would hold none; set it to true or choose an attack on messages.")


def check_reports(aggregator: Any, reports: dict[str, Any]) -> None:
    """Refuse a rule that reads a per-row report (``reported_epsilon``, ...) the run's clients do not give: it would
    fail in round 1."""
    missing = [key for key in getattr(aggregator, "reports", ()) if key not in reports]
    if missing:
        rule = component_name("aggregator", getattr(aggregator, "inner", aggregator))
        raise ConfigError(f"`aggregator`: {rule} reads the clients' report {missing[0]!r}, which this run does not "
                          f"give (it gives {sorted(reports)}; algorithm \"robust_hdp\" reports reported_epsilon and "
                          f"oracle_noise_variance).")
