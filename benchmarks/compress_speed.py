"""Encode + decode throughput of every compressor on one message of d = 431,080 coordinates (one torch thread).

Usage (from the repository root)::

    .venv/bin/python benchmarks/compress_speed.py                 # d = 431,080, 1 row, 30 repeats
    .venv/bin/python benchmarks/compress_speed.py --rows 8 --repeats 10
    .venv/bin/python benchmarks/compress_speed.py --no-mallopt    # glibc's default allocator settings

The message is ``x ~ N(0, 0.05²)`` (model-like weights) and the receiver's key ``x + N(0, 0.001²)``. Each
cell is the median over ``--repeats`` timed runs (after two warm-up runs) of the wall clock and of the thread's
CPU time (``time.thread_time``, which excludes time the thread waits for a core on a loaded machine). The
throughput is ``rows · d / (encode + decode)`` from the CPU-time medians. "bits/coord" is 8 × the bytes the
encoder produced / d, headers and padding included. The target is >= 50 M coordinates/s for the rotated
(paper-mode) lattice quantizer.

By default the script applies the allocator setting every trustfl run applies at start-up
(``trustfl.engine.allocator.tune_allocator``: large tensors stay on the heap instead of being mapped and
faulted in at every call); ``--no-mallopt`` measures glibc's defaults.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trustfl  # noqa: E402
from cpu_info import cpus  # noqa: E402

CASES: tuple[tuple[str, str, dict], ...] = (
    ("lattice paper b=14", "lattice", {"bits": 14, "step": 1e-4}),
    ("lattice paper b=8", "lattice", {"bits": 8, "step": 1e-3}),
    ("lattice code b=14", "lattice", {"bits": 14, "step": 1e-4, "mode": "code"}),
    ("qsgd s=7 (1 bucket)", "qsgd", {"levels": 7}),
    ("qsgd s=7 bucket=512", "qsgd", {"levels": 7, "bucket": 512}),
    ("qsgd_minmax k=16", "qsgd_minmax", {"levels": 16}),
    ("identity", "identity", {}),
)


def _time(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(median wall seconds, median thread CPU seconds) of ``fn`` after two warm-up calls."""
    fn()
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.thread_time()
        fn()
        cpu.append(time.thread_time() - c)
        wall.append(time.perf_counter() - w)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d", type=int, default=431_080)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-mallopt", action="store_true", help="keep glibc's default allocator settings")
    parser.add_argument("--out", help="also write the output (command, setting, table) to this Markdown file")
    args = parser.parse_args()
    lines: list[str] = []

    def emit(text: str) -> None:
        print(text, flush=True)
        lines.append(text)
    mallopt = False
    if not args.no_mallopt:
        from trustfl.engine.allocator import tune_allocator

        mallopt = tune_allocator()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.rows, args.d, generator=gen) * 0.05
    key = x + torch.randn(args.rows, args.d, generator=gen) * 1e-3

    emit("Command: `" + " ".join([".venv/bin/python", "benchmarks/compress_speed.py", *sys.argv[1:]]) + "`")
    emit(f"torch {torch.__version__}, {args.threads} thread(s), {cpus()}, "
          f"load average {os.getloadavg()[0]:.2f}, d = {args.d:,}, rows = {args.rows}, "
          f"median of {args.repeats}, allocator {'trustfl (mallopt)' if mallopt else 'glibc default'}\n")
    emit("| compressor | bits/coord | encode ms (wall / cpu) | decode ms (wall / cpu) | M coord/s (cpu) "
          "| M coord/s (wall) | failures | max abs error |")
    emit("|---|---|---|---|---|---|---|---|")
    for label, name, params in CASES:
        comp = trustfl.build("compressor", name, **params)
        k = key if comp.needs_key else None
        enc = comp.encode(x, gen, shared_seed=1)
        dec, failures = comp.decode(enc, k, shared_seed=1)
        ew, ec = _time(lambda: comp.encode(x, gen, shared_seed=1), args.repeats)
        dw, dc = _time(lambda: comp.decode(enc, k, shared_seed=1), args.repeats)
        n = args.rows * args.d
        emit(f"| {label} | {enc.bits_per_row() / args.d:.3f} | {ew * 1e3:.2f} / {ec * 1e3:.2f} "
              f"| {dw * 1e3:.2f} / {dc * 1e3:.2f} | {n / (ec + dc) / 1e6:.1f} | {n / (ew + dw) / 1e6:.1f} "
              f"| {int(failures.sum())} | {float((dec - x).abs().max()):.2e} |")

    if args.out:
        Path(args.out).write_text("# Compressor throughput\n\n" + "\n".join(lines) + "\n")

if __name__ == "__main__":
    main()
