"""Building a federation with per-client privacy budgets: trustfl's vectorized RDP bounds against dp_accounting's.

Usage (from the repository root)::

    .venv/bin/python benchmarks/calibration_speed.py [--repeats 3] [--out benchmarks/calibration_speed.md]

Building a federation whose clients each have an ε calibrates one noise multiplier per distinct (ε, q, steps) by
root finding on ε(z), and every candidate z needs the RDP of the subsampled Gaussian at every order. Each case
is built in a fresh process (no cached RDP vector carries over), once as trustfl runs it and once with
``trustfl.privacy.analysis.sampled_rdp`` switched off, so that every vector comes from dp_accounting's own
per-order functions, as before that module existed. The two variants interleave ``--repeats`` times; each cell
is the median wall time of ``build_federation`` (data loading and model building included, identical in both).
The last column checks that both variants calibrated the same noise multipliers, bit for bit.

A third variant, ``node``, is the build of a deployed node (``build_federation(..., for_client=0)``, as
``trustfl.deploy.node.NodeRuntime`` runs it at every message of a Flower node): it calibrates client 0's noise
multiplier alone, and its value must equal the full build's, bit for bit.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cpu_info import cpus  # noqa: E402


def _digits(num_clients: int, dp: dict, batch_sampler: str = "shuffle") -> dict:
    return {"name": "calibration", "seed": 3, "rounds": 5,
            "data": {"dataset": "digits", "num_clients": num_clients, "partition": {"name": "dirichlet", "alpha": 1.0}},
            "model": {"name": "mlp", "hidden": [32]}, "cohort": {"sampler": "uniform", "size": 5},
            "client": {"epochs": 1, "batch_size": 16, "lr": 0.1, "batch_sampler": batch_sampler, "dp": dp},
            "engine": {"checkpoint_every": 0}}


CASES: dict[str, tuple[str, object]] = {
    "8 clients, ε = 2 each, sampling without replacement (RDP)":
        ("dict", _digits(8, {"mode": "per_example", "epsilon": 2.0})),
    "30 clients, ε from dist5, sampling without replacement (RDP)":
        ("dict", _digits(30, {"mode": "per_example", "epsilon_distribution": "dist5"})),
    "configs/dp/heterogeneous_eps_digits.toml: 10 clients, ε from dist5, Poisson (RDP)":
        ("file", "configs/dp/heterogeneous_eps_digits.toml"),
    "configs/robust_hdp/digits_quick.toml: 10 clients, Robust-HDP's calibration (fractional orders)":
        ("file", "configs/robust_hdp/digits_quick.toml"),
}
VARIANTS = ("trustfl", "dp_accounting", "node")


def child(case: str, variant: str) -> None:
    """Build one case in this fresh process and print {"seconds", "z"} as JSON."""
    import logging

    logging.disable(logging.WARNING)  # dp_accounting's non-convergence warnings (the fallback logs them)
    from trustfl.config.build import build_federation
    from trustfl.config.load import config_from_dict, load_config
    from trustfl.privacy.analysis import sampled_rdp

    if variant == "dp_accounting":
        sampled_rdp.fast_path_agrees = lambda: False  # leaf_rdp then leaves every vector to dp_accounting
    kind, spec = CASES[case]
    cfg = load_config(ROOT / str(spec)) if kind == "file" else config_from_dict(spec)  # type: ignore[arg-type]
    start = time.perf_counter()
    fed = build_federation(cfg, quiet=True, for_client=0 if variant == "node" else None)
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "z": [float(z).hex() for z in fed.noise_multipliers]}))


def measure(case: str, variant: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", case, variant], cwd=ROOT, capture_output=True,
                          text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{case} / {variant} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write the Markdown record here")
    parser.add_argument("--child", nargs=2, metavar=("CASE", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    rows = []
    for case in CASES:
        runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
        for _ in range(args.repeats):
            for variant in VARIANTS:
                runs[variant].append(measure(case, variant))
        seconds = {v: statistics.median(r["seconds"] for r in runs[v]) for v in VARIANTS}
        same = len({tuple(r["z"]) for v in VARIANTS[:2] for r in runs[v]}) == 1
        same_node = len({r["z"][0] for v in VARIANTS for r in runs[v]}) == 1
        rows.append((case, seconds, same and same_node, len(runs["trustfl"][0]["z"])))
        print(f"{case}: dp_accounting {seconds['dp_accounting']:.2f} s, trustfl {seconds['trustfl']:.2f} s, "
              f"node {seconds['node']:.2f} s, same z: {same}, node's z: {same_node}", flush=True)
    lines = ["# Calibrating per-client noise: build time", "",
             f"Command: `.venv/bin/python benchmarks/calibration_speed.py --repeats {args.repeats}"
             + (f" --out {args.out}`" if args.out else "`"), "",
             f"{cpus()}; load average {os.getloadavg()[0]:.2f} at the end; each build in a fresh process, the three "
             f"variants interleaved {args.repeats} times, median wall seconds of `build_federation`. *node*: a "
             f"deployed node's build (`for_client=0`: client 0's noise alone).", "",
             "| case | clients | dp_accounting's per-order bounds (s) | trustfl (s) | ratio | node (s) | "
             "same noise multipliers (node: client 0's) |", "|---|---|---|---|---|---|---|"]
    for case, seconds, same, n in rows:
        lines.append(f"| {case} | {n} | {seconds['dp_accounting']:.2f} | {seconds['trustfl']:.2f} | "
                     f"{seconds['trustfl'] / seconds['dp_accounting']:.2f}× | {seconds['node']:.2f} | "
                     f"{'yes, bitwise' if same else 'NO'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
