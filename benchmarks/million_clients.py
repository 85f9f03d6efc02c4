"""A population of 1,000,000 stateless clients: one FedAvg round with 100 sampled, peak memory and time.

The data set is the test plugin ``tests/engine/million_plugin.py`` (10⁶ two-feature points, one per client),
loaded through the config's ``plugins``; logistic regression, batch 1. Prints the peak RSS of the process and the
wall time from start to finish (imports, building the population, the round, evaluation, run directory).

Run from the repository root: ``.venv/bin/python benchmarks/million_clients.py [--out benchmarks/million_clients.md]``.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

start = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trustfl.config.load import config_from_dict  # noqa: E402
from trustfl.experiment import run_experiment  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the record (markdown) to this file")
    args = parser.parse_args()
    cfg = config_from_dict({
        "name": "million", "rounds": 1, "plugins": ["tests/engine/million_plugin.py"],
        "data": {"dataset": "million_points", "num_clients": 1_000_000}, "model": {"name": "logreg"},
        "cohort": {"sampler": "uniform", "size": 100}, "client": {"batch_size": 1, "lr": 0.1},
        "engine": {"checkpoint_every": 0}})
    with tempfile.TemporaryDirectory() as out:
        result = run_experiment(cfg, Path(out) / "run", progress=False)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    line = (f"1,000,000 clients, 100 per round: rounds={result.summary['rounds']} peak RSS {peak_mb:.0f} MB, "
            f"{time.perf_counter() - start:.1f} s from start to finish (load average {os.getloadavg()[0]:.2f})")
    print(line)
    if args.out:
        Path(args.out).write_text(f"`.venv/bin/python benchmarks/million_clients.py --out {args.out}`\n\n"
                                  f"# A million stateless clients\n\n{line}\n")


if __name__ == "__main__":
    main()
