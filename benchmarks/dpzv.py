"""DPZV reproduction in small (the DPZV paper's Figs. 2–5 on MNIST): writes benchmarks/dpzv.md, dpzv_lr.json, plots.

Setting: ``configs/dpzv/mnist_dpzv.toml`` (MNIST, a 10,000-image training subset and 2,000 test images, 7
parties holding 4 image rows each, party MLP 112-64-16, head 112-64-10, B = 64, λ = 1e-3, C = 10, δ = 1e-3,
μ-GDP accountant; 5 rounds = 5 passes of every party over the data = 5,495 server iterations).

0. **Tuning** (``dpzv_lr.json``): every method's party learning rate (``client.lr``, η_m) on one common log grid
   per ε, seed 100 (disjoint from the record's seeds), score = mean test accuracy of the last 2 rounds; where
   any method's optimum sits at an edge the grid grows by a decade on that side, for every method, until no
   optimum is at an edge (or the limits 1e-10 / 10 are reached, flagged). The server's η_0 = 0.005 with momentum
   0.9 is the paper's (Table 2: the same for every method) and is not tuned.
1. **Privacy–accuracy** (Figs. 2, 3): DPZV vs VAFL-DP vs ZOO-VFL-DP vs VFL-CZOFO-DP at ε ∈ {0.1, 1, 10, ∞},
   3 seeds, mean ± std of the final test accuracy; ε = ∞ is each method without DP (VAFL at ε = ∞ is the
   non-private VAFL).
2. **Clipping** (Figs. 4, 5): DPZV without clipping vs with C = 10 at ε = ∞; DPZV at ε = 1 over
   C ∈ {1, 10, 100, 500} (at the ε = 1 learning rate, not re-tuned per C).
3. **Controls**: (a) the head alone — DPZV's setting with the parties frozen at their initialisation
   (η_m = 1e-12, no DP): how much of any method's accuracy the server's head gets from random party features;
   (b) VAFL-DP with its noise calibrated for every iteration's release counted against every party
   (``recipe.release_count = "all"``, the paper's count T for its baselines, √7 more noise than a party's own
   releases need), tuned on its own grid the same way, at ε ∈ {0.1, 1, 10}.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/dpzv.py [--jobs 2]   # ~25 min on 2 cores
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/dpzv.py --quick       # smoke test, nothing written

Runs are cached in ``benchmarks/out/dpzv/`` (keyed by their overrides); a rerun reuses them.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OUT = ROOT / "benchmarks"
CACHE = OUT / "out" / "dpzv"
CONFIG = "configs/dpzv/mnist_dpzv.toml"
METHODS = {"dpzv": "DPZV", "vafl": "VAFL-DP", "zoo_vfl": "ZOO-VFL-DP", "czofo": "VFL-CZOFO-DP"}
PAPER_COUNT = "vafl_all"
"""VAFL-DP with ``release_count = "all"`` (control 3b)."""
FROZEN_LR = 1e-12
EPSILONS = [0.1, 1.0, 10.0, math.inf]
GRID = [1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1]
LIMITS = (1e-10, 10.0)
TUNE_SEED, SEEDS = 100, (0, 1, 2)
CLIPS = [1.0, 10.0, 100.0, 500.0]
CONFIGS = {"dpzv": "mnist_dpzv.toml", "vafl": "mnist_vafl.toml", "zoo_vfl": "mnist_zoo_vfl.toml",
           "czofo": "mnist_czofo.toml"}
"""The shipped config of each method at ε = 1 (its ``client.lr`` is the tuned ε = 1 value)."""


def recipe(method: str, eps: float, clip: float | None = None, clipping: bool = True) -> str:
    keys: dict[str, Any] = {}
    if math.isfinite(eps):
        keys.update(epsilon=eps, delta=1e-3)
    if method == PAPER_COUNT:
        keys["release_count"] = "all"
    if method == "dpzv":
        keys.update(smoothing=1e-3, **({"clip": clip or 10.0} if clipping else {"clipping": False}))
    elif math.isfinite(eps):
        keys["embedding_clip"] = 1.0
    body = ", ".join(f"{k} = {_toml(v)}" for k, v in keys.items())
    return f"recipe={{ {body} }}"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return f'"{value}"' if isinstance(value, str) else repr(value)


def overrides(method: str, eps: float, lr: float, seed: int, rounds: int, **extra: Any) -> list[str]:
    algorithm = "vafl" if method == PAPER_COUNT else method
    return [f'algorithm="{algorithm}"', f"client.lr={lr!r}", f"seed={seed}", f"rounds={rounds}",
            "engine.checkpoint_every=0", recipe(method, eps, **extra)]


def run_job(over: list[str]) -> dict[str, Any]:
    """One run (cached): final accuracy, the accuracy curve, the last rows' train loss, the ε spent."""
    key = hashlib.sha256(json.dumps([CONFIG, over]).encode()).hexdigest()[:16]
    path = CACHE / f"{key}.json"
    if path.is_file():
        return json.loads(path.read_text())
    import torch

    torch.set_num_threads(1)
    from trustfl.config.load import load_config
    from trustfl.experiment import run_experiment

    start = time.perf_counter()
    result = run_experiment(load_config(ROOT / CONFIG, over), CACHE / "runs" / key, progress=False, plots=False)
    record = {"overrides": over, "final_accuracy": result.summary["final_accuracy"],
              "curve": result.curve("accuracy"), "train_loss": [r["train_loss"] for r in result.rows],
              "epsilon_max": max(result.summary.get("epsilon", {"": 0.0}).values()),
              "noise_multiplier": json.loads((result.run_dir / "run_info.json").read_text())["vertical"].get(
                  "noise_multiplier"),
              "seconds": time.perf_counter() - start}
    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return record


def run_all(jobs: list[list[str]], workers: int) -> list[dict[str, Any]]:
    if workers <= 1:
        return [run_job(j) for j in jobs]
    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(run_job, jobs))


def score(record: dict[str, Any]) -> float:
    return statistics.mean(acc for _, acc in record["curve"][-2:])


def tune(args: argparse.Namespace) -> dict[str, Any]:
    """The common grid per ε, grown at the edges until every method's optimum is inside."""
    out: dict[str, Any] = {"seed": TUNE_SEED, "rounds": args.rounds, "score": "mean test accuracy, last 2 rounds",
                           "epsilons": {}}
    for eps in args.epsilons:
        grid = list(GRID)
        while True:
            jobs = [(m, lr) for m in args.methods for lr in grid]
            records = run_all([overrides(m, eps, lr, TUNE_SEED, args.rounds) for m, lr in jobs], args.jobs)
            scores = {m: {} for m in args.methods}
            for (m, lr), rec in zip(jobs, records):
                scores[m][repr(lr)] = score(rec)
            best = {m: max(grid, key=lambda lr: scores[m][repr(lr)]) for m in args.methods}
            low = any(b == grid[0] for b in best.values()) and grid[0] / 10 >= LIMITS[0]
            high = any(b == grid[-1] for b in best.values()) and grid[-1] * 10 <= LIMITS[1]
            if not (low or high):
                break
            grid = ([grid[0] / 10] if low else []) + grid + ([grid[-1] * 10] if high else [])
        out["epsilons"][_eps_key(eps)] = {
            "grid": grid, "scores": scores, "chosen": best,
            "at_edge": {m: b in (grid[0], grid[-1]) for m, b in best.items()}}
    return out


def _eps_key(eps: float) -> str:
    return "inf" if math.isinf(eps) else repr(eps)


def fmt(values: list[float]) -> str:
    if len(values) == 1:
        return f"{100 * values[0]:.1f}"
    return f"{100 * statistics.mean(values):.1f} ± {100 * statistics.stdev(values):.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="1 round, ε = 1 only, the grid's middle; no files")
    args = parser.parse_args()
    args.methods = list(METHODS)
    args.epsilons = [1.0] if args.quick else EPSILONS
    args.rounds = 1 if args.quick else 5
    if args.quick:
        global GRID
        GRID = [1e-5, 1e-4, 1e-3]
    start = time.perf_counter()
    tuning = tune(args)
    lr = {(m, e): tuning["epsilons"][_eps_key(e)]["chosen"][m] for m in args.methods for e in args.epsilons}
    seeds = (0,) if args.quick else SEEDS
    main_jobs = [(m, e, s) for m in args.methods for e in args.epsilons for s in seeds]
    records = run_all([overrides(m, e, lr[m, e], s, args.rounds) for m, e, s in main_jobs], args.jobs)
    grid = {(m, e, s): r for (m, e, s), r in zip(main_jobs, records)}
    clip_jobs = [(c, s) for c in CLIPS for s in seeds] if 1.0 in args.epsilons else []
    clip_records = run_all([overrides("dpzv", 1.0, lr["dpzv", 1.0], s, args.rounds, clip=c) for c, s in clip_jobs],
                           args.jobs)
    clip_grid = {k: r for k, r in zip(clip_jobs, clip_records)}
    controls = {}
    if not args.quick:
        frozen = run_all([overrides("dpzv", math.inf, FROZEN_LR, s, args.rounds) for s in seeds], args.jobs)
        paper_args = argparse.Namespace(**{**vars(args), "methods": [PAPER_COUNT],
                                           "epsilons": [e for e in args.epsilons if math.isfinite(e)]})
        paper_tuning = tune(paper_args)
        paper_lr = {e: paper_tuning["epsilons"][_eps_key(e)]["chosen"][PAPER_COUNT] for e in paper_args.epsilons}
        paper_jobs = [(e, s) for e in paper_args.epsilons for s in seeds]
        paper = run_all([overrides(PAPER_COUNT, e, paper_lr[e], s, args.rounds) for e, s in paper_jobs], args.jobs)
        controls = {"frozen": frozen, "paper_tuning": paper_tuning,
                    "paper": {k: r for k, r in zip(paper_jobs, paper)}}
        tuning["paper_count_vafl"] = paper_tuning["epsilons"]
    noclip = {}
    if math.inf in args.epsilons:
        noclip_records = run_all([overrides("dpzv", math.inf, lr["dpzv", math.inf], s, args.rounds, clipping=False)
                                  for s in seeds], args.jobs)
        noclip = dict(zip(seeds, noclip_records))
    elapsed = time.perf_counter() - start
    report = write_report(args, tuning, lr, grid, clip_grid, noclip, seeds, elapsed, controls)
    if args.quick:
        print(report)
        return
    (OUT / "dpzv_lr.json").write_text(json.dumps(tuning, indent=1) + "\n")
    (OUT / "dpzv.md").write_text(report)
    plots(args, grid, clip_grid, noclip, seeds)
    print(f"wrote benchmarks/dpzv.md, dpzv_lr.json, dpzv_*.png in {elapsed:.0f} s")


def write_report(args, tuning, lr, grid, clip_grid, noclip, seeds, elapsed, controls) -> str:
    from dpzv_report import report

    return report(args, tuning, lr, grid, clip_grid, noclip, seeds, elapsed, controls)


def plots(args, grid, clip_grid, noclip, seeds) -> None:
    from dpzv_report import plots as draw

    draw(args, grid, clip_grid, noclip, seeds)


if __name__ == "__main__":
    main()
