"""Max-pooling on the CPU: ``F.max_pool2d`` (PyTorch's NCHW kernel) vs ``trustfl.models.pooling.max_pool2d``
(the channels-last kernel, the same bits), per pool of the zoo's CNNs and per whole step of those models.

Rows: each pool of ``cnn_cafcor`` (batch 64) and ``cnn_rhdp`` (batch 32), forward and backward; a training step of each
model (forward, cross-entropy, backward); a cohort's training step (``batched_mean_grad``: 10 clients' forward under
``vmap``, as the engine runs a cohort); an evaluation forward (no gradients); and trustfl's ghost DP-SGD step of one
client (``clipped_grad_sum`` and ``noisy_clipped_mean``, σ = 1, C = 1). The *torch* rows put PyTorch's pooling back
in the models for the time of the call. Milliseconds per call, best of ``--repeats`` interleaved runs; every pair is also
checked for equal bits.

Run: ``.venv/bin/python benchmarks/pooling_speed.py [--threads 0] [--out benchmarks/<cpu>/pooling_speed.md]``
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from cpu_info import cpus

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", help="also write the record (markdown) to this file")
    args = parser.parse_args()

    import torch
    import torch.nn.functional as F

    from trustfl.client.per_example import batched_mean_grad, clipped_grad_sum, noisy_clipped_mean
    from trustfl.core.rng import make_generator
    from trustfl.engine.allocator import tune_allocator
    from trustfl.models import build_model, pooling
    from trustfl.objectives.builtin import CrossEntropy

    tune_allocator()
    if args.threads:
        torch.set_num_threads(args.threads)
    fast, wrapped = pooling._fast, pooling._wrapped
    objective = CrossEntropy()

    def variant(use_trustfl: bool, fn):
        def call():
            if not use_trustfl:  # every tensor, plain or under vmap, takes PyTorch's pooling
                pooling._fast = pooling._wrapped = lambda _x: False
            try:
                return fn()
            finally:
                pooling._fast, pooling._wrapped = fast, wrapped
        return call

    def best_ms(pair: dict, seconds: float = 0.3) -> dict[str, float]:
        for f in pair.values():
            f()
        start, calls = time.perf_counter(), 0
        while time.perf_counter() - start < seconds / 3:
            pair["trustfl"]()
            calls += 1
        best = {k: float("inf") for k in pair}
        for _ in range(args.repeats):
            for name, f in pair.items():
                start = time.perf_counter()
                for _ in range(calls):
                    f()
                best[name] = min(best[name], (time.perf_counter() - start) / calls * 1e3)
        return best

    def tensors(r) -> list:
        if isinstance(r, torch.Tensor):
            return [r]
        return [t for v in (r.values() if isinstance(r, dict) else r) for t in tensors(v)]

    def same_bits(a, b) -> bool:
        return all(torch.equal(x, y) for x, y in zip(tensors(a), tensors(b)))

    rows = []
    gen = torch.Generator().manual_seed(0)
    for name, batch in (("cnn_cafcor", 64), ("cnn_rhdp", 32)):
        net = build_model(name, (1, 28, 28), 10, seed=0)
        x = torch.rand(batch, 1, 28, 28, generator=gen)
        x[:, :, :6] = 0.0  # a blank margin, as in MNIST: ties in the pools
        y = torch.randint(0, 10, (batch,), generator=gen)
        with torch.no_grad():
            first = torch.relu(net.conv1(x))
            second = torch.relu(net.conv2(F.max_pool2d(first, 2)))
        for label, a in ((f"{name} pool 1 {tuple(first.shape)}", first),
                         (f"{name} pool 2 {tuple(second.shape)}", second)):
            leaf = a.clone().requires_grad_(True)
            g = torch.randn(a.shape[0], a.shape[1], a.shape[2] // 2, a.shape[3] // 2, generator=gen)
            pair = {"torch": lambda: torch.autograd.grad(F.max_pool2d(leaf, 2), leaf, g)[0],
                    "trustfl": lambda: torch.autograd.grad(pooling.max_pool2d(leaf, 2), leaf, g)[0]}
            rows.append((f"{label}, forward + backward", best_ms(pair), same_bits(pair["torch"](), pair["trustfl"]())))

        def train_step():
            net.zero_grad(set_to_none=True)
            F.cross_entropy(net(x), y).backward()
            return {k: p.grad for k, p in net.named_parameters()}

        def evaluate():
            with torch.no_grad():
                return net(x)
        params = {k: v.detach().unsqueeze(0) for k, v in net.named_parameters()}
        mask = torch.ones(1, batch)

        def dp_step():
            sums, _ = clipped_grad_sum(net, params, {"x": x.unsqueeze(0), "y": y.unsqueeze(0)}, mask, 1.0)
            return noisy_clipped_mean(sums, 1.0, 1.0, float(batch), [make_generator(0, "bench", 0)])
        nets = [build_model(name, (1, 28, 28), 10, seed=s) for s in range(10)]
        stacked = {k: torch.stack([dict(n.named_parameters())[k].detach() for n in nets]) for k in params}
        cohort_batch = {"x": x.unsqueeze(0).expand(10, *x.shape).contiguous(), "y": y.expand(10, batch)}

        def cohort_step():
            return batched_mean_grad(net, objective, stacked, cohort_batch, torch.ones(10, batch), full=True)
        for label, fn in ((f"{name} training step, batch {batch}", train_step),
                          (f"{name} cohort training step (vmap), 10 clients × {batch}", cohort_step),
                          (f"{name} evaluation forward, batch {batch}", evaluate),
                          (f"{name} ghost DP-SGD step, one client × {batch}", dp_step)):
            pair = {"torch": variant(False, fn), "trustfl": variant(True, fn)}
            rows.append((label, best_ms(pair), same_bits(pair["torch"](), pair["trustfl"]())))
        for label, times, equal in rows[-6:]:
            print(f"  {label}: {times['torch']:.3f} → {times['trustfl']:.3f} ms, same bits {equal}", file=sys.stderr)

    lines = [f"`{' '.join(['.venv/bin/python', 'benchmarks/pooling_speed.py'] + sys.argv[1:])}`", "",
             "# Max-pooling on the CPU: PyTorch's NCHW kernel vs trustfl's channels-last forward", "",
             f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {cpus()}, load average "
             f"{os.getloadavg()[0]:.2f}; ms per call, best of {args.repeats} interleaved runs. *torch*: "
             "`F.max_pool2d` in the models; *trustfl*: `trustfl.models.pooling.max_pool2d`, as the zoo runs.", "",
             "| what | torch ms | trustfl ms | trustfl / torch | same bits |", "|---|---|---|---|---|"]
    for label, times, equal in rows:
        lines.append(f"| {label} | {times['torch']:.3f} | {times['trustfl']:.3f} | "
                     f"{times['trustfl'] / times['torch']:.2f}× | {'yes' if equal else 'NO'} |")
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(text)
    if not all(equal for _, _, equal in rows):
        sys.exit("some pair differs in its bits")


if __name__ == "__main__":
    main()
