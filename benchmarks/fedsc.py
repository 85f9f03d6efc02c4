"""FedSC vs FedAvg+SC, the BYOL baselines and centralized SC on the small setting (digits in 10×10 canvases).

Usage (from the repository root)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fedsc.py --workers 2   # tuning, 3 seeds, both splits, timing
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fedsc.py --seeds 0 --splits 1class

Accuracy: configs/fedsc/digits_canvas_{1class,2class}.toml run with ``algorithm`` = fedsc, fedavg_sc, fedavg_byol,
fedu, fedema, fedx, fedca (the FedCA paper's joint softmax, and the FedSC authors' 0.8/0.2 mixture as a second row) and
centralized_sc for each seed; the table reports the final linear probe (backbone) and kNN (projector) test accuracy,
mean ± std over seeds, and the random-init network's probe (``initial_linear_probe_accuracy``, the floor).

Tuning (first, per split): every method's local lr on one common grid (:func:`tune`: seeds 100 and 101, disjoint
from the record's; score = final linear-probe accuracy; the grid grows by a half-decade at an edge that holds some
method's optimum); every other client setting is the config's. The DP section runs at FedSC's tuned lr.

DP (Table 6 style): FedSC on the 2class split sharing only in late rounds (t = 31, 33, …, 59: T_j = 15 releases),
σ_j calibrated per client for ε ∈ ``--epsilons`` at δ = 1e-2, beside the same late schedule without noise (ε = ∞)
and FedAvg+SC; the ε each client spent (``summary.json``) is reported.

Timing (the record's last section, ``benchmarks/fedsc_speed.py``): seconds per round of trustfl's FedSC round
(vectorized over the 10 clients, DP-CalR included) against :func:`loop_round`, a plain per-client Python loop of the
same work written here (same model, batches, views, loss, SGD with momentum and weight decay, DP-CalR of 5 views per
sample), each in fresh interleaved processes at one thread and at torch's default. ``--timing-only`` measures only
this and rewrites that section of an existing record (``--out``), saying so in its heading.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trustfl.config.load import load_config  # noqa: E402
from trustfl.experiment import run_experiment  # noqa: E402
from trustfl.objectives.spectral import fedsc_loss, norm_clip  # noqa: E402
from trustfl.selfsup.augment import DEFAULT, make_views  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' own helpers
import fedsc_speed  # noqa: E402
from tuning import search  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks/fedsc.md"
METHODS = {**{m: [f'algorithm="{m}"'] for m in ("fedsc", "fedavg_sc", "fedavg_byol", "fedu", "fedema")},
           "fedx": ['algorithm="fedx"'],
           "fedca": ['algorithm="fedca"'],
           "fedca (authors' code loss)": ['algorithm="fedca"', 'recipe.dictionary_loss="code"'],
           "centralized_sc": ['algorithm="centralized_sc"']}
"""Each method's overrides of the config; its local learning rate is tuned on a common grid (:func:`tune`)."""
TUNE_GRID = [0.003, 0.01, 0.03, 0.1]   # half-decade steps, grown at an edge (benchmarks/tuning.py)
TUNE_SEEDS = [100, 101]                # disjoint from the record's seeds
GRID_LIMITS = (1e-4, 1.0)


def _run_one(job: tuple[str, list[str]]) -> dict:
    config, overrides = job
    cfg = load_config(Path(config), overrides)
    with tempfile.TemporaryDirectory() as tmp:
        return _row(run_experiment(cfg, Path(tmp) / "run", progress=False, plots=False).summary)


def run_settings(config: Path, settings: dict[str, list[str]], seeds: list[int], label: str = "",
                 workers: int = 1) -> dict:
    """``{name: [summary row per seed]}`` of ``config`` run with each setting's overrides and each seed
    (``workers`` processes, one thread each)."""
    keys = [(name, seed) for name in settings for seed in seeds]
    jobs = [(str(config), [*settings[name], f"seed={seed}"]) for name, seed in keys]
    out: dict = {}
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            rows = list(pool.map(_run_one, jobs))
    else:
        rows = [_run_one(job) for job in jobs]
    for (name, seed), row in zip(keys, rows):
        out.setdefault(name, []).append(row)
        print(label, name, seed, row, flush=True)
    return out


def tune(config: Path, label: str, workers: int = 1, grid: list[float] | None = None,
         seeds: list[int] | None = None, limits: tuple[float, float] = GRID_LIMITS) -> dict:
    """Every method's local lr on one common grid (default ``TUNE_GRID``): each method runs at every lr with every
    seed (default ``TUNE_SEEDS``); its score at an lr is the mean final linear-probe accuracy; the grid grows by a
    half-decade on a side while some method's best lr sits at that edge, within ``limits`` (every method then runs
    at the new lr too)."""
    seeds = list(seeds or TUNE_SEEDS)

    def run(lrs: list[float]) -> dict[str, dict[str, list[float]]]:
        settings = {f"{m}@{lr:g}": [*over, f"client.lr={lr}"] for lr in lrs for m, over in METHODS.items()}
        scores: dict[str, dict[str, list[float]]] = {m: {} for m in METHODS}
        for name, rows in run_settings(config, settings, seeds, f"tune {label}", workers).items():
            m, lr = name.rsplit("@", 1)
            scores[m][lr] = [r["final_linear_probe_accuracy"] for r in rows]
        return scores

    return {**search(grid or TUNE_GRID, limits, run), "seeds": seeds}


def tuning_table(record: dict) -> list[str]:
    """Markdown table of :func:`tune`'s scores per method and lr, the chosen lr and whether it is at an edge."""
    grid = record["grid"]
    lines = ["| method | " + " | ".join(f"lr {lr:g}" for lr in grid) + " | chosen | at grid edge |",
             "|---|" + "---|" * (len(grid) + 2)]
    for m, by_lr in record["scores"].items():
        cells = [f"{100 * statistics.mean(by_lr[f'{lr:g}']):.1f}" for lr in grid]
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {record['chosen'][m]:g} | "
                     f"{'**yes**' if record['at_edge'][m] else 'no'} |")
    return lines


def run_methods(config: Path, methods: dict[str, list[str]], seeds: list[int], label: str = "",
                lrs: dict[str, float] | None = None, workers: int = 1) -> dict:
    """``{method: [summary row per seed]}`` of ``config`` run with each method's overrides (and its lr from
    ``lrs``, else the config's) and each seed."""
    settings = {m: [*over, *([f"client.lr={lrs[m]}"] if lrs else [])] for m, over in methods.items()}
    return run_settings(config, settings, seeds, label, workers)


def accuracy(splits: list[str], seeds: list[int], tuned: dict, workers: int) -> dict:
    return {split: run_methods(ROOT / f"configs/fedsc/digits_canvas_{split}.toml", METHODS, seeds, split,
                               tuned[split]["chosen"], workers) for split in splits}


def table(results: dict, lrs: dict[str, float] | None = None) -> list[str]:
    """Markdown rows ``| method | probe | kNN | floor | s / run |`` of :func:`run_methods`' results (the method
    with its lr when ``lrs`` are given)."""
    name = (lambda m: f"{m} (lr {lrs[m]:g})") if lrs else (lambda m: m)  # noqa: E731
    return [f"| {name(method)} | {fmt([r['final_linear_probe_accuracy'] for r in rows])} | "
            f"{fmt([r['final_knn_accuracy'] for r in rows])} | "
            f"{fmt([r['initial_linear_probe_accuracy'] for r in rows])} | "
            f"{statistics.mean(r['wall_time_s'] for r in rows):.1f} |" for method, rows in results.items()]


LATE = ["recipe.share_from=31", "recipe.share_every=2"]


def _row(summary: dict) -> dict:
    row = {k: summary[k] for k in ("final_linear_probe_accuracy", "final_knn_accuracy",
                                   "initial_linear_probe_accuracy", "wall_time_s")}
    if isinstance(summary.get("epsilon"), dict):
        row["epsilon_max"] = max(summary["epsilon"].values())
    return row


def privacy(epsilons: list[float], seeds: list[int], lr: float | None, workers: int) -> dict:
    """FedSC on the 2class split with late sharing, at each ε (and without noise), at FedSC's tuned ``lr``."""
    base = ['algorithm="fedsc"', *LATE, *([f"client.lr={lr}"] if lr else [])]
    settings = {f"fedsc ε={e:g}": [*base, f"recipe.epsilon={e}", "recipe.delta=1e-2"] for e in epsilons}
    settings["fedsc ε=∞ (same late sharing, no noise)"] = base  # no δ: without noise it is refused (it did nothing)
    return run_settings(ROOT / "configs/fedsc/digits_canvas_2class.toml", settings, seeds, "dp", workers)


def loop_round(fed, params_flat: torch.Tensor, r: int, store: dict) -> torch.Tensor:
    """One FedSC round as a per-client loop: DP-CalR per client, then each client's local SGD, then the mean."""
    model, layout, stat = fed.model, fed.layout, dict(fed.statistics)["fedsc_correlation"]
    kernel = fed.augment.kernel if fed.augment is not None else DEFAULT
    x_all = fed.train_data.tensors["x"]
    mats = []
    with torch.no_grad():
        for j, rows in enumerate(fed.client_rows):
            torch.nn.utils.vector_to_parameters(params_flat, model.parameters())
            v = make_views(x_all[rows], stat.views, torch.Generator().manual_seed(r * 1000 + j), kernel)
            z = norm_clip(model(v.flatten(0, 1)), stat.mu ** 0.5)
            mats.append(z.T @ z / z.shape[0])
    mats = torch.stack(mats)
    q = torch.tensor([len(rw) for rw in fed.client_rows], dtype=mats.dtype)
    q = q / q.sum()
    total = torch.einsum("j,jhk->hk", q, mats)
    alpha = 1.0 - 0.8 * r / fed.rounds
    new = []
    for j, rows in enumerate(fed.client_rows):
        ref = (total - q[j] * mats[j]) / (1 - q[j])
        torch.nn.utils.vector_to_parameters(params_flat.clone(), model.parameters())
        opt = torch.optim.SGD(model.parameters(), lr=fed.training.lr, momentum=fed.training.momentum,
                              weight_decay=fed.training.weight_decay)
        gen = torch.Generator().manual_seed(r * 1000 + j)
        for _ in range(fed.training.epochs):
            for b in torch.randperm(len(rows), generator=gen).split(fed.batch_sizes[j]):
                v = make_views(x_all[rows[b]], 2, gen, kernel)
                z = norm_clip(model(v.flatten(0, 1)).view(len(b), 2, -1), stat.mu ** 0.5)
                loss = fedsc_loss(z[:, 0], z[:, 1], ref, alpha)
                opt.zero_grad()
                loss.backward()
                opt.step()
        new.append(torch.nn.utils.parameters_to_vector(model.parameters()).detach())
    return torch.stack(new).mean(0)


TIMING_TITLE = "## Cost of one FedSC round (1class split, 10 clients)"


def rewrite_timing(out: Path) -> None:
    """Measure the cost of a round (:func:`fedsc_speed.measure`) and put it in place of ``out``'s last section (the
    earlier timing), and in the JSON record beside it; the heading names this command."""
    text = out.read_text() if out.is_file() else ""
    if "\n## Cost of one FedSC round" not in text:
        raise SystemExit(f"{out} holds no section '## Cost of one FedSC round' to rewrite; run the full benchmark.")
    tim = fedsc_speed.measure()
    command = ".venv/bin/python benchmarks/fedsc.py --timing-only" + ("" if out == DEFAULT_OUT else f" --out {out}")
    head = text[:text.index("\n## Cost of one FedSC round") + 1]
    out.write_text(head + "\n".join(fedsc_speed.section(tim, f"{TIMING_TITLE}, written by `{command}`")))
    record = out.with_suffix(".json")
    if record.exists():
        data = json.loads(record.read_text())
        record.write_text(json.dumps({**data, "timing": tim}, indent=1))
    print("\n".join(fedsc_speed.section(tim, TIMING_TITLE)))


def fmt(values: list[float]) -> str:
    m = 100 * statistics.mean(values)
    s = 100 * statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{m:.1f} ± {s:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--splits", default="1class,2class")
    parser.add_argument("--epsilons", default="3,6", help="DP section's ε values ('' to skip it)")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--workers", type=int, default=1, help="processes (one thread each)")
    parser.add_argument("--timing-only", action="store_true",
                        help="measure only the cost of a round and rewrite that section of the existing --out record")
    args = parser.parse_args()
    if args.timing_only:
        rewrite_timing(Path(args.out))
        return
    seeds = [int(s) for s in args.seeds.split(",")]
    splits = args.splits.split(",")
    start = time.perf_counter()
    tuned = {split: tune(ROOT / f"configs/fedsc/digits_canvas_{split}.toml", split, args.workers) for split in splits}
    tuned_s = time.perf_counter() - start
    acc = accuracy(splits, seeds, tuned, args.workers)
    dp_lr = tuned["2class"]["chosen"]["fedsc"] if "2class" in tuned else None
    dp = privacy([float(e) for e in args.epsilons.split(",") if e], seeds, dp_lr, args.workers)
    tim = fedsc_speed.measure()
    lines = ["# FedSC on digits in 10×10 canvases", "",
             f"Command: `OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fedsc.py --seeds {args.seeds} "
             f"--splits {args.splits} --epsilons {args.epsilons} --workers {args.workers}`", "",
             "Configs: configs/fedsc/digits_canvas_{1class,2class}.toml (60 rounds, 5 local epochs, B = 64, "
             "cosine lr, momentum 0.9, wd 5e-4, μ = 4, V_share = 5, α 1 → 0.2, σ = 0, full participation; "
             "MLP 100-256-128 → 128 → 64 with He-normal weights and zero biases; views shift the digit by at most "
             "1 pixel inside its canvas without cutting it off). Every method's local lr is tuned on the same grid "
             "(below), seeds "
             f"{TUNE_SEEDS}, the rest of the config shared. Seeds {seeds}; final test accuracy (%), mean ± std.", "",
             "| split | method (tuned lr) | linear probe (backbone) | kNN (projector) | random-init probe | s / run |",
             "|---|---|---|---|---|---|"]
    for split, by_method in acc.items():
        lines += [f"| {split} | {row[2:]}" for row in table(by_method, tuned[split]["chosen"])]
    for split, record in tuned.items():
        lines += ["", f"## Learning-rate tuning, {split} split (final linear probe %, mean over seeds {TUNE_SEEDS})",
                  "", *tuning_table(record), "",
                  f"Any optimum at a grid edge: **{any(record['at_edge'].values())}**."]
    lines += ["", f"Tuning took {tuned_s / 60:.0f} min ({args.workers} process(es)); the grid started at {TUNE_GRID} "
              f"and grows by a half-decade on a side while some method's best lr is at that edge (limits "
              f"{GRID_LIMITS[0]:g}–{GRID_LIMITS[1]:g}); the tuning runs are written to benchmarks/fedsc.json."]
    if dp:
        at = f"FedSC's tuned lr {dp_lr:g}" if dp_lr else "the config's lr (the 2class split was not tuned)"
        lines += ["", f"## DP-protected matrices (2class split, late sharing: t = 31, 33, …, 59, T_j = 15, δ = 1e-2; "
                  f"{at})",
                  "", "| setting | linear probe (backbone) | kNN (projector) | ε spent (max over clients) |",
                  "|---|---|---|---|"]
        base = acc.get("2class", {}).get("fedavg_sc")
        if base:
            lines.append(f"| fedavg_sc (no sharing) | {fmt([r['final_linear_probe_accuracy'] for r in base])} | "
                         f"{fmt([r['final_knn_accuracy'] for r in base])} | — |")
        for name, rows in dp.items():
            eps = max((r.get("epsilon_max", 0.0) for r in rows), default=0.0)
            lines.append(f"| {name} | {fmt([r['final_linear_probe_accuracy'] for r in rows])} | "
                         f"{fmt([r['final_knn_accuracy'] for r in rows])} | {eps:.3f} |" if eps else
                         f"| {name} | {fmt([r['final_linear_probe_accuracy'] for r in rows])} | "
                         f"{fmt([r['final_knn_accuracy'] for r in rows])} | ∞ (σ = 0) |")
    lines += ["", *fedsc_speed.section(tim, TIMING_TITLE)]
    Path(args.out).write_text("\n".join(lines))
    (Path(args.out).with_suffix(".json")).write_text(json.dumps({"tuning": tuned, "accuracy": acc, "privacy": dp,
                                                                    "timing": tim}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
