"""How fast can a FedAvg round of `make bench`'s setting be on this CPU? The matrix-product floor vs what runs.

Measures, in one process with torch's default threads and trustfl's allocator setting:

1. the machine's sgemm throughput (a 2048×2048 float32 product, median of 10);
2. one vectorized 100-client round of benchmarks/engine_throughput.py's setting (MNIST when present, else synthetic
   data of its shape) under ``torch.profiler``: its wall time, the self time of the batched products
   (``aten::bmm`` + ``aten::mm``) and their FLOPs from the shapes (2·m·n·k each), hence their GFLOP/s;
3. the plain per-client loop's round on the same clients (engine_throughput's ``_plain_round``), median of 3, with
   torch's default threads and with one thread; the faster of the two is the reference (on the project's VM the
   two-thread loop has a slow mode in some processes, about 1.5× its usual time, slower than one thread).

The floors are the round's product FLOPs at the throughput of one batched product of its shapes and at the large
sgemm's; floor / plain is the best ratio to the plain loop that an executor doing these products could reach,
ignoring everything else in a round (the profiler gives only the products' share: it slows the round itself).

Run: ``.venv/bin/python benchmarks/cpu_ceiling.py --out benchmarks/cpu_ceiling.md``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from engine_throughput import _plain_round, _setup  # noqa: E402
from trustfl.engine.allocator import tune_allocator  # noqa: E402
from trustfl.engine.sync import initial_state, run_round  # noqa: E402


def sgemm_gflops(n: int = 2048, repeats: int = 10) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * n ** 3 / statistics.median(times) / 1e9


def bmm_gflops(m: int = 100, b: int = 32, k: int = 784, n: int = 200, repeats: int = 20) -> float:
    """The first layer's batched product of a 100-client step, ``(m, b, k) @ (m, k, n)``."""
    x, w = torch.randn(m, b, k), torch.randn(m, k, n)
    for _ in range(3):
        torch.bmm(x, w)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.bmm(x, w)
        times.append(time.perf_counter() - start)
    return 2 * m * b * k * n / statistics.median(times) / 1e9


def product_flops(events) -> tuple[float, float]:
    """(self seconds, FLOPs) of the batched and plain matrix products among profiler events (shapes recorded)."""
    seconds = flops = 0.0
    for e in events:
        if e.name not in ("aten::bmm", "aten::mm") or not e.input_shapes or len(e.input_shapes) < 2:
            continue
        a, b = e.input_shapes[0], e.input_shapes[1]
        if e.name == "aten::bmm":
            flops += 2.0 * a[0] * a[1] * a[2] * b[2]
        else:
            flops += 2.0 * a[0] * a[1] * b[1]
        seconds += e.self_cpu_time_total / 1e6
    return seconds, flops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    args = parser.parse_args()
    tune_allocator()
    peak, batched = sgemm_gflops(), bmm_gflops()
    fed, source = _setup(100, True)
    state = initial_state(fed)
    state, _ = run_round(fed, state)  # warm-up
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        start = time.perf_counter()
        state, _ = run_round(fed, state)
        profiled = time.perf_counter() - start
    walls = []
    for _ in range(3):
        start = time.perf_counter()
        state, _ = run_round(fed, state)
        walls.append(time.perf_counter() - start)
    product_s, flops = product_flops(prof.events())
    cohort, threads = list(range(100)), torch.get_num_threads()
    plain_by_threads = {}
    for n in dict.fromkeys((threads, 1)):
        torch.set_num_threads(n)
        _plain_round(fed, state.params, cohort, 0)  # warm-up
        plain = []
        for r in range(3):
            start = time.perf_counter()
            _plain_round(fed, state.params, cohort, r + 1)
            plain.append(time.perf_counter() - start)
        plain_by_threads[n] = statistics.median(plain)
    torch.set_num_threads(threads)
    vec, pl = statistics.median(walls), min(plain_by_threads.values())
    floor, floor_bmm = flops / (peak * 1e9), flops / (batched * 1e9)
    share = product_s / profiled
    command = ".venv/bin/python benchmarks/cpu_ceiling.py" + (f" --out {args.out}" if args.out else "")
    text = "\n".join([
        f"`{command}`", "", "# The matrix-product floor of a 100-client FedAvg round on this CPU", "",
        f"{os.cpu_count()} CPUs, torch threads {threads} (the plain loop also 1), allocator setting on; "
        f"data: {source}; "
        "MLP 784-200-200-10, 100 clients x 600 examples, batch 32, one epoch (engine_throughput.py's setting).", "",
        "| quantity | value |", "|---|---|",
        f"| sgemm 2048², GFLOP/s | {peak:.0f} |",
        f"| vectorized round, s (median of 3) | {vec:.3f} |",
        "| plain loop round, s (median of 3; torch threads " + ", ".join(map(str, plain_by_threads)) + ") | "
        + ", ".join(f"{v:.3f}" for v in plain_by_threads.values()) + " |",
        f"| plain = the faster of those, s | {pl:.3f} |",
        f"| vectorized / plain | {vec / pl:.2f} |",
        f"| products' share of a round (torch.profiler, which slows the round {profiled / vec:.1f}x) | "
        f"{100 * share:.0f} % |",
        f"| products' GFLOP in a round; their GFLOP/s in the unprofiled round (share x round s) | "
        f"{flops / 1e9:.1f}; {flops / (share * vec) / 1e9:.0f} |",
        f"| bmm (100, 32, 784) @ (100, 784, 200), GFLOP/s | {batched:.0f} |",
        f"| floor = products at bmm speed, s; / plain | {floor_bmm:.3f}; {floor_bmm / pl:.2f} |",
        f"| floor = products at sgemm speed, s | {floor:.3f} |",
        f"| floor / plain (best reachable ratio) | {floor / pl:.2f} |", ""])
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
