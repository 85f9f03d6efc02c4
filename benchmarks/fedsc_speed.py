"""Cost of one FedSC round: trustfl's engine (vectorized over the clients) against a per-client loop of the same work.

Setting: ``configs/fedsc/digits_canvas_1class.toml`` (10 clients, full participation, 5 local epochs of B = 64 with
two views per sample, SGD with momentum 0.9 and weight decay 5e-4, DP-CalR of 5 views per sample every round). The
loop is ``fedsc.loop_round``: each client one after another with an ``nn.Module`` and ``torch.optim.SGD``, the same
model, batches, views, loss and DP-CalR.

Every (implementation, torch threads) runs in its own process, ``--processes`` times, interleaved; each process times
``--rounds`` rounds after two warm-up rounds and reports their median (wall clock). Both run with the allocator
setting of every trustfl run (``tune_allocator``). The table gives the median
(min–max) over processes. The acceptance ratio compares trustfl at torch's default thread count with the loop at
whichever thread count is faster for it (so the loop is never handicapped by a setting that does not suit it).

Run: ``.venv/bin/python benchmarks/fedsc_speed.py [--processes 9] [--rounds 5] [--out FILE]`` (prints the table,
and writes it with the command to FILE). The record is the last section of benchmarks/fedsc.md, written by
``.venv/bin/python benchmarks/fedsc.py --timing-only`` (or by a full ``fedsc.py`` run).
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

from cpu_info import cpus

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs/fedsc/digits_canvas_1class.toml"
IMPLEMENTATIONS = ("trustfl", "loop")
TARGET = 0.6


def worker(implementation: str, threads: int, rounds: int) -> dict:
    import torch
    torch.set_num_threads(threads)
    sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
    from fedsc import loop_round
    from trustfl.config.build import build_federation
    from trustfl.config.load import load_config
    from trustfl.engine.allocator import tune_allocator
    from trustfl.engine.sync import initial_state, run_round

    tune_allocator()  # as every trustfl run does (run_experiment); it applies to the loop alike

    fed = build_federation(load_config(CONFIG), quiet=True)
    state = initial_state(fed)
    params = state.params.clone()
    times = []
    for r in range(rounds + 2):  # two warm-up rounds (imports, first vmap call, allocator)
        start = time.perf_counter()
        if implementation == "trustfl":
            state, _ = run_round(fed, state)
        else:
            params = loop_round(fed, params, r + 1, {})
        if r >= 2:
            times.append(time.perf_counter() - start)
    return {"seconds_per_round": statistics.median(times), "threads": torch.get_num_threads()}


def _spawn(implementation: str, threads: int, rounds: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", implementation, "--threads", str(threads), "--rounds", str(rounds)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(processes: int = 9, rounds: int = 5) -> dict:
    """Seconds per round of every (implementation, threads) cell, ``processes`` fresh processes each, interleaved
    (a slow spell of the machine hits every cell alike); with the medians, the loop's faster setting and the ratio."""
    import torch
    default = torch.get_num_threads()
    thread_counts = sorted({1, default})
    seconds: dict[str, list[float]] = {}
    load_start = os.getloadavg()[0]
    for _ in range(max(processes, 1)):
        for threads in thread_counts:
            for impl in IMPLEMENTATIONS:
                s = _spawn(impl, threads, rounds)["seconds_per_round"]
                seconds.setdefault(f"{impl}/{threads}", []).append(s)
                print(f"  {impl:8s} threads={threads}: {s:.4f} s/round", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in seconds.items()}
    best_loop = min(thread_counts, key=lambda t: med[f"loop/{t}"])
    return {"seconds": seconds, "median": med, "default_threads": default, "thread_counts": thread_counts,
            "loop_best_threads": best_loop, "ratio": med[f"trustfl/{default}"] / med[f"loop/{best_loop}"],
            "processes": processes, "rounds": rounds, "load": [load_start, os.getloadavg()[0]]}


def section(result: dict, title: str) -> list[str]:
    """The Markdown of ``result`` (:func:`measure`) under the heading ``title``."""
    med, seconds, default = result["median"], result["seconds"], result["default_threads"]

    def cell(key: str) -> str:
        return f"{med[key]:.4f} ({min(seconds[key]):.4f}–{max(seconds[key]):.4f})"

    lines = [title, "",
             f"{CONFIG.relative_to(ROOT)}: 10 clients, full participation, 5 local epochs of B = 64 with 2 views, "
             "SGD with momentum and weight decay, DP-CalR (5 views per sample) every round. trustfl: the sync engine, "
             "the clients vectorized. Loop: `fedsc.loop_round`, the clients one after another with an nn.Module and "
             f"torch.optim.SGD, the same work. {cpus()}, torch's default {default} threads; each cell "
             f"ran in {result['processes']} fresh processes, interleaved, each the median of {result['rounds']} "
             "rounds after 2 warm-up rounds (wall clock), with the allocator setting of trustfl runs in both; median "
             f"(min–max) over processes. 1-minute load average {result['load'][0]:.2f} at the start, "
             f"{result['load'][1]:.2f} at the end.", "",
             "| torch threads | trustfl s / round | loop s / round | trustfl / loop |", "|---|---|---|---|"]
    for t in result["thread_counts"]:
        lines.append(f"| {t} | {cell(f'trustfl/{t}')} | {cell(f'loop/{t}')} | "
                     f"{med[f'trustfl/{t}'] / med[f'loop/{t}']:.2f} |")
    ratio = result["ratio"]
    return lines + ["", f"Acceptance (trustfl at torch's default {default} threads against the loop at its faster "
                        f"setting, {result['loop_best_threads']} thread(s); target ≤ {TARGET}): **{ratio:.2f}**, "
                        f"{'met' if ratio <= TARGET else 'NOT met'}.", ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=9, help="fresh processes per cell, interleaved")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per process (after 2 warm-up rounds)")
    parser.add_argument("--worker", choices=IMPLEMENTATIONS, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--out", help="also write the command and the table to this Markdown file")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.threads, args.rounds)))
        return
    text = "\n".join(section(measure(args.processes, args.rounds), "# Cost of one FedSC round"))
    print(text)
    if args.out:
        command = " ".join([".venv/bin/python", "benchmarks/fedsc_speed.py"] + sys.argv[1:])
        Path(args.out).write_text(f"`{command}`\n\n{text}")


if __name__ == "__main__":
    main()
