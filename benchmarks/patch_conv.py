"""Convolutions by patches in the one-client ghost pass (``trustfl.client.patch_conv``) vs PyTorch's convolutions:
trustfl's ghost DP-SGD step (``clipped_grad_sum`` + ``noisy_clipped_mean``, σ = 1, C = 1) with and without them.

Rows: ``cnn_cafcor`` (batch 64: both convolutions by patches) for one client and a cohort of 10 (whose clients run a
ghost pass each, ``ghost.PASS_BUDGET``), and ``cnn_rhdp`` (batch 32: its padded convolutions keep PyTorch's, so the
two columns run the same code; a last row forces both of its convolutions by patches, which :func:`pays` refuses).
*off* puts PyTorch's convolutions back for the time of the call (``patch_conv.pays``
answers no). Milliseconds per step, medians over ``--repeats`` pairs run back to back in one process, and the median
(interquartile range) of the paired ratios, which a change of the machine's speed between pairs moves less. The last
column is the largest difference of the noise-free clipped sums relative to the largest entry (float rounding: the
products sum in another order than PyTorch's kernels).

Run: ``.venv/bin/python benchmarks/patch_conv.py [--threads 0] [--out benchmarks/<cpu>/patch_conv.md]``
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from cpu_info import cpus

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--repeats", type=int, default=40, help="pairs per row (the cohort row: a quarter)")
    parser.add_argument("--out", help="also write the record (markdown) to this file")
    args = parser.parse_args()

    import torch

    from trustfl.client import patch_conv
    from trustfl.client.per_example import clipped_grad_sum, noisy_clipped_mean
    from trustfl.core.rng import make_generator
    from trustfl.engine.allocator import tune_allocator
    from trustfl.models import build_model

    if args.threads:
        torch.set_num_threads(args.threads)
    malloc = tune_allocator()
    pays = patch_conv.pays

    def setting(model: str, batch: int, m: int, forced: bool = False):
        nets = [build_model(model, (1, 28, 28), 10, seed=100 + i) for i in range(m)]
        params = {k: torch.stack([dict(n.named_parameters())[k].detach() for n in nets])
                  for k, _ in nets[0].named_parameters()}
        gen = torch.Generator().manual_seed(m)
        data = {"x": torch.randn(m, batch, 1, 28, 28, generator=gen), "y": torch.randint(0, 10, (m, batch),
                                                                                          generator=gen)}
        mask, gens = torch.ones(m, batch), [make_generator(0, "bench", i) for i in range(m)]
        on = (lambda layer, x: True) if forced else pays

        def step(patches: bool, noise: bool = True):
            patch_conv.pays = on if patches else (lambda layer, x: False)
            try:
                sums, _ = clipped_grad_sum(nets[0], params, data, mask, 1.0)
                return noisy_clipped_mean(sums, 1.0, 1.0, float(batch), gens) if noise else sums
            finally:
                patch_conv.pays = pays
        return step

    rows = []
    for model, batch, m, forced in (("cnn_cafcor", 64, 1, False), ("cnn_cafcor", 64, 10, False),
                                    ("cnn_rhdp", 32, 1, False), ("cnn_rhdp", 32, 1, True)):
        step = setting(model, batch, m, forced)
        on, off = step(True, noise=False), step(False, noise=False)
        diff = max(float((on[k] - off[k]).abs().max() / off[k].abs().max()) for k in off)
        for _ in range(3):
            step(True), step(False)
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.repeats if m == 1 else max(args.repeats // 4, 3)):
            for patches in (True, False):
                start = time.perf_counter()
                step(patches)
                times[patches].append(time.perf_counter() - start)
        ratios = sorted(a / b for a, b in zip(times[True], times[False]))
        q = statistics.quantiles(ratios, n=4)
        rows.append((model + (", every convolution by patches (forced)" if forced else ""), batch, m,
                     statistics.median(times[False]), statistics.median(times[True]),
                     statistics.median(ratios), q[0], q[2], diff))
        print(f"  {model} batch {batch} cohort {m}: {statistics.median(ratios):.3f}", file=sys.stderr, flush=True)

    lines = [f"`{' '.join(['.venv/bin/python', 'benchmarks/patch_conv.py'] + sys.argv[1:])}`", "",
             "# Convolutions by patches in the one-client ghost pass", "",
             f"torch {torch.__version__}, {torch.get_num_threads()} torch thread(s), allocator setting "
             f"{'on' if malloc else 'off'}; {cpus()}. One ghost DP-SGD step (σ = 1, C = 1), ms: medians over the "
             "pairs; *on/off*: the median (interquartile range) of the paired ratios.", "",
             "| model | batch | cohort | off (PyTorch's convolutions) ms | on (patches) ms | on / off | max rel. "
             "diff of the clipped sums |", "|---|---|---|---|---|---|---|"]
    for model, batch, m, off_t, on_t, med, lo, hi, diff in rows:
        lines.append(f"| {model} | {batch} | {m} | {1e3 * off_t:.2f} | {1e3 * on_t:.2f} | {med:.3f} ({lo:.3f}–"
                     f"{hi:.3f}) | {diff:.1e} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
