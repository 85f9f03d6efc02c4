"""Engine throughput: FedAvg rounds of the vectorized and sequential executors vs a plain PyTorch loop.

Setting (issue #2): 100 clients × 600 samples × 784 features (MNIST when present, else synthetic data of that
shape), MLP 784-200-200-10, batch 32, one local epoch, cohorts of 10 and 100 clients. Every method trains the same
clients on the same batches; the plain loop is an ``nn.Module`` + ``torch.optim.SGD`` per client with no federated
machinery. Each (method, cohort) runs in its own process so that peak memory (max RSS) is its own; each process
is run with and without the allocator setting (``mallopt(M_MMAP_MAX, 0)``). ``--processes N`` repeats every such
process N times, the methods interleaved, and gives each cell's median and range over them: on the project's VM the
plain loop's round time moves by up to about 1.6× from one process to the next (two modes, about 0.08 and 0.12 s at 10
clients), which one process per cell cannot tell from a change.

Run: ``make bench`` or ``.venv/bin/python benchmarks/engine_throughput.py [--rounds 3] [--processes 1] [--quick]
[--out FILE]``.
The records: ``.venv/bin/python benchmarks/engine_throughput.py --threads 1 --clock cpu --rounds 3 --processes 3
--out benchmarks/engine_throughput.md`` and ``.venv/bin/python benchmarks/engine_throughput.py --rounds 3
--processes 3 --out benchmarks/engine_throughput_wall.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from cpu_info import cpus

METHODS = ("plain", "sequential", "vectorized")


def _setup(cohort: int, use_mnist: bool):
    import torch
    from trustfl.config.build import build_federation
    from trustfl.config.load import config_from_dict
    from trustfl.data.datasets import dataset_available

    mnist = use_mnist and dataset_available("mnist")
    data = {"dataset": "mnist", "num_clients": 100, "partition": {"name": "iid"},
            "options": {"max_train": 60000}} if mnist else {"dataset": "digits", "num_clients": 100}
    cfg = config_from_dict({
        "name": "bench", "seed": 0, "rounds": 1, "data": data,
        "model": {"name": "mlp", "hidden": [200, 200]},
        "cohort": {"sampler": "uniform", "size": cohort},
        "client": {"epochs": 1, "batch_size": 32, "lr": 0.05},
        "engine": {"checkpoint_every": 0},
    })
    fed = build_federation(cfg, quiet=True)
    if not mnist:  # synthetic data of the benchmark's shape: 100 × 600 samples of 784 features
        gen = torch.Generator().manual_seed(0)
        from trustfl.engine.federation import ClientRows
        from trustfl.engine.local import TrainData
        from trustfl.models.zoo import build_model
        from trustfl.types import ParamLayout
        x = torch.randn(60000, 784, generator=gen)
        y = torch.randint(0, 10, (60000,), generator=gen)
        fed.train_data = TrainData({"x": x, "y": y}, 10)
        fed.client_rows = ClientRows(torch.arange(60000), torch.arange(0, 60001, 600))
        fed.batch_sizes = [32] * 100
        fed.noise_multipliers = [0.0] * 100
        fed.reports["num_samples"] = torch.full((100,), 600.0, dtype=torch.float64)
        fed.model = build_model("mlp", (784,), 10, 0, hidden=[200, 200])
        params = {k: v.detach() for k, v in fed.model.named_parameters()}
        fed.layout = ParamLayout.of(params)
        fed.initial_params = fed.layout.flatten(params).clone()
    return fed, ("mnist" if mnist else "synthetic")


def _plain_round(fed, state_params, cohort_ids, round_):
    """The reference: each client with an ordinary module and torch.optim.SGD; then the weighted mean."""
    import torch
    import torch.nn.functional as F
    from trustfl.engine.local import ClientPlan, batch_schedule

    model = fed.model
    flat = state_params
    total = torch.zeros_like(flat)
    weights = 0.0
    for cid in cohort_ids:
        torch.nn.utils.vector_to_parameters(flat.clone(), model.parameters())  # a copy: SGD updates it in place
        opt = torch.optim.SGD(model.parameters(), lr=fed.training.lr)
        rows = fed.client_rows[cid]
        # the client's data: the tensors as they are, or its examples generated on demand (benchmarks/scale.py)
        data, (own,) = fed.train_data.for_cohort([rows], flat.device)
        for batch in batch_schedule(fed.training, ClientPlan(cid, rows, 32), fed.seed, round_):
            idx = own[batch].to(flat.device)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(data.tensors["x"][idx]), data.tensors["y"][idx]).backward()
            opt.step()
        n = float(rows.numel())
        total += n * torch.nn.utils.parameters_to_vector(model.parameters()).detach()
        weights += n
    return total / weights


def worker(method: str, cohort: int, rounds: int, use_mnist: bool, mallopt: bool, threads: int,
           clock: str) -> dict:
    import torch
    if threads:
        torch.set_num_threads(threads)
    now = time.process_time if clock == "cpu" else time.perf_counter
    if mallopt:
        from trustfl.engine.allocator import tune_allocator
        tune_allocator()
    from trustfl.core.rng import SERVER, make_generator
    from trustfl.engine.executors import SequentialExecutor, VectorizedExecutor
    from trustfl.engine.sync import initial_state, run_round

    fed, source = _setup(cohort, use_mnist)
    fed.executor = SequentialExecutor() if method == "sequential" else VectorizedExecutor()
    state = initial_state(fed)
    times = []
    for r in range(rounds + 1):  # round 0 warms up (imports, first vmap)
        start = now()
        if method == "plain":
            ids = fed.cohort.sample(list(range(100)), make_generator(fed.seed, r, SERVER, "cohort"))
            state.params = _plain_round(fed, state.params, ids, r)
            state.round += 1
        else:
            state, _ = run_round(fed, state)
        if r:
            times.append(now() - start)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"method": method, "cohort": cohort, "seconds_per_round": statistics.median(times),
            "peak_rss_mb": peak_mb, "data": source, "threads": torch.get_num_threads()}


def _spawn(method: str, cohort: int, rounds: int, use_mnist: bool, mallopt: bool, threads: int,
           clock: str) -> dict:
    env = dict(os.environ)
    env.pop("MALLOC_MMAP_MAX_", None)
    cmd = [sys.executable, __file__, "--worker", method, "--cohort", str(cohort), "--rounds", str(rounds),
           "--threads", str(threads), "--clock", clock]
    if not use_mnist:
        cmd.append("--synthetic")
    if mallopt:
        cmd.append("--mallopt")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cohorts", default="10,100")
    parser.add_argument("--synthetic", action="store_true", help="synthetic data even when MNIST is present")
    parser.add_argument("--quick", action="store_true", help="1 timed round, cohort 10 and 100, mallopt only")
    parser.add_argument("--worker", choices=METHODS)
    parser.add_argument("--cohort", type=int)
    parser.add_argument("--mallopt", action="store_true")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall time, or process CPU time (robust when other jobs load the machine)")
    parser.add_argument("--processes", type=int, default=1,
                        help="fresh processes per (method, cohort, allocator), interleaved; the record gives medians")
    parser.add_argument("--out", help="also write the record (markdown) to this file")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.cohort, args.rounds, not args.synthetic, args.mallopt,
                                args.threads, args.clock)))
        return
    load_start = os.getloadavg()[0]
    rounds = 1 if args.quick else args.rounds
    cohorts = [int(c) for c in args.cohorts.split(",")]
    settings = (True,) if args.quick else (False, True)
    runs: dict[tuple, list[dict]] = {}
    for _ in range(max(args.processes, 1)):  # interleaved: a slow spell of the machine hits every method alike
        for mallopt in settings:
            for cohort in cohorts:
                for method in METHODS:
                    res = _spawn(method, cohort, rounds, not args.synthetic, mallopt, args.threads, args.clock)
                    runs.setdefault((mallopt, cohort, method), []).append(res)
                    print(f"  measured {method:10s} cohort={cohort:3d} mallopt={mallopt!s:5s}: "
                          f"{res['seconds_per_round']:.3f} s/round, peak {res['peak_rss_mb']:.0f} MB", file=sys.stderr)
    data = next(iter(runs.values()))[0]["data"]
    seconds = {k: [r["seconds_per_round"] for r in v] for k, v in runs.items()}
    median = {k: statistics.median(v) for k, v in seconds.items()}
    peak = {k: max(r["peak_rss_mb"] for r in v) for k, v in runs.items()}
    n = max(args.processes, 1)

    def cell(key: tuple) -> str:
        low, high = min(seconds[key]), max(seconds[key])
        return f"{median[key]:.3f}" if n == 1 else f"{median[key]:.3f} ({low:.3f}–{high:.3f})"

    lines = [f"`{' '.join(['.venv/bin/python', 'benchmarks/engine_throughput.py'] + sys.argv[1:])}`", "",
             "# Engine throughput: FedAvg round time vs a plain PyTorch loop", "",
             f"MLP 784-200-200-10, batch 32, 1 local epoch, 100 clients x 600 samples ({data}); median of {rounds} "
             f"timed rounds after a warm-up round; {cpus()}, torch threads "
             f"{args.threads or 'default'}, clock {args.clock}; 1-minute load average {load_start:.2f} at the start "
             f"and {os.getloadavg()[0]:.2f} at the end. Each (method, cohort, allocator) ran in its own process "
             f"(peak RSS is its own)" + ("." if n == 1 else
                                         f", {n} times, interleaved: median (min–max) over the {n} processes; the "
                                         f"ratios are of the medians; peak RSS the largest."), "",
             "| allocator | clients/round | plain loop s | sequential s | vectorized s | seq/plain | vec/plain | "
             "peak MB (plain/seq/vec) |", "|---|---|---|---|---|---|---|---|"]
    for mallopt in settings:
        for cohort in cohorts:
            p, s, v = ((mallopt, cohort, m) for m in METHODS)
            lines.append(f"| {'mallopt' if mallopt else 'default'} | {cohort} | {cell(p)} | {cell(s)} | {cell(v)} | "
                         f"{median[s] / median[p]:.2f} | {median[v] / median[p]:.2f} | "
                         f"{peak[p]:.0f}/{peak[s]:.0f}/{peak[v]:.0f} |")
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
