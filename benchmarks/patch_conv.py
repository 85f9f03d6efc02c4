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

A second table times how a one-channel input's patches are copied (``cnn_cafcor``'s first convolution): a kernel
row at a time, as trustfl does, against the single 6-D strided copy it made before 2026-12-07 (:func:`one_copy`,
the same values), the whole step paired as above.

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


def one_copy(layer, a):
    """``patch_conv.patches`` of an unpadded, undilated convolution as one 6-D strided copy from the channels-last
    input, whatever its channels (trustfl before 2026-12-07)."""
    (kh, kw), (sh, sw) = layer.kernel_size, layer.stride
    assert not any(layer.padding) and layer.dilation == (1, 1)  # cnn_cafcor's convolutions
    windows = a.permute(0, 2, 3, 1).unfold(1, kh, sh).unfold(2, kw, sw)  # (N, H_out, W_out, C, k_h, k_w) view
    n, ho, wo = windows.shape[:3]
    return windows.permute(0, 1, 2, 4, 5, 3).reshape(n, ho * wo, -1)


def paired(first, second, repeats: int) -> tuple[float, float, float, float, float]:
    """Medians of ``repeats`` back-to-back timings of ``first()`` and ``second()`` (s), and the median and quartiles of
    their paired ratios first / second."""
    for _ in range(3):
        first(), second()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((first, times[0]), (second, times[1])):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    ratios = sorted(a / b for a, b in zip(*times))
    q = statistics.quantiles(ratios, n=4)
    return statistics.median(times[0]), statistics.median(times[1]), statistics.median(ratios), q[0], q[2]


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
        on_t, off_t, med, lo, hi = paired(lambda: step(True), lambda: step(False),
                                          args.repeats if m == 1 else max(args.repeats // 4, 3))
        rows.append((model + (", every convolution by patches (forced)" if forced else ""), batch, m,
                     off_t, on_t, med, lo, hi, diff))
        print(f"  {model} batch {batch} cohort {m}: {med:.3f}", file=sys.stderr, flush=True)

    by_rows, copy_rows = patch_conv.patches, []
    for m in (1, 10):
        step = setting("cnn_cafcor", 64, m)

        def copied(patches, step=step):
            patch_conv.patches = patches
            try:
                return step(True)
            finally:
                patch_conv.patches = by_rows
        same = all(torch.equal(a, b) for a, b in zip(step(True, noise=False).values(),
                                                      _with(patch_conv, one_copy, lambda: step(True, noise=False))))
        copy_rows.append((m, *paired(lambda: copied(by_rows), lambda: copied(one_copy),
                                     args.repeats if m == 1 else max(args.repeats // 4, 3)), same))
        print(f"  one-channel copy, cohort {m}: {copy_rows[-1][3]:.3f}", file=sys.stderr, flush=True)

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
    lines += ["", "One-channel patches (`cnn_cafcor`'s first convolution): copied a kernel row at a time (trustfl) "
              "against one 6-D strided copy (before 2026-12-07), the whole `cnn_cafcor` step as above.", "",
              "| cohort | one copy ms | by rows ms | by rows / one copy | clipped sums bitwise equal |",
              "|---|---|---|---|---|"]
    for m, rows_t, one_t, med, lo, hi, same in copy_rows:
        lines.append(f"| {m} | {1e3 * one_t:.2f} | {1e3 * rows_t:.2f} | {med:.3f} ({lo:.3f}–{hi:.3f}) | "
                     f"{'yes' if same else 'NO'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


def _with(module, patches, fn):
    """``fn()`` with ``module.patches`` replaced by ``patches`` for the call; its result's values."""
    kept = module.patches
    module.patches = patches
    try:
        return list(fn().values())
    finally:
        module.patches = kept


if __name__ == "__main__":
    main()
