"""The CPU a speed record was measured on, named in the record's header.

The ratios of the speed records depend on the processor, not only on the core count: the same FedSC round measured
0.61x the per-client loop on one 2-core machine and 0.39x on another (benchmarks/README.md, "The acceptance
measurements on a second CPU"), so every such record says which CPU it ran on. Run as a script, it also measures
the matrix-product rates that bound those ratios, for comparing two machines: one client's product (the per-client
loop's), the same product batched over 100 clients (the vectorized executor's), and a large sgemm.

Run: ``.venv/bin/python benchmarks/cpu_info.py [--out FILE]``
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path


def cpus() -> str:
    """``"2 CPUs (AMD EPYC, AVX2)"``: the logical CPU count, the model name and the widest vector extension."""
    name, flags = platform.processor() or "unknown model", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() == "flags":  # after "model name" in each processor's block
                    flags = set(value.split())
                    break
    except OSError:  # not Linux: the model from platform alone
        pass
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2" if flags else "ISA unknown"
    return f"{os.cpu_count()} CPUs ({name}, {isa})"


def _seconds(f, repeats: int) -> float:
    """Best of 5 runs of ``repeats`` calls, per call."""
    for _ in range(3):
        f()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            f()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best


def products_table() -> list[str]:
    """GFLOP/s of the FedAvg MLP's first-layer products, one client at a time and batched, at 1 and 2 threads."""
    import torch
    gen = torch.Generator().manual_seed(0)
    clients, batch, d_in, d_out = 100, 32, 784, 200
    x, w = torch.randn(batch, d_in, generator=gen), torch.randn(d_in, d_out, generator=gen)
    g = torch.randn(batch, d_out, generator=gen)
    xs, ws = torch.randn(clients, batch, d_in, generator=gen), torch.randn(clients, d_in, d_out, generator=gen)
    gs = torch.randn(clients, batch, d_out, generator=gen)
    big = torch.randn(2048, 2048, generator=gen)
    flop = 2 * batch * d_in * d_out
    lines = ["| torch threads | sgemm 2048² | one client (32×784)·(784×200) | 100 clients batched (bmm) | "
             "one client's weight gradient (784×32)·(32×200) | batched weight gradient |",
             "|---|---|---|---|---|---|"]
    for threads in (1, 2):
        torch.set_num_threads(threads)
        rates = [2 * 2048**3 / _seconds(lambda: big @ big, 3),
                 flop / _seconds(lambda: x @ w, 200), clients * flop / _seconds(lambda: torch.bmm(xs, ws), 5),
                 flop / _seconds(lambda: x.t() @ g, 200),
                 clients * flop / _seconds(lambda: torch.bmm(xs.transpose(1, 2), gs), 5)]
        lines.append(f"| {threads} | " + " | ".join(f"{r / 1e9:.0f}" for r in rates) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the record (markdown) to this file")
    args = parser.parse_args()
    import torch
    command = " ".join([".venv/bin/python", "benchmarks/cpu_info.py"] + sys.argv[1:])
    text = "\n".join([f"`{command}`", "", "# Matrix-product rates on this CPU (GFLOP/s)", "",
                      f"{cpus()}, torch {torch.__version__}; 1-minute load average {os.getloadavg()[0]:.2f}; best "
                      "of 5 timed runs, float32.", ""] + products_table()) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
