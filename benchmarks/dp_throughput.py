"""DP-SGD gradient throughput: trustfl (ghost, vmap) vs Opacus 1.6 (hooks, ghost), one client and a cohort of 10.

One step = per-example gradients + per-example clipping (C) + Gaussian noise (σ·C) on the clipped sum, divided by
the expected batch size, for every client of the cohort. trustfl computes all clients in one vectorized call;
Opacus has no cohort vectorization, so its cohort step loops over one GradSampleModule/DPOptimizer per client.
Throughput is samples per second of CPU time by default (``--clock wall``: of wall time): cohort size × batch / step
time, best of ``--repeats`` interleaved timed runs.

Peak memory per row and method: each (model, cohort, method) also runs 3 steps in a process of its own, which reports
the rise of its peak resident memory over what it held before its first step (VmHWM, reset through
``/proc/self/clear_refs`` after the set-up): the memory one step of that method needs (``--no-memory`` skips it).

Products per step: one step of each ghost method also runs under torch's FLOP counter, which counts the matrix
products and convolutions (trustfl: one forward, one backward without weight gradients, the per-example terms and
the clipped sum; Opacus ghost: one forward and two full backward passes). Their ratio is the speed-up the two would
show if both ran their products at the same FLOP/s; the record puts it beside the measured one.

Bounds: ``lean`` (:func:`mlp_lean`, :func:`cnn_lean`), the whole step as straight-line code without checks or
generality, and (MLP rows) ``floor`` (:func:`mlp_floor`), the step's two large products and its noise alone, timed in
the same interleaved runs. The floor bounds what any implementation could reach against Opacus on this machine; the
lean step shows what the computation costs without a library around it.

Also checks, on the same parameters and batch:
  * trustfl-ghost's clipped noisy gradient equals the materialised reference (one-client vmap per-example
    gradients, clipped and summed in plain torch) with the same seeds, max |diff| <= 1e-5;
  * trustfl's noise-free clipped mean equals Opacus-ghost's (σ = 0);
  * the lean step's noise-free result equals trustfl's (unpadded clients).

Opacus is a benchmark-only peer, never a runtime dependency; install it beside the project's torch with
  .venv/bin/pip install -c constraints.txt opacus==1.6.0

Run from the repository root (the record in benchmarks/dp_throughput.md is written by):
  .venv/bin/python benchmarks/dp_throughput.py --out benchmarks/dp_throughput.md
Defaults: one torch thread, CPU-time clock (``time.process_time``), and glibc's allocator tuned at start-up with
``mallopt(M_MMAP_MAX, 0)`` + ``mallopt(M_TRIM_THRESHOLD, 1 GiB)`` (big buffers come from the heap and stay mapped
instead of page-faulting on every step). On a shared 2-core machine wall-clock timings with two threads swing by 10x
with other processes' load; CPU time with one thread is steady. For wall-clock figures on an idle machine:
  .venv/bin/python benchmarks/dp_throughput.py --threads 0 --clock wall
Allocator comparison: ``--malloc default`` (glibc defaults) or ``--malloc mmap0`` (M_MMAP_MAX only).
OpenMP: by default the process gets the ``GOMP_SPINCOUNT`` the ``trustfl`` command sets (``trustfl.core.openmp``),
Opacus alike; ``--gomp-spincount default`` leaves libgomp's own.

On a GPU (``--device cuda``, record benchmarks/dp_throughput_cuda.md): models, data, parameters and every generator
on the device, the clock is the wall clock read after ``torch.cuda.synchronize()`` (every step synchronises, both
libraries alike), and the peak memory of a step is the rise of ``torch.cuda.max_memory_allocated`` over what was
allocated before it, measured in this process:
  python benchmarks/dp_throughput.py --device cuda --threads 0 --out benchmarks/dp_throughput_cuda.md
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

from cpu_info import cpus

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4


def apply_malloc(mode: str) -> str:
    """glibc allocator tuning: big buffers from the heap instead of fresh (page-faulting) mmaps."""
    if mode == "default":
        return "glibc defaults"
    libc = ctypes.CDLL("libc.so.6")
    ok = libc.mallopt(M_MMAP_MAX, 0)
    if mode == "mmap0+notrim":
        ok &= libc.mallopt(M_TRIM_THRESHOLD, 2**30)
    return f"mallopt {mode} ({'ok' if ok else 'FAILED'})"


def apply_spin(mode: str) -> str:
    """libgomp's idle spin (read when torch loads it, so before ``import torch``): ``trustfl`` sets what the
    ``trustfl`` command sets (:func:`trustfl.core.openmp.limit_openmp_spin`, unless the environment has it),
    ``default`` leaves libgomp's default, a number sets that many iterations. It applies to both libraries."""
    if mode == "default":
        os.environ.pop("GOMP_SPINCOUNT", None)
        return "libgomp's default spin"
    if mode == "trustfl":
        from trustfl.core.openmp import limit_openmp_spin
        return f"as the trustfl command: {limit_openmp_spin()}"
    os.environ["GOMP_SPINCOUNT"] = count = str(int(mode))
    return f"GOMP_SPINCOUNT={count}"


def spin_mode(text: str) -> str:
    """``--gomp-spincount``'s value: ``trustfl``, ``default`` or a non-negative integer."""
    if text in ("trustfl", "default") or text.isdigit():
        return text
    raise argparse.ArgumentTypeError(f"trustfl, default or a non-negative integer expected, found {text!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--malloc", choices=["default", "mmap0", "mmap0+notrim"], default="mmap0+notrim")
    parser.add_argument("--gomp-spincount", type=spin_mode, default="trustfl",
                        help="trustfl (what the trustfl command sets, default), default (libgomp's) or a number")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timed runs per method (best kept)")
    parser.add_argument("--min-time", type=float, default=0.5, help="seconds per timed run")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="cpu",
                        help="wall: time.perf_counter; cpu: time.process_time (CPU seconds of this process, all "
                             "threads; steadier on a shared machine, use with --threads 1)")
    parser.add_argument("--cohorts", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--out", help="also write the record (markdown) to this file")
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn_cafcor"], choices=["mlp", "cnn_cafcor"])
    parser.add_argument("--no-memory", action="store_true", help="skip the per-method peak-memory processes")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:k] (implies --clock wall)")
    parser.add_argument("--memory-worker", nargs=3, metavar=("MODEL", "COHORT", "METHOD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    settings_note = apply_malloc(args.malloc) + ", " + apply_spin(args.gomp_spincount)  # before torch loads
    load_start = os.getloadavg()[0]

    import torch
    import torch.nn.functional as F
    import opacus
    from opacus import GradSampleModule
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    from trustfl.client.per_example import clip_factors, clipped_grad_sum, noisy_clipped_mean, per_example_grads
    from trustfl.core.rng import make_generator
    from trustfl.models import build_model

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device on this machine")
    if device.type == "cuda":
        args.clock = "wall"
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    warnings.filterwarnings("ignore", module="opacus")
    warnings.filterwarnings("ignore", message=".*full backward hook.*")
    sigma, clip = 1.0, 1.0
    setups = [("mlp 784-256-10", "mlp", (784,), 256, {"hidden": (256,)}),
              ("cnn_cafcor", "cnn_cafcor", (1, 28, 28), 64, {})]

    clock = time.perf_counter if args.clock == "wall" else time.process_time

    def timed(steps: dict[str, Callable[[], object]]) -> dict[str, list[float]]:
        """Seconds per step of each method in each of the ``--repeats`` timed runs; methods interleave so that load
        changes hit them alike."""
        for step in steps.values():
            for _ in range(2):
                step()
        runs: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(args.repeats):
            for name, step in steps.items():
                sync()
                n, start = 0, clock()
                while True:
                    step()
                    sync()  # on a GPU, the step's kernels have run before the clock is read
                    n += 1
                    elapsed = clock() - start
                    if elapsed >= args.min_time:
                        break
                runs[name].append(elapsed / n)
        return runs

    def cohort(name: str, shape: tuple[int, ...], batch: int, m: int, kw: dict):
        nets = [build_model(name, shape, 10, seed=100 + i, **kw).to(device) for i in range(m)]
        stacked = {k: torch.stack([dict(n.named_parameters())[k].detach() for n in nets])
                   for k, _ in nets[0].named_parameters()}
        gen = torch.Generator().manual_seed(m)  # the same data on every device
        x = torch.randn(m, batch, *shape, generator=gen).to(device)
        y = torch.randint(0, 10, (m, batch), generator=gen).to(device)
        return nets, stacked, x, y

    def opacus_client(net: torch.nn.Module, batch: int, mode: str, noise: float):
        if mode == "hooks":
            gsm = GradSampleModule(net, batch_first=True, loss_reduction="mean")
            opt = DPOptimizer(torch.optim.SGD(gsm.parameters(), lr=0.0), noise_multiplier=noise,
                              max_grad_norm=clip, expected_batch_size=batch, loss_reduction="mean")
            loss_fn = F.cross_entropy
        else:
            gsm = GradSampleModuleFastGradientClipping(net, batch_first=True, loss_reduction="mean",
                                                       max_grad_norm=clip, use_ghost_clipping=True)
            opt = DPOptimizerFastGradientClipping(torch.optim.SGD(gsm.parameters(), lr=0.0), noise_multiplier=noise,
                                                  max_grad_norm=clip, expected_batch_size=batch,
                                                  loss_reduction="mean")
            loss_fn = DPLossFastGradientClipping(gsm, opt, torch.nn.CrossEntropyLoss(), loss_reduction="mean")

        def step(xi: torch.Tensor, yi: torch.Tensor) -> None:
            opt.zero_grad(set_to_none=True)
            loss_fn(gsm(xi), yi).backward()
            opt.pre_step()  # clip + noise + scale; the SGD update itself is not part of the measurement
        return gsm, step

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {settings_note}, σ={sigma}, C={clip}, "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    rows, checks = [], []
    for label, name, shape, batch, kw in [s for s in setups if s[1] in args.models]:
        for m in args.cohorts:
            nets, stacked, x, y = cohort(name, shape, batch, m, kw)
            mask = torch.ones(m, batch, device=device)
            gens = [make_generator(0, "bench", i, device=device) for i in range(m)]

            def trustfl_step(method: str) -> Callable[[], object]:
                def step() -> object:
                    sums, _ = clipped_grad_sum(nets[0], stacked, {"x": x, "y": y}, mask, clip, method=method)
                    return noisy_clipped_mean(sums, sigma, clip, float(batch), gens)
                return step

            steps = {"trustfl ghost": trustfl_step("ghost"), "trustfl vmap": trustfl_step("vmap")}
            if name == "mlp":
                steps["lean"] = mlp_lean(stacked, x, y, gens, sigma, clip)
                steps["floor"] = mlp_floor(stacked, x, gens)
            else:
                steps["lean"] = cnn_lean(stacked, x, y, gens, sigma, clip)
            for mode in ("hooks", "ghost"):
                clients = [opacus_client(build_model(name, shape, 10, seed=100 + i, **kw).to(device), batch, mode,
                                         sigma) for i in range(m)]

                def opacus_step(clients=clients) -> None:
                    for i, (_, step) in enumerate(clients):
                        step(x[i], y[i])
                steps[f"opacus {mode}"] = opacus_step
            if args.memory_worker:
                if [name, str(m)] == args.memory_worker[:2]:
                    print(json.dumps({"peak_mb": step_peak_mb(steps[args.memory_worker[2]])}))
                    return
                continue
            runs = timed(steps)
            rate = {k: m * batch / min(t) for k, t in runs.items()}
            paired = sorted(o / t for o, t in zip(runs["opacus ghost"], runs["trustfl ghost"]))
            rate["paired"] = (statistics.median(paired), paired[0], paired[-1])  # type: ignore[assignment]
            flops = {k: step_gflop(steps[k]) for k in ("trustfl ghost", "opacus ghost")}
            methods = [k for k in steps if k not in ("lean", "floor")]  # the bounds are not methods
            if args.no_memory:
                peaks = {}
            elif device.type == "cuda":  # the caching allocator counts every byte: no process of its own needed
                peaks = {k: cuda_step_peak_mb(steps[k]) for k in methods}
            else:
                peaks = {k: memory_worker(name, m, k, args) for k in methods}
            rows.append((label, batch, m, rate, peaks, flops))
            print(f"  measured {label} batch {batch} cohort {m}", flush=True)

        if args.memory_worker:
            continue
        # Equality checks on a cohort of 3 clients with one padded example.
        nets, stacked, x, y = cohort(name, shape, batch, 3, kw)
        mask = torch.ones(3, batch, device=device)
        mask[1, -1] = 0
        sums, _ = clipped_grad_sum(nets[0], stacked, {"x": x, "y": y}, mask, clip, method="ghost")
        ref = {k: torch.zeros_like(v) for k, v in stacked.items()}
        for i in range(3):  # materialised reference, one client at a time
            pe = per_example_grads(nets[0], {k: v[i] for k, v in stacked.items()}, {"x": x[i], "y": y[i]})
            norms = sum(g.flatten(1).square().sum(-1) for g in pe.values()).sqrt()
            coef = clip_factors(norms, clip) * mask[i]
            for k, g in pe.items():
                ref[k][i] = torch.einsum("b...,b->...", g, coef)
        noisy = noisy_clipped_mean(sums, sigma, clip, float(batch),
                                   [make_generator(1, i, device=device) for i in range(3)])
        noisy_ref = noisy_clipped_mean(ref, sigma, clip, float(batch),
                                       [make_generator(1, i, device=device) for i in range(3)])
        diff_ref = max((noisy[k] - noisy_ref[k]).abs().max().item() for k in noisy)
        clean = noisy_clipped_mean(sums, 0.0, clip, float(batch), [None] * 3)  # type: ignore[list-item]
        gsm, step = opacus_client(build_model(name, shape, 10, seed=100, **kw).to(device), batch, "ghost", 0.0)
        step(x[0], y[0])
        diff_opacus = max((clean[k][0] - p.grad).abs().max().item() for k, p in gsm._module.named_parameters())
        diff_lean = None
        # the lean step on the clients without padding, noise-free, against trustfl's
        full = torch.ones(3, batch, device=device)
        want = noisy_clipped_mean(clipped_grad_sum(nets[0], stacked, {"x": x, "y": y}, full, clip)[0], 0.0,
                                  clip, float(batch), [None] * 3)  # type: ignore[list-item]
        lean = (mlp_lean if name == "mlp" else cnn_lean)(stacked, x, y, [None] * 3, 0.0, clip)()
        diff_lean = max((lean[k] - want[k]).abs().max().item() for k in want)
        checks.append((label, diff_ref, diff_opacus, diff_lean))

    unit = "samples/s" if args.clock == "wall" else "samples per CPU-second"
    where = "on the CPU" if device.type != "cuda" else (f"on {torch.cuda.get_device_name(device)} (every step "
                                                        f"synchronised; step peak MB: CUDA memory allocated)")
    lines = [f"`{' '.join(['.venv/bin/python', 'benchmarks/dp_throughput.py'] + sys.argv[1:])}`", "",
             "# DP-SGD throughput: trustfl vs Opacus", "",
             f"torch {torch.__version__}, Opacus {opacus.__version__}, {torch.get_num_threads()} torch thread(s), "
             f"{settings_note}, σ = {sigma}, C = {clip}; {unit}, best of {args.repeats} interleaved runs of >= "
             f"{args.min_time} s; {where}; {cpus()}, load average {load_start:.2f} at the start and "
             f"{os.getloadavg()[0]:.2f} at the end. Opacus has no cohort vectorization, so its cohort loops over "
             "the clients. The ratios divide the best runs' throughputs; *per run* gives the median (min–max) of "
             "the ratios within each interleaved run, which a change of the machine's speed between runs moves "
             "less.", "",
             "| model | batch | cohort | trustfl ghost | trustfl vmap | Opacus hooks | Opacus ghost | "
             "tf-ghost / op-ghost | per run | tf-ghost / op-hooks | step peak MB: tf-ghost / tf-vmap / op-hooks / "
             "op-ghost |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    per = "second" if args.clock == "wall" else "CPU-second"
    flop_lines = ["", "## Products per step: the ratio the two ghost methods would have at equal FLOP/s", "",
                  "GFLOP of one step's matrix products and convolutions (`torch.utils.flop_counter.FlopCounterMode`; "
                  "element-wise work such as pooling, activations and noise is not counted), and the rate each "
                  f"method reached in the timed runs above (GFLOP per {per}).", "",
                  "| model | batch | cohort | GFLOP/step tf-ghost | GFLOP/step op-ghost | op / tf (ratio at equal "
                  "FLOP/s) | measured tf-ghost / op-ghost | GFLOP/s tf-ghost | GFLOP/s op-ghost |",
                  "|---|---|---|---|---|---|---|---|---|"]
    for label, batch, m, r, peaks, flops in rows:
        tf_f, op_f = flops["trustfl ghost"], flops["opacus ghost"]
        tf_rate, op_rate = tf_f * r["trustfl ghost"] / (m * batch), op_f * r["opacus ghost"] / (m * batch)
        flop_lines.append(f"| {label} | {batch} | {m} | {tf_f:.3f} | {op_f:.3f} | {op_f / tf_f:.2f}× | "
                          f"{r['trustfl ghost'] / r['opacus ghost']:.2f}× | {tf_rate:.0f} | {op_rate:.0f} |")
    for label, batch, m, r, peaks, _ in rows:
        peak = " / ".join(f"{peaks[k]:.0f}" if peaks.get(k) is not None else "—" for k in
                          ("trustfl ghost", "trustfl vmap", "opacus hooks", "opacus ghost"))
        lines.append(f"| {label} | {batch} | {m} | {r['trustfl ghost']:.0f} | {r['trustfl vmap']:.0f} | "
                     f"{r['opacus hooks']:.0f} | {r['opacus ghost']:.0f} | "
                     f"{r['trustfl ghost'] / r['opacus ghost']:.2f}× | {r['paired'][0]:.2f}× ({r['paired'][1]:.2f}–"
                     f"{r['paired'][2]:.2f}) | {r['trustfl ghost'] / r['opacus hooks']:.2f}× | {peak} |")
    lines += flop_lines
    bounds = [(label, batch, m, r) for label, batch, m, r, _, _ in rows if "lean" in r]
    if bounds:
        lines += ["", "## Bounds: the lean step and the floor", "",
                  "Timed in the same interleaved runs. **lean**: the whole step as straight-line code written in the "
                  "benchmark, without checks or generality (its noise-free result is checked against trustfl's "
                  "below): `mlp_lean` for the MLP (a cohort's clients in batched products), `cnn_lean` for "
                  "`cnn_cafcor`, a client at a time (its convolutions' forward as one product over channels-last "
                  "patches, reused for the per-example weight gradients). **floor** (`mlp_floor`, MLP only): what "
                  "any exact ghost step has to do at the least, alone: each client's first-layer forward product and "
                  "clipped weight-gradient sum (the two 784×256×256 products; every other product is 40× smaller) and "
                  "the Gaussian noise of every parameter from the client's own generator (a cohort's clients drawn "
                  "on torch's threads, as trustfl draws them). The ratios divide their throughput by Opacus ghost's.",
                  "", "| model | batch | cohort | trustfl ghost / op-ghost | lean / op-ghost | floor / op-ghost |",
                  "|---|---|---|---|---|---|"]
        for label, batch, m, r in bounds:
            lines.append(f"| {label} | {batch} | {m} | " + " | ".join(
                f"{r[k] / r['opacus ghost']:.2f}×" if k in r else "—" for k in ("trustfl ghost", "lean", "floor"))
                + " |")
    lines += ["", "Equality (float32, 3 clients, one padded example):", ""]
    for label, diff_ref, diff_opacus, diff_lean in checks:
        verdict = "OK" if diff_ref <= 1e-5 else "FAIL"
        lean = "" if diff_lean is None else (f"; the lean step vs trustfl, noise-free, unpadded: max|diff| = "
                                             f"{diff_lean:.2e} [{'OK' if diff_lean <= 1e-5 else 'FAIL'} <= 1e-5]")
        lines.append(f"- {label}: noisy ghost vs materialised reference, same seeds: max|diff| = {diff_ref:.2e} "
                     f"[{verdict} <= 1e-5]; noise-free vs Opacus ghost (client 0): max|diff| = {diff_opacus:.2e}"
                     f"{lean}")
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(text)


def mlp_floor(stacked: dict, x, gens: list) -> Callable[[], object]:
    """One MLP step's floor (see the record): the batched first-layer forward product and clipped weight-gradient
    sum of every client, and every parameter's noise drawn from each client's generator, into preallocated
    buffers."""
    import torch

    from trustfl.core.rng import normal_rows
    weight = stacked["net.0.weight"]  # (m, 256, 784)
    # stands in for the clipped output gradients
    grads = torch.randn(weight.shape[0], x.shape[1], weight.shape[1], device=x.device)
    hidden, weight_sum = torch.empty_like(grads), torch.empty_like(weight)
    noise = [torch.empty_like(v) for v in stacked.values()]

    def step() -> None:
        torch.bmm(x, weight.transpose(1, 2), out=hidden)
        torch.bmm(grads.transpose(1, 2), x, out=weight_sum)
        normal_rows(noise, gens)  # as trustfl draws it: each client's generator, the clients on torch's threads
    return step


def mlp_lean(stacked: dict, x, y, gens: list, sigma: float, clip: float) -> Callable[[], dict]:
    """The whole DP-SGD step of a one-hidden-layer MLP cohort as straight-line code, written here: no checks, no
    generality, the cross-entropy's output gradient in closed form (``softmax − one-hot``), the per-example norms
    ``‖h_b‖²‖g_b‖² + ‖g_b‖²`` of each layer, the clipped sums by one product a layer, the noise as trustfl draws it.
    What the computation costs without a library around it (its noise-free result is checked against trustfl's)."""
    import torch

    from trustfl.core.rng import normal_rows
    w1, b1, w2, b2 = (stacked[k] for k in ("net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"))
    m, batch = y.shape
    onehot = torch.nn.functional.one_hot(y, w2.shape[1]).to(x.dtype)

    def step() -> dict:
        h1 = torch.baddbmm(b1.unsqueeze(1), x, w1.transpose(1, 2)).relu_()
        g2 = torch.baddbmm(b2.unsqueeze(1), h1, w2.transpose(1, 2)).softmax(-1).sub_(onehot)
        g1 = torch.bmm(g2, w2).mul_(h1 > 0)
        n1, n2 = g1.square().sum(-1), g2.square().sum(-1)
        norms = (x.square().sum(-1).mul_(n1).add_(n1).add_(h1.square().sum(-1).mul_(n2)).add_(n2)).sqrt_()
        coef = (clip / (norms + 1e-6)).clamp_(max=1.0).unsqueeze(1)  # min(1, C / (‖g_b‖ + 1e-6))
        sums = {"net.0.weight": torch.bmm((g1 * coef.transpose(1, 2)).transpose(1, 2), x),
                "net.0.bias": torch.bmm(coef, g1).squeeze(1),
                "net.2.weight": torch.bmm((g2 * coef.transpose(1, 2)).transpose(1, 2), h1),
                "net.2.bias": torch.bmm(coef, g2).squeeze(1)}
        noise = [torch.empty_like(v) for v in sums.values()]
        normal_rows(noise, gens)
        return {k: z.mul_(sigma * clip / batch).add_(v, alpha=1.0 / batch) for (k, v), z in zip(sums.items(), noise)}
    return step


def cnn_lean(stacked: dict, x, y, gens: list, sigma: float, clip: float) -> Callable[[], dict]:
    """The whole DP-SGD step of ``cnn_cafcor`` as straight-line code, written here, a client at a time: the
    convolutions' forward as one product over channels-last patches (the patches' strided copy, then ``addmm``;
    no convolution kernel), the second convolution's input gradient by PyTorch's convolution backward, the max-pool
    forward and backward by PyTorch's kernels, the cross-entropy's output gradient in closed form (``softmax −
    one-hot``), the convolutions' per-example weight gradients as batched products over the patches the forward made,
    the fully connected layers' per-example norms ``‖a_b‖²‖g_b‖² + ‖g_b‖²``, the clipped sums by one product a
    parameter, the noise as trustfl draws it. What the computation costs without a library around it (its noise-free
    result is checked against trustfl's)."""
    import torch
    import torch.nn.functional as F

    from trustfl.core.rng import normal_rows
    m, batch = y.shape
    names = ("conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight", "fc1.bias", "fc2.weight",
             "fc2.bias")
    rows = torch.arange(batch, device=x.device)

    def patches(a: torch.Tensor, k: int) -> torch.Tensor:  # (N, C, H, W) channels-last -> (N, T, k·k·C), (kh, kw, C)
        n, c, h, w = a.shape
        s = a.stride()
        return a.as_strided((n, h - k + 1, w - k + 1, k, k, c), (s[0], s[2], s[3], s[2], s[3], s[1])).reshape(
            n, (h - k + 1) * (w - k + 1), k * k * c)

    def client(i: int) -> dict:
        w1, b1, w2, b2, wf1, bf1, wf2, bf2 = (stacked[k][i] for k in names)
        p1, p2 = w1.shape[0], w2.shape[0]
        w1c, w2c = w1.permute(0, 2, 3, 1).reshape(p1, -1), w2.permute(0, 2, 3, 1).reshape(p2, -1)
        cols1 = patches(x[i].contiguous(memory_format=torch.channels_last), 5)  # (B, 576, 25)
        side1 = x.shape[-1] - 4
        a1 = torch.addmm(b1, cols1.view(-1, cols1.shape[-1]), w1c.t()).relu_().view(
            batch, side1, side1, p1).permute(0, 3, 1, 2)  # NCHW shape, channels-last memory
        h1, i1 = F.max_pool2d_with_indices(a1, 2)
        cols2 = patches(h1.contiguous(memory_format=torch.channels_last), 5)  # (B, 64, 500)
        side2 = h1.shape[-1] - 4
        a2 = torch.addmm(b2, cols2.view(-1, cols2.shape[-1]), w2c.t()).relu_().view(
            batch, side2, side2, p2).permute(0, 3, 1, 2)
        h2, i2 = F.max_pool2d_with_indices(a2, 2)
        flat = h2.reshape(batch, -1)  # NCHW order, as the model's flatten
        h3 = torch.addmm(bf1, flat, wf1.t()).relu_()
        g4 = torch.addmm(bf2, h3, wf2.t()).softmax(-1)
        g4[rows, y[i]] -= 1.0  # each example's output gradient
        g3 = (g4 @ wf2).mul_(h3 > 0)
        gh2 = (g3 @ wf1).view(h2.shape).contiguous(memory_format=torch.channels_last)
        g2 = torch.ops.aten.max_pool2d_with_indices_backward(gh2, a2, [2, 2], [2, 2], [0, 0], [1, 1], False, i2)
        g2 = g2.mul_(a2 > 0)  # (B, P2, 8, 8), channels-last
        gh1 = torch.ops.aten.convolution_backward(g2, h1, w2, None, (1, 1), (0, 0), (1, 1), False, (0, 0), 1,
                                                  (True, False, False))[0]
        g1 = torch.ops.aten.max_pool2d_with_indices_backward(gh1, a1, [2, 2], [2, 2], [0, 0], [1, 1], False, i1)
        g1 = g1.mul_(a1 > 0)
        mg1, mg2 = g1.permute(0, 2, 3, 1).reshape(batch, -1, p1), g2.permute(0, 2, 3, 1).reshape(batch, -1, p2)
        pe1, pe2 = torch.bmm(mg1.transpose(1, 2), cols1), torch.bmm(mg2.transpose(1, 2), cols2)
        bias1, bias2 = mg1.sum(1), mg2.sum(1)
        n3, n4 = g3.square().sum(1), g4.square().sum(1)
        sq = sum(torch.linalg.vector_norm(t.flatten(1), dim=1).square() for t in (pe1, bias1, pe2, bias2))
        sq = sq + flat.square().sum(1).mul_(n3).add_(n3).add_(h3.square().sum(1).mul_(n4)).add_(n4)
        coef = (clip / (sq.sqrt_() + 1e-6)).clamp_(max=1.0)  # min(1, C / (‖g_b‖ + 1e-6))
        return {"conv1.weight": (coef @ pe1.view(batch, -1)).view(w1.shape[0], 5, 5, -1).permute(0, 3, 1, 2),
                "conv1.bias": coef @ bias1,
                "conv2.weight": (coef @ pe2.view(batch, -1)).view(w2.shape[0], 5, 5, -1).permute(0, 3, 1, 2),
                "conv2.bias": coef @ bias2, "fc1.weight": (g3 * coef[:, None]).t() @ flat, "fc1.bias": coef @ g3,
                "fc2.weight": (g4 * coef[:, None]).t() @ h3, "fc2.bias": coef @ g4}

    def step() -> dict:
        with torch.no_grad():
            per_client = [client(i) for i in range(m)]
            sums = {k: torch.stack([c[k] for c in per_client]) for k in names}
            noise = [torch.empty_like(v) for v in sums.values()]
            normal_rows(noise, gens)
            return {k: z.mul_(sigma * clip / batch).add_(v, alpha=1.0 / batch) for (k, v), z in zip(sums.items(),
                                                                                                      noise)}
    return step


def step_gflop(step: Callable[[], object]) -> float:
    """GFLOP of the matrix products and convolutions one call of ``step`` runs (torch's FLOP counter).

    torch's counter ignores ``groups`` in a convolution's weight gradient (it counts a grouped convolution backward as
    if every group saw every input), so trustfl's per-example convolution gradients, which the CPU computes as one
    convolution backward with the examples as groups, are counted in their other form (batched products of the
    unfolded matrices): the same arithmetic.
    """
    from torch.utils.flop_counter import FlopCounterMode

    from trustfl.client import ghost

    chosen = ghost._by_grouped_convolution
    ghost._by_grouped_convolution = lambda layer, g: False
    try:
        with FlopCounterMode(display=False) as counter:
            step()
    finally:
        ghost._by_grouped_convolution = chosen
    return counter.get_total_flops() / 1e9


def _proc_status_mb(field: str) -> float:
    return int(open("/proc/self/status").read().split(f"{field}:")[1].split()[0]) / 1024


def step_peak_mb(step: Callable[[], object], steps: int = 3) -> float:
    """The rise of this process's peak RSS over its current RSS during ``steps`` calls of ``step``."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:  # resets VmHWM to the current RSS
            fh.write("5")
    except OSError:
        pass
    before = _proc_status_mb("VmRSS")
    for _ in range(steps):
        step()
    return _proc_status_mb("VmHWM") - before


def cuda_step_peak_mb(step: Callable[[], object], steps: int = 3) -> float:
    """The rise of the CUDA memory allocated at its peak during ``steps`` calls of ``step`` over what was allocated
    before them."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def memory_worker(model: str, cohort: int, method: str, args: argparse.Namespace) -> float | None:
    """:func:`step_peak_mb` of one (model, cohort, method) in a fresh process with this run's settings."""
    cmd = [sys.executable, __file__, "--memory-worker", model, str(cohort), method, "--models", model,
           "--cohorts", str(cohort), "--malloc", args.malloc, "--threads", str(args.threads),
           "--gomp-spincount", args.gomp_spincount]
    out = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1])["peak_mb"] if out.returncode == 0 and lines else None


if __name__ == "__main__":
    main()
