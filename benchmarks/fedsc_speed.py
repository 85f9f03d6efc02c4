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

Run: ``.venv/bin/python benchmarks/fedsc_speed.py [--processes 5] [--rounds 5] [--out benchmarks/fedsc_speed.md]``.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=5, help="fresh processes per cell, interleaved")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per process (after 2 warm-up rounds)")
    parser.add_argument("--out", help="also write the record (Markdown) to this file")
    parser.add_argument("--worker", choices=IMPLEMENTATIONS, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.threads, args.rounds)))
        return
    import torch
    default = torch.get_num_threads()
    thread_counts = sorted({1, default})
    seconds: dict[tuple[str, int], list[float]] = {}
    load_start = os.getloadavg()[0]
    for _ in range(max(args.processes, 1)):  # interleaved: a slow spell of the machine hits every cell alike
        for threads in thread_counts:
            for impl in IMPLEMENTATIONS:
                s = _spawn(impl, threads, args.rounds)["seconds_per_round"]
                seconds.setdefault((impl, threads), []).append(s)
                print(f"  {impl:8s} threads={threads}: {s:.4f} s/round", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in seconds.items()}

    def cell(key: tuple[str, int]) -> str:
        return f"{med[key]:.4f} ({min(seconds[key]):.4f}–{max(seconds[key]):.4f})"

    best_loop = min(thread_counts, key=lambda t: med[("loop", t)])
    ratio = med[("trustfl", default)] / med[("loop", best_loop)]
    command = " ".join([".venv/bin/python", "benchmarks/fedsc_speed.py", *sys.argv[1:]])
    lines = [f"`{command}`", "", "# Cost of one FedSC round", "",
             f"{CONFIG.relative_to(ROOT)}: 10 clients, full participation, 5 local epochs of B = 64 with 2 views, "
             "SGD with momentum and weight decay, DP-CalR (5 views per sample) every round. trustfl: the sync engine, "
             "the clients vectorized. Loop: `fedsc.loop_round`, the clients one after another with an nn.Module and "
             f"torch.optim.SGD, the same work. {os.cpu_count()} CPUs (torch's default: {default} threads); each cell "
             f"ran in {args.processes} fresh processes, interleaved, each the median of {args.rounds} rounds after 2 "
             f"warm-up rounds (wall clock), with the allocator setting of trustfl runs in both; median (min–max) "
             f"over processes. 1-minute load average {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the "
             "end.", "",
             "| torch threads | trustfl s / round | loop s / round | trustfl / loop |", "|---|---|---|---|"]
    for t in thread_counts:
        lines.append(f"| {t} | {cell(('trustfl', t))} | {cell(('loop', t))} | "
                     f"{med[('trustfl', t)] / med[('loop', t)]:.2f} |")
    lines += ["", f"Acceptance (trustfl at torch's default {default} threads against the loop at its faster setting, "
              f"{best_loop} thread(s); target ≤ {TARGET}): **{ratio:.2f}**, "
              f"{'met' if ratio <= TARGET else 'NOT met'}.", ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
