"""FedProx vs FedAvg and SCAFFOLD vs FedAvg on a heterogeneous split (issue #10's proof that the parts compose).

Setting (configs/fedprox/digits_dirichlet.toml and configs/scaffold/digits_dirichlet.toml): digits, 20 clients,
Dirichlet(0.1) label skew, MLP 64-64-10, 5 local epochs, batch 16, 40 rounds.

- FedProx experiment: 10 clients per round, half of them stragglers (``U{1..planned}`` local steps). FedAvg is the
  same run with ``μ = 0``. Claim checked (Li et al. 2020, §5.2): FedProx is at least as stable as FedAvg.
- SCAFFOLD experiment: all 20 clients every round. Claim checked (Karimireddy et al. 2020, §7): SCAFFOLD reaches
  FedAvg's final accuracy in fewer rounds.

Tuning (same for every method): the client learning rate on the grid {0.03, 0.1, 0.3} (FedProx also μ on {0.01,
0.1, 1}), one tuning seed (100) that is not an evaluation seed, criterion = mean test accuracy of the last 5
rounds. An optimum on a grid edge extends the grid by one step (×3 or ÷3) until it is inside, so no reported
optimum sits on an edge. Then 3 evaluation seeds (0, 1, 2), mean ± std.

Run: ``.venv/bin/python benchmarks/fedprox_scaffold.py`` (about 5 minutes on 2 cores); writes
``benchmarks/fedprox_scaffold.md``, ``fedprox_curves.png``, ``scaffold_curves.png`` and
``fedprox_scaffold_results.json``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from trustfl.config.load import load_config  # noqa: E402
from trustfl.experiment import run_experiment  # noqa: E402
from trustfl.report.plots import plot_comparison  # noqa: E402

TUNING_SEED = 100
SEEDS = (0, 1, 2)
LR_GRID = [0.03, 0.1, 0.3]
MU_GRID = [0.01, 0.1, 1.0]
LAST = 5
OUT = HERE / "out" / "fedprox_scaffold"


def _run(config: str, overrides: list[str], tag: str) -> list[dict]:
    cfg = load_config(ROOT / config, overrides + ["engine.checkpoint_every=0"])
    return run_experiment(cfg, OUT / tag, progress=False).rows


def _score(rows: list[dict]) -> float:
    return statistics.mean(r["accuracy"] for r in rows[-LAST:])


def _extend(grid: list[float], best: float) -> list[float] | None:
    if best == grid[0]:
        return [round(grid[0] / 3, 6)] + grid
    if best == grid[-1]:
        return grid + [round(grid[-1] * 3, 6)]
    return None


def tune(config: str, base: list[str], tag: str, with_mu: bool) -> tuple[dict, list[dict]]:
    """Grid search on the tuning seed, extending any grid whose optimum is on an edge."""
    lrs, mus = list(LR_GRID), list(MU_GRID) if with_mu else [None]
    scores: dict[tuple, float] = {}
    trials = []
    while True:
        for lr in lrs:
            for mu in mus:
                if (lr, mu) in scores:
                    continue
                over = base + [f"client.lr={lr}", f"seed={TUNING_SEED}"] + ([f"recipe.mu={mu}"] if mu else [])
                scores[(lr, mu)] = _score(_run(config, over, f"{tag}-tune-lr{lr}-mu{mu}"))
                trials.append({"lr": lr, "mu": mu, "score": scores[(lr, mu)]})
                print(f"  tune {tag}: lr={lr} mu={mu} -> {scores[(lr, mu)]:.4f}", flush=True)
        best = max(((k, v) for k, v in scores.items() if k[0] in lrs and k[1] in mus), key=lambda kv: kv[1])[0]
        grown = False
        if (new := _extend(lrs, best[0])) is not None and len(lrs) < 6:
            lrs, grown = new, True
        if with_mu and (new := _extend(mus, best[1])) is not None and len(mus) < 6:
            mus, grown = new, True
        if not grown:
            return {"lr": best[0], "mu": best[1], "lr_grid": lrs, "mu_grid": mus if with_mu else None}, trials


def evaluate(config: str, base: list[str], tag: str, chosen: dict) -> list[list[dict]]:
    over = base + [f"client.lr={chosen['lr']}"] + ([f"recipe.mu={chosen['mu']}"] if chosen["mu"] else [])
    return [_run(config, over + [f"seed={s}"], f"{tag}-seed{s}") for s in SEEDS]


def _stability(rows: list[dict]) -> tuple[float, float]:
    """(std of test accuracy over the second half, largest drop below the best accuracy so far)."""
    accs = [r["accuracy"] for r in rows]
    half = accs[len(accs) // 2:]
    best, drop = 0.0, 0.0
    for a in accs:
        best = max(best, a)
        drop = max(drop, best - a)
    return statistics.pstdev(half), drop


def _rounds_to(rows: list[dict], target: float) -> int | None:
    return next((r["round"] for r in rows if r["accuracy"] >= target), None)


def _ms(values: list[float], fmt: str = ".4f") -> str:
    return f"{statistics.mean(values):{fmt}} ± {statistics.stdev(values):{fmt}}" if len(values) > 1 else "—"


def _curves(runs: dict[str, list[list[dict]]], title: str, path: Path) -> None:
    series = {}
    for label, seeds in runs.items():
        n = min(len(r) for r in seeds)
        series[label] = [(seeds[0][i]["round"], statistics.mean(r[i]["accuracy"] for r in seeds)) for i in range(n)]
    plot_comparison(series, "test accuracy (mean of 3 seeds)", title, path)


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    results: dict = {"seeds": SEEDS, "tuning_seed": TUNING_SEED, "last": LAST}
    lines = ["# FedProx and SCAFFOLD on a heterogeneous split", "",
             "Command: `.venv/bin/python benchmarks/fedprox_scaffold.py` (writes this file, the two plots and "
             "`fedprox_scaffold_results.json`). Setting and tuning protocol: the script's docstring. Every method "
             "gets the same learning-rate grid and tuning seed; grids whose optimum was on an edge were extended "
             "by the script until it was inside.", ""]

    prox_cfg, prox_base = "configs/fedprox/digits_dirichlet.toml", []
    fedavg_p, trials_a = tune(prox_cfg, prox_base + ["algorithm=fedavg", "recipe={}"], "prox-fedavg", False)
    fedprox, trials_p = tune(prox_cfg, prox_base, "prox-fedprox", True)
    runs_p = {"FedAvg": evaluate(prox_cfg, prox_base + ["algorithm=fedavg", "recipe={}"], "prox-fedavg", fedavg_p),
              f"FedProx (μ = {fedprox['mu']})": evaluate(prox_cfg, prox_base, "prox-fedprox", fedprox)}
    _curves(runs_p, "FedProx vs FedAvg: Dirichlet(0.1), 50 % stragglers", HERE / "fedprox_curves.png")
    lines += ["## FedProx vs FedAvg (10 of 20 clients per round, 50 % stragglers)", "",
              "| method | tuned lr (grid) | tuned μ (grid) | final accuracy (last 5 rounds) | std of accuracy, "
              "rounds 21–40 | largest drop below best |", "|---|---|---|---|---|---|"]
    for (label, seeds), chosen in zip(runs_p.items(), (fedavg_p, fedprox)):
        stab = [_stability(r) for r in seeds]
        lines.append(f"| {label} | {chosen['lr']} ({chosen['lr_grid']}) | "
                     f"{chosen['mu'] if chosen['mu'] else '—'} ({chosen['mu_grid'] or '—'}) | "
                     f"{_ms([_score(r) for r in seeds])} | {_ms([s[0] for s in stab])} | "
                     f"{_ms([s[1] for s in stab])} |")
    lines += ["", "![FedProx curves](fedprox_curves.png)", ""]
    results["fedprox"] = {"fedavg": fedavg_p, "fedprox": fedprox, "trials": trials_a + trials_p,
                          "runs": {k: [[r["accuracy"] for r in rows] for rows in v] for k, v in runs_p.items()}}

    sc_cfg = "configs/scaffold/digits_dirichlet.toml"
    fedavg_s, trials_fa = tune(sc_cfg, ["algorithm=fedavg"], "scaf-fedavg", False)
    scaffold, trials_sc = tune(sc_cfg, [], "scaf-scaffold", False)
    runs_s = {"FedAvg": evaluate(sc_cfg, ["algorithm=fedavg"], "scaf-fedavg", fedavg_s),
              "SCAFFOLD": evaluate(sc_cfg, [], "scaf-scaffold", scaffold)}
    _curves(runs_s, "SCAFFOLD vs FedAvg: Dirichlet(0.1), full participation", HERE / "scaffold_curves.png")
    target = statistics.mean(_score(r) for r in runs_s["FedAvg"])
    lines += ["## SCAFFOLD vs FedAvg (all 20 clients every round)", "",
              f"Target: FedAvg's final accuracy (mean of its 3 seeds, last 5 rounds) = {target:.4f}.", "",
              "| method | tuned lr (grid) | final accuracy (last 5 rounds) | rounds to reach the target, per seed |",
              "|---|---|---|---|"]
    for (label, seeds), chosen in zip(runs_s.items(), (fedavg_s, scaffold)):
        reach = [_rounds_to(r, target) for r in seeds]
        lines.append(f"| {label} | {chosen['lr']} ({chosen['lr_grid']}) | {_ms([_score(r) for r in seeds])} | "
                     f"{', '.join('never' if x is None else str(x) for x in reach)} |")
    lines += ["", "![SCAFFOLD curves](scaffold_curves.png)", ""]
    results["scaffold"] = {"fedavg": fedavg_s, "scaffold": scaffold, "target": target,
                           "trials": trials_fa + trials_sc,
                           "runs": {k: [[r["accuracy"] for r in rows] for rows in v] for k, v in runs_s.items()}}
    (HERE / "fedprox_scaffold_results.json").write_text(json.dumps(results, indent=1) + "\n")
    (HERE / "fedprox_scaffold.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
