"""Per-example convolution weight gradients, the two forms ghost clipping can use, timed on one device.

``client/ghost.py`` materialises a convolution's per-example weight gradients (when that is cheaper than the Gram form)
either as batched products of the unfolded matrices, ``G_bᵀ A_b`` (``products``), or as one convolution backward with
the examples as groups (``grouped``, ``torch.nn.grad.conv2d_weight``). ``ghost._by_grouped_convolution`` picks
``grouped`` on the CPU when each output channel has at least ``ghost.GROUPED_MIN_KERNEL`` weights; this benchmark is the
evidence, per geometry: the convolutions of cnn_cafcor and cnn_rhdp (64 and 32 examples, and a 10-client cohort of each)
and 3×3 convolutions of 3–64 channels. Each form's time includes what it needs beyond the layer's input and output
gradient (the unfolding for ``products``) and ends with the per-example squared norms, as in a DP-SGD step; best of
``--repeats`` interleaved runs.

Run: ``.venv/bin/python benchmarks/conv_grads.py [--device cpu|cuda] [--threads 1] [--out benchmarks/conv_grads.md]``
(on a GPU, ``--threads`` is ignored and the timings synchronise the device).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from cpu_info import cpus

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (label, examples, C_in, C_out, side, kernel, padding)
GEOMETRIES = [
    ("cnn_cafcor conv1", 64, 1, 20, 28, 5, 0), ("cnn_cafcor conv2", 64, 20, 50, 12, 5, 0),
    ("cnn_cafcor conv2, 10 clients", 640, 20, 50, 12, 5, 0),
    ("cnn_rhdp conv1", 32, 1, 16, 28, 5, 2), ("cnn_rhdp conv2", 32, 16, 32, 14, 5, 2),
    ("cnn_rhdp conv2, 10 clients", 320, 16, 32, 14, 5, 2),
    ("3×3, 3 → 32 channels, 32×32", 64, 3, 32, 32, 3, 1), ("3×3, 4 → 16, 16×16", 64, 4, 16, 16, 3, 1),
    ("3×3, 8 → 16, 16×16", 64, 8, 16, 16, 3, 1), ("3×3, 32 → 64, 16×16", 64, 32, 64, 16, 3, 1),
    ("3×3, 64 → 64, 8×8", 64, 64, 64, 8, 3, 1),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on the CPU (0: torch's default)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", help="also write the record (markdown) to this file")
    args = parser.parse_args()

    import torch

    from trustfl.client import ghost
    from trustfl.client.ghost import GhostLayer
    from trustfl.engine.allocator import tune_allocator

    tune_allocator()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def best_ms(steps: dict, calls: int) -> dict[str, float]:
        best = {k: float("inf") for k in steps}
        for step in steps.values():
            step()
        for _ in range(args.repeats):
            for name, step in steps.items():
                sync()
                start = time.perf_counter()
                for _ in range(calls):
                    step()
                sync()
                best[name] = min(best[name], (time.perf_counter() - start) / calls * 1e3)
        return best

    gen = torch.Generator(device=device).manual_seed(0)
    rows = []
    for label, n, c_in, c_out, side, k, pad in GEOMETRIES:
        a = torch.randn(n, c_in, side, side, generator=gen, device=device)
        out = side + 2 * pad - k + 1
        g = torch.randn(n, c_out, out, out, generator=gen, device=device)
        layer = GhostLayer("conv", "conv2d", "w", "b", (c_out, c_in, k, k), (k, k), padding=(pad, pad))

        def products() -> torch.Tensor:
            mat_a, mat_g = ghost.layer_matrices(layer, a, g)
            return (mat_g.transpose(1, 2) @ mat_a).flatten(1).square().sum(1)

        def grouped() -> torch.Tensor:
            return ghost._conv_per_example_grads(layer, a, g).reshape(n, -1).square().sum(1)

        diff = float(((products() - grouped()).abs() / products().abs()).max())
        times = best_ms({"products": products, "grouped": grouped}, max(2, int(2e8 // (n * c_out * c_in * k * k
                                                                                       * out * out))))
        chosen = "grouped" if ghost._by_grouped_convolution(layer, g) else "products"
        rows.append((label, n, c_in, c_out, out * out, times, chosen, diff))
        print(f"  {label}: products {times['products']:.3f} ms, grouped {times['grouped']:.3f} ms", file=sys.stderr)

    threads = f"{torch.get_num_threads()} thread(s)" if device.type == "cpu" else torch.cuda.get_device_name(device)
    lines = [f"`{' '.join(['.venv/bin/python', 'benchmarks/conv_grads.py'] + sys.argv[1:])}`", "",
             "# Per-example convolution weight gradients: batched products vs one grouped convolution backward", "",
             f"torch {torch.__version__}, device {device} ({threads}), {cpus()}, load average "
             f"{os.getloadavg()[0]:.2f}; ms per call (unfolding and per-example squared norms included), best of "
             f"{args.repeats} interleaved runs. `chosen`: the form `ghost._by_grouped_convolution` picks on this "
             "device.", "",
             "| convolution | examples | C_in | C_out | positions | products ms | grouped ms | products / grouped | "
             "chosen | max rel. diff of the norms |", "|---|---|---|---|---|---|---|---|---|---|"]
    for label, n, c_in, c_out, t, times, chosen, diff in rows:
        lines.append(f"| {label} | {n} | {c_in} | {c_out} | {t} | {times['products']:.3f} | {times['grouped']:.3f} "
                     f"| {times['products'] / times['grouped']:.2f}× | {chosen} | {diff:.1e} |")
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
