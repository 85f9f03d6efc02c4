"""Benchmark: Robust-HDP's noise estimation (PCP) on synthetic DP updates, time and weight error vs the Oracle.

Synthetic round (the PCP decomposition of the paper's Alg. 3): n clients with the code's Dist6 ε list and batch list
cycled to n, N = 2400, K = 1, η = 1e-3, c = 3, z_i = compute_z(ε_i, N, b_i) (pinned below; ``--recompute-z``
recomputes them with trustfl.privacy.analysis.rhdp), σ_i² = K⌈N/b_i⌉η²p c² z_i²/b_i² (Eq. 3/7), rows
x_i = η⌈N/b_i⌉ g + N(0, σ_i²/p I_p) with ‖g‖ ≈ 1. The weight error is L1(w, w_oracle), w_oracle ∝ 1/σ_i² (Eq. 8).

Configurations: ``candes`` (the default: Candès μ, fixed, capped at ``--max-iter``), ``spectral`` (μ₀ = 1.25/‖M‖₂
with growth ρ = 1.1) and ``naive`` (σ̂_i² = ‖x_i‖², no PCP). Candès is run only for p <= ``--candes-max-p``
(its iteration count grows like √p). ``--svd-compare`` also times one Gram+eigh vs torch.linalg.svd at the
largest size.

Usage:
  python benchmarks/rpca.py --quick
  python benchmarks/rpca.py               # n ∈ {20, 60}, p ∈ {3e4, 1e5, 1e6}
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trustfl.aggregate.noise_aware import RobustHDP, oracle_weights, update_noise_variance  # noqa: E402
from trustfl.types import ParamLayout, RoundContext  # noqa: E402

BATCHES = [32, 64, 16, 32, 16, 16, 16, 32, 32, 64, 32, 64, 16, 128, 16, 64, 32, 64, 16, 16]
EPS_DIST6 = [0.5, 0.46, 0.39, 0.44, 0.21, 0.36, 0.19, 0.51, 1.12, 0.2, 0.49, 0.19, 0.19, 0.2, 0.2, 0.18, 0.61, 0.15,
             0.38, 0.53]
Z_DIST6 = [14.24, 21.85, 12.87, 16.15, 25.88, 13.93, 31.22, 13.97, 6.5, 56.34, 14.53, 62.44, 31.22, 79.67, 28.18,
           71.07, 11.72, 211.79, 13.21, 9.52]
CONFIGS = {
    "candes": {},
    "spectral": {"mu_rule": "spectral", "mu_growth": 1.1},
    "naive": {"estimator": "naive"},
}


def synthetic(n: int, p: int, z: list[float], seed: int = 0, lr: float = 1e-3, n_samples: int = 2400):
    g = torch.Generator().manual_seed(seed)
    zs = [z[i % len(z)] for i in range(n)]
    bs = [BATCHES[i % len(BATCHES)] for i in range(n)]
    var = update_noise_variance(zs, bs, n_samples, 1, lr, 3.0, p)
    steps = torch.tensor([math.ceil(n_samples / b) for b in bs], dtype=torch.float64)
    x = torch.randn(n, p, generator=g, dtype=torch.float64)
    x.mul_((var / p).sqrt()[:, None])
    x.add_(lr * steps[:, None] * (torch.randn(p, generator=g, dtype=torch.float64) / math.sqrt(p))[None, :])
    return x, var


def run_one(x: torch.Tensor, var: torch.Tensor, config: str, max_iter: int) -> dict:
    n = x.shape[0]
    agg = RobustHDP(per_client_metrics=True, max_iter=max_iter, **CONFIGS[config])
    ctx = RoundContext(round=0, seed=0, client_ids=tuple(range(n)), num_clients=n)
    wall, cpu = time.perf_counter(), time.process_time()
    out = agg.apply(x, agg.init(ParamLayout(("x",), ((x.shape[1],),))), ctx)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    w = torch.tensor([out.metrics[f"weight/{i}"] for i in range(n)], dtype=torch.float64)
    return {"iterations": int(out.metrics["iterations"]), "converged": bool(out.metrics["converged"]),
            "seconds": wall, "cpu": cpu, "l1": float((w - oracle_weights(var)).abs().sum())}


def svd_compare(n: int, p: int) -> str:
    a = torch.randn(n, p, dtype=torch.float64)
    t = time.perf_counter()
    torch.linalg.eigh(a @ a.T)
    gram = time.perf_counter() - t
    t = time.perf_counter()
    torch.linalg.svd(a, full_matrices=False)
    direct = time.perf_counter() - t
    return f"SVD of a {n}×{p} float64 matrix: Gram + eigh {gram:.2f} s, torch.linalg.svd {direct:.2f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="n = 20, p in {3e4, 1e5}")
    ap.add_argument("--clients", type=int, nargs="*", default=None)
    ap.add_argument("--params", type=float, nargs="*", default=None)
    ap.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--max-iter", type=int, default=1000)
    ap.add_argument("--candes-max-p", type=float, default=1e5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--recompute-z", action="store_true")
    ap.add_argument("--svd-compare", action="store_true")
    ap.add_argument("--out", default=None, help="also write the table to this Markdown file (e.g. "
                                                 "benchmarks/rpca_timing.md, which benchmarks/robust_hdp.md embeds)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    clients = args.clients or ([20] if args.quick else [20, 60])
    params = [int(p) for p in (args.params or ([3e4, 1e5] if args.quick else [3e4, 1e5, 1e6]))]
    z = Z_DIST6
    if args.recompute_z:
        from trustfl.privacy.analysis.rhdp import compute_z
        z = [compute_z(e, 2400, b) for e, b in zip(EPS_DIST6, BATCHES)]
    lines: list[str] = []

    def emit(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    emit(f"torch {torch.__version__}, {torch.get_num_threads()} threads, Dist6 cycled, max_iter {args.max_iter}\n")
    emit("| n | p | config | iterations | converged | wall s | CPU s | L1(w, w_oracle) |")
    emit("|---|---|---|---|---|---|---|---|")
    for n in clients:
        for p in params:
            x, var = synthetic(n, p, z)
            for config in args.configs:
                if config == "candes" and p > args.candes_max_p:
                    emit(f"| {n} | {p:.0e} | candes | skipped (p > {args.candes_max_p:.0e}) | | | | |")
                    continue
                r = run_one(x, var, config, args.max_iter)
                emit(f"| {n} | {p:.0e} | {config} | {r['iterations']} | {r['converged']} | {r['seconds']:.1f} | "
                     f"{r['cpu']:.1f} | {r['l1']:.4f} |")
            del x
    if args.svd_compare:
        emit("\n" + svd_compare(max(clients), max(params)))
    if args.out:
        command = "python benchmarks/rpca.py " + " ".join(sys.argv[1:])
        Path(args.out).write_text(f"Command: `{command}`\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
