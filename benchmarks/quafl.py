"""QuAFL vs FedAvg, FedBuff and QSGD variants in simulated time (issue #11's reproduction, small scale).

Setting (configs/quafl/*.toml): MNIST (digits with a printed notice when `make data` has not run), MLP 784-32-10,
n = 20 clients with i.i.d. shards, a quarter slow (steps ~ Exp(mean 8), others Exp(mean 2)), s = 5 clients per
server step, K = 5 local steps, batch 128, sit = 10 time units for 32-bit messages (scaled by b/32), swt = 0, a
time limit of 1500 units. Methods: QuAFL with the lattice quantizer (b = 14, 8 and 4; lattice step 1e-4, 2e-3
and 2e-2), QuAFL fp32, QuAFL with QSGD on the models (b = 14, 8 and 4), FedAvg in simulated time, FedBuff,
FedBuff + QSGD (b = 14), and the paper's sequential baseline (one slow node, one SGD step per server step).

Claims checked (Zakerinia et al., Figs. 11/12, 22/23, 24/25): QuAFL reaches FedAvg's accuracy in less simulated
time and with about b/32 of its bits; the lattice quantizer beats QSGD on models at the same bits.

Tuning (the same for every method): the local learning rate on the grid {lr/3, lr, 3 lr} around the config's
lr = 0.5, extended by ×3 or ÷3 while the optimum sits on an edge (at most 6 points), on a tuning seed (100) that
is not an evaluation seed; criterion = mean test accuracy of the last 3 evaluations before the time limit. Then 3
evaluation seeds (0, 1, 2), mean ± std. Scale: QuAFL (lattice b = 14) with n = 100, s = 10 at the tuned lr.

Run: ``.venv/bin/python benchmarks/quafl.py`` (finished runs under ``benchmarks/out/quafl/`` whose config is
unchanged are reused); writes ``benchmarks/quafl.md``, ``quafl_time.png``, ``quafl_bits.png`` and
``quafl_results.json``.
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

from cached import run_cached  # noqa: E402  (this directory; opacus ships a top-level `benchmarks` package)
from trustfl.config.load import load_config  # noqa: E402
from trustfl.report.plots import plot_comparison  # noqa: E402

TUNING_SEED = 100
SEEDS = (0, 1, 2)
LAST = 3
MAX_GRID = 6
OUT = HERE / "out" / "quafl"
LATTICE8 = ['compress.uplink={name="lattice", bits=8, step=2e-3}',
            'compress.downlink={name="lattice", bits=8, step=2e-3}', "name=quafl-lattice8"]
QSGD8 = ['compress.uplink={name="qsgd_minmax", levels=256}', 'compress.downlink={name="qsgd_minmax", levels=256}',
         "name=quafl-qsgd8"]
LATTICE4 = ['compress.uplink={name="lattice", bits=4, step=2e-2}',
            'compress.downlink={name="lattice", bits=4, step=2e-2}', "name=quafl-lattice4"]
QSGD4 = ['compress.uplink={name="qsgd_minmax", levels=16}', 'compress.downlink={name="qsgd_minmax", levels=16}',
         "name=quafl-qsgd4"]
METHODS = {  # label: (config, overrides)
    "QuAFL, lattice b=14": ("configs/quafl/quafl.toml", []),
    "QuAFL, lattice b=8": ("configs/quafl/quafl.toml", LATTICE8),
    "QuAFL, fp32": ("configs/quafl/quafl_fp32.toml", []),
    "QuAFL, QSGD b=14": ("configs/quafl/quafl_qsgd.toml", []),
    "QuAFL, QSGD b=8": ("configs/quafl/quafl_qsgd.toml", QSGD8),
    "QuAFL, lattice b=4": ("configs/quafl/quafl.toml", LATTICE4),
    "QuAFL, QSGD b=4": ("configs/quafl/quafl_qsgd.toml", QSGD4),
    "FedAvg": ("configs/quafl/fedavg.toml", []),
    "FedBuff": ("configs/quafl/fedbuff.toml", []),
    "FedBuff + QSGD b=14": ("configs/quafl/fedbuff_qsgd.toml", []),
    "Sequential SGD (one slow node)": ("configs/quafl/sequential.toml", []),
}


SKEW = ['data.partition={name="class_groups", classes=[0, 1, 2], share=0.25}',
        'evaluators=[{name="accuracy"}, {name="loss"}, {name="class_accuracy", classes=[0, 1, 2]}]']
SKEWED = {  # the label-skew scenario (QuAFL Fig. 4): slow clients 0-4 own classes 0-2
    "QuAFL, lattice b=14 (label skew)": ("configs/quafl/quafl_label_skew.toml", []),
    "QuAFL weighted (η_i by speed), lattice b=14 (label skew)": ("configs/quafl/quafl_label_skew.toml",
                                                                 ["recipe.speed_weights=true",
                                                                  "name=quafl-weighted-label-skew"]),
    "FedAvg (label skew)": ("configs/quafl/fedavg.toml", SKEW + ["name=fedavg-label-skew"]),
    "FedBuff (label skew)": ("configs/quafl/fedbuff.toml", SKEW + ["name=fedbuff-label-skew"]),
}
ALL = {**METHODS, **SKEWED}


def _tag(label: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in label.lower()).strip("-")


def _run(config: str, overrides: list[str], tag: str) -> list[dict]:
    """The evaluated rows of the run (metrics.jsonl has a row per round; accuracy is in the evaluated ones)."""
    return [r for r in run_cached(ROOT / config, overrides, OUT / tag) if "accuracy" in r]


def _score(rows: list[dict]) -> float:
    return statistics.mean(r["accuracy"] for r in rows[-LAST:])


def tune(label: str) -> tuple[dict, list[dict]]:
    config, over = ALL[label]
    lr0 = load_config(ROOT / config).client.lr
    grid = [round(lr0 / 3, 6), lr0, round(lr0 * 3, 6)]
    scores: dict[float, float] = {}
    while True:
        for lr in grid:
            if lr not in scores:
                rows = _run(config, over + [f"client.lr={lr}", f"seed={TUNING_SEED}"], f"{_tag(label)}-tune-lr{lr}")
                scores[lr] = _score(rows)
                print(f"  tune {label}: lr={lr} -> {scores[lr]:.4f}", flush=True)
        best = max(grid, key=lambda lr: scores[lr])
        if len(grid) < MAX_GRID and best == grid[0]:
            grid = [round(grid[0] / 3, 6)] + grid
        elif len(grid) < MAX_GRID and best == grid[-1]:
            grid = grid + [round(grid[-1] * 3, 6)]
        else:
            return ({"lr": best, "grid": grid, "optimum_on_edge": best in (grid[0], grid[-1])},
                    [{"lr": lr, "score": s} for lr, s in scores.items()])


def _first(rows: list[dict], target: float, key: str) -> float | None:
    return next((r[key] for r in rows if r["accuracy"] >= target), None)


def _ms(values: list[float], fmt: str = ".4f") -> str:
    return f"{statistics.mean(values):{fmt}} ± {statistics.stdev(values):{fmt}}" if len(values) > 1 else "—"


def _reach(values: list[float | None], fmt: str) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "never"
    text = _ms(got, fmt) if len(got) > 1 else format(got[0], fmt)
    return text + ("" if len(got) == len(values) else f" ({len(values) - len(got)} of {len(values)} seeds never)")


def _series(seeds: list[list[dict]], x: str, grid: list[float]) -> list[tuple[float, float]]:
    """Mean over seeds of the last accuracy measured at or before each x on ``grid`` (a step function)."""
    points = []
    for g in grid:
        vals = [next((r["accuracy"] for r in reversed(rows) if r[x] <= g), None) for rows in seeds]
        if all(v is not None for v in vals):
            points.append((g, statistics.mean(vals)))
    return points


def _bits(r: dict) -> float:
    return r["bits_up_total"] + r["bits_down_total"]


def _mean_reach(seeds: list[list[dict]], target: float, key: str) -> float | None:
    """Mean over the seeds that reach ``target`` (``None`` if none does)."""
    got = [g for rows in seeds if (g := _first(rows, target, key)) is not None]
    return statistics.mean(got) if got else None


def _claims(runs: dict[str, list[list[dict]]], target: float | None) -> list[str]:
    """The paper's claims, checked on this record's numbers (computed here, not typed)."""
    out = ["Claims, checked on the numbers above:", ""]
    quafl, fedavg = runs.get("QuAFL, lattice b=14"), runs.get("FedAvg")
    if quafl and fedavg and target is not None:
        tq, tf = _mean_reach(quafl, target, "sim_time"), _mean_reach(fedavg, target, "sim_time")
        bq, bf = _mean_reach(quafl, target, "bits"), _mean_reach(fedavg, target, "bits")
        tf_text = "FedAvg never" if tf is None else f"FedAvg at {tf:.0f}"
        holds = tq is not None and (tf is None or tq < tf)
        out.append(f"- *QuAFL (lattice, b = 14) reaches FedAvg's accuracy in less simulated time*: "
                   f"{'holds' if holds else 'does not hold'} (QuAFL at {'never' if tq is None else f'{tq:.0f}'}, "
                   f"{tf_text}; means over the seeds that reach it).")
        if bq is not None and bf is not None:
            out.append(f"- *... with about b/32 = {14 / 32:.2f} of FedAvg's bits*: per message the lattice sends "
                       f"{quafl[0][-1]['bits_up'] / (fedavg[0][-1]['bits_up'] / fedavg[0][-1]['cohort_size'] * 5):.2f}"
                       f" of a 32-bit message, but to reach the target QuAFL sent {bq / bf:.2f}× FedAvg's bits "
                       f"({'holds' if bq / bf <= 0.6 else 'does not hold'}): it runs many more server steps, each "
                       "with 2·s messages.")
    for b in (14, 8, 4):
        lat, qs = runs.get(f"QuAFL, lattice b={b}"), runs.get(f"QuAFL, QSGD b={b}")
        if lat and qs:
            a_l = [_score(r) for r in lat]
            a_q = [_score(r) for r in qs]
            diff = statistics.mean(a_l) - statistics.mean(a_q)
            out.append(f"- *Lattice beats QSGD on models at b = {b}*: {'holds' if diff > 0 else 'does not hold'} "
                       f"(final accuracy {statistics.mean(a_l):.4f} vs {statistics.mean(a_q):.4f}).")
    return out + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run only the methods whose label contains this text")
    args = parser.parse_args()
    labels = [m for m in METHODS if args.only in m]
    skewed = [m for m in SKEWED if args.only in m]
    chosen, trials, runs = {}, {}, {}
    for label in list(dict.fromkeys(labels + skewed)):
        chosen[label], trials[label] = tune(label)
        config, over = ALL[label]
        runs[label] = [_run(config, over + [f"client.lr={chosen[label]['lr']}", f"seed={s}"],
                            f"{_tag(label)}-seed{s}") for s in SEEDS]
        for rows in runs[label]:
            for r in rows:
                r["bits"] = _bits(r)
    skew_runs = {k: runs.pop(k) for k in skewed if k in runs}
    if not runs:
        runs, labels = skew_runs, skewed
    data_source = next(iter(runs.values()))[0][-1]
    dataset = json.loads((OUT / f"{_tag(labels[0])}-seed0" / "summary.json").read_text()).get("dataset", "?")
    target = statistics.mean(_score(r) for r in runs["FedAvg"]) if "FedAvg" in runs else None
    lines = ["# QuAFL in simulated time: QuAFL vs FedAvg, FedBuff and QSGD", "",
             "Command: `.venv/bin/python benchmarks/quafl.py` (writes this file, `quafl_time.png`, `quafl_bits.png` "
             "and `quafl_results.json`). Setting and tuning protocol: the script's docstring. Every method gets the "
             "same learning-rate grid, tuning seed and simulated-time budget; a row says when its optimum is still "
             "on a grid edge.", "", f"Data set: `{dataset}`; time limit {data_source['sim_time']:.0f} units (the "
             "last server step may end past it).", ""]
    if target is not None:
        lines += [f"Target accuracy: FedAvg's final accuracy (mean of its 3 seeds, last {LAST} evaluations) = "
                  f"{target:.4f}.", ""]
    lines += ["| method | tuned lr (grid) | final accuracy | time to target | bits to target (up + down) | "
              "bits at the time limit | server steps | decode failures |", "|---|---|---|---|---|---|---|---|"]
    for label in labels:
        seeds = runs[label]
        c = chosen[label]
        edge = " (optimum on the grid edge)" if c["optimum_on_edge"] else ""
        fails = sum(int(rows[-1].get("decode_failures_total", 0)) for rows in seeds)
        reach_t = [_first(rows, target, "sim_time") for rows in seeds] if target is not None else []
        reach_b = [_first(rows, target, "bits") for rows in seeds] if target is not None else []
        lines.append(f"| {label} | {c['lr']} ({', '.join(map(str, c['grid']))}){edge} | "
                     f"{_ms([_score(r) for r in seeds])} | {_reach(reach_t, '.0f')} | {_reach(reach_b, '.3g')} | "
                     f"{_ms([rows[-1]['bits'] for rows in seeds], '.3g')} | "
                     f"{_ms([rows[-1]['server_step'] for rows in seeds], '.0f')} | {fails} |")
    lines += ["", "Decode failures: coordinates decoded to a wrong lattice point, summed over every server step of "
              "the 3 seeds (counted exactly by the simulator).", ""]
    lines += _claims(runs, target)
    limit = data_source["sim_time"]
    tgrid = [limit * i / 60 for i in range(61)]
    plot_comparison({k: _series(v, "sim_time", tgrid) for k, v in runs.items()},
                    "test accuracy (mean of 3 seeds)", "Accuracy against simulated time", HERE / "quafl_time.png",
                    xlabel="simulated time")
    top = max(rows[-1]["bits"] for v in runs.values() for rows in v)
    bgrid = [top * 1.12 ** (-i) for i in range(80)][::-1]
    plot_comparison({k: _series(v, "bits", bgrid) for k, v in runs.items()}, "test accuracy (mean of 3 seeds)",
                    "Accuracy against transmitted bits", HERE / "quafl_bits.png", xlabel="bits sent (up + down)",
                    log_x=True)
    lines += ["![accuracy vs simulated time](quafl_time.png)", "", "![accuracy vs bits](quafl_bits.png)", ""]

    if skew_runs and runs is not skew_runs:
        lines += ["## Label skew: the slow clients own classes 0-2", "",
                  "`configs/quafl/quafl_label_skew.toml`; FedAvg and FedBuff are their configs with the same "
                  "partition (`data.partition = {name = \"class_groups\", classes = [0, 1, 2], share = 0.25}`). "
                  "Tuned on the same grid (criterion: overall accuracy). Classes 0-2 accuracy: the test accuracy on "
                  "the examples of the slow clients' classes only (evaluator `class_accuracy`).", "",
                  "| method | tuned lr (grid) | final accuracy | final accuracy, classes 0-2 | accuracy at half time | "
                  "server steps |", "|---|---|---|---|---|---|"]
        for label, seeds in skew_runs.items():
            c = chosen[label]
            edge = " (optimum on the grid edge)" if c["optimum_on_edge"] else ""
            half = [next((r["accuracy"] for r in reversed(rows) if r["sim_time"] <= limit / 2), 0.0) for rows in seeds]
            lines.append(f"| {label} | {c['lr']} ({', '.join(map(str, c['grid']))}){edge} | "
                         f"{_ms([_score(r) for r in seeds])} | "
                         f"{_ms([statistics.mean(x['class_accuracy'] for x in r[-LAST:]) for r in seeds])} | "
                         f"{_ms(half)} | "
                         f"{_ms([rows[-1]['server_step'] for rows in seeds], '.0f')} |")
        plot_comparison({k: _series(v, "sim_time", tgrid) for k, v in skew_runs.items()},
                        "test accuracy (mean of 3 seeds)", "Label skew: accuracy against simulated time",
                        HERE / "quafl_label_skew.png", xlabel="simulated time")
        lines += ["", "![label skew](quafl_label_skew.png)", ""]
        runs.update(skew_runs)
    if "QuAFL, lattice b=14" in chosen:
        lr = chosen["QuAFL, lattice b=14"]["lr"]
        big = [_run("configs/quafl/quafl_n100.toml", [f"client.lr={lr}", f"seed={s}"], f"n100-seed{s}")
               for s in SEEDS]
        lines += ["## Scale: n = 100 clients, s = 10", "",
                  f"`configs/quafl/quafl_n100.toml` at the lr tuned for n = 20 ({lr}), 3 seeds: final accuracy "
                  f"{_ms([_score(r) for r in big])} after {_ms([r[-1]['server_step'] for r in big], '.0f')} "
                  f"server steps, {_ms([r[-1]['wall_time_s'] for r in big], '.1f')} s of wall time per run.", ""]
        runs["QuAFL n=100"] = big
    (HERE / "quafl_results.json").write_text(json.dumps(
        {"seeds": SEEDS, "tuning_seed": TUNING_SEED, "target": target, "chosen": chosen, "trials": trials,
         "curves": {k: [[(r["sim_time"], r["bits"] if "bits" in r else _bits(r), r["accuracy"]) for r in rows]
                        for rows in v] for k, v in runs.items()}}, indent=1) + "\n")
    (HERE / "quafl.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
