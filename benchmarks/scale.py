"""Scale (issue #14): rounds/s and peak memory for 10 to 10,000 clients per round, trustfl vs a plain per-client loop.

Setting: FedAvg, one local epoch, batch 32, lr 0.01, on the generated population ``data.dataset = "synthetic"``
(FedProx's Synthetic(1, 1) with 784 features, so the models are MNIST-shaped; every client holds exactly
``--samples-per-client`` training examples, generated from (seed, client) when the client is sampled): the MLP
784-200-200-10 (199,210 parameters) and CafCor's CNN ``cnn_cafcor`` (431,080 parameters). Every client of the
population takes part in every round (cohort = population). trustfl is the synchronous engine with the vectorized
executor (``engine.max_clients_per_batch`` = ``--chunk`` above that many clients); the plain loop is
``benchmarks/engine_throughput.py``'s ``nn.Module`` + ``torch.optim.SGD`` per client, on the same clients, data
and batches. With ``--data generated`` (the default) both generate their clients' data on the CPU inside the round
(the data column gives that share); with ``--data resident`` every client's examples are generated once, at build,
and held on the device (as a GPU user holds a data set that fits), so a round measures training alone.

Each (model, cohort, method) runs in its own process (peak RSS, VmHWM, is its own; on CUDA also
``torch.cuda.max_memory_allocated``), with the allocator setting that ``run_experiment`` applies (``tune_allocator``,
for both methods); ``--repeats`` runs every cell that many times, interleaved, and reports the
median of the per-run medians of ``--rounds`` timed rounds after a warm-up round. A cell whose time, extrapolated
linearly from the same model and method at the next smaller cohort, would exceed ``--budget-s`` is skipped (—).
A cohort of ``--large-cohort`` clients or more uses ``--large-samples`` examples per client. Also measured: one
round of a population of 1,000,000 clients with 100 per round (configs/scale/synthetic_million.toml).

Run: ``.venv/bin/python benchmarks/scale.py [--device cpu|cuda|auto] [--data generated|resident] [--cohorts
10,100,1000,10000] [--out FILE]``. The records benchmarks/scale.md (CPU) and benchmarks/scale_gpu.md (GPU,
``--device cuda --data resident --no-million``) are written with the command at their top.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from cpu_info import cpus

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = {"mlp": ("mlp", {"hidden": [200, 200]}, "MLP 784-200-200-10"), "cnn": ("cnn_cafcor", {}, "CNN cnn_cafcor")}
METHODS = ("trustfl", "plain")
NUM_PARAMS = {"mlp": 199_210, "cnn": 431_080}
RESIDENT_DISTINCT = 1000
"""``--data resident``: clients with examples of their own; the others repeat them (see ``_federation``)."""
MESSAGE_COPIES = 2.0
"""Peak memory of a trustfl round in units of its stacked message matrix (clients × parameters × 4 B): the messages
are written once into one matrix that the server screens and aggregates in place, beside one chunk of clients in
training (``"auto"`` chunks take half of what is left). Before that change (three copies), 10,000 MLP clients
(7.4 GiB of messages) were killed by the kernel at a max RSS of 23.9 GB on a 24 GiB machine."""


def _child_env(**extra: str) -> dict[str, str]:
    """The environment of a child process: this checkout first on PYTHONPATH, the caller's entries kept after it."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                **extra)


def _available_gib() -> float:
    return int(open("/proc/meminfo").read().split("MemAvailable:")[1].split()[0]) / 2**20


def _peak_rss_mb() -> float:
    return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 1024


def _config(model: str, cohort: int, samples: int, chunk: int, device: str = "cpu", rounds: int = 1) -> dict:
    """The benchmark's experiment: every client of a synthetic population of ``cohort`` takes part."""
    total = -(-samples * 5 // 4)  # n_k with n_k − round(0.2·n_k) = samples training examples
    while total - round(0.2 * total) > samples:
        total -= 1
    name, params, _ = MODELS[model]
    return {
        "name": "scale", "seed": 0, "rounds": rounds,
        "data": {"dataset": "synthetic", "num_clients": cohort, "partition": {"name": "natural"},
                 "options": {"alpha": 1.0, "beta": 1.0, "dim": 784, "samples": total, "test_clients": 1}},
        "model": {"name": name, **params}, "cohort": {"sampler": "all"},
        "client": {"epochs": 1, "batch_size": 32, "lr": 0.01},
        "engine": {"checkpoint_every": 0, "device": device, "eval_every": rounds,
                   "max_clients_per_batch": chunk if chunk and cohort > chunk else "auto"}}


def _federation(model: str, cohort: int, samples: int, chunk: int, device: str, resident: bool = False):
    """The benchmark's federation; ``resident``: every client's examples generated once, at build, and held on
    ``device`` (a dense training set whose rows are the population's virtual rows), instead of generated on the CPU
    inside every round. Beyond :data:`RESIDENT_DISTINCT` clients, client ``k`` holds the examples of client ``k mod
    RESIDENT_DISTINCT`` (every client has the same size): the round's work is the same, the build does not spend
    minutes generating examples on the CPU."""
    import dataclasses

    from trustfl.config.build import build_federation
    from trustfl.config.load import config_from_dict
    from trustfl.engine.allocator import tune_allocator
    from trustfl.engine.local import TrainData

    tune_allocator()  # as run_experiment does; in this process, so for the plain loop alike
    fed = build_federation(config_from_dict(_config(model, cohort, samples, chunk, device)), quiet=True)
    assert set(fed.client_rows.sizes()) == {samples}
    if resident:  # client k's rows offsets[k] .. offsets[k+1] index the concatenation of clients 0 .. N-1
        distinct = min(cohort, RESIDENT_DISTINCT)
        made = fed.train_data.population.materialise(range(distinct))
        reps = -(-cohort // distinct)
        tensors = {k: v.to(fed.test_data["x"].device).repeat(reps, *[1] * (v.dim() - 1))[:cohort * samples]
                   for k, v in made.items()}
        fed = dataclasses.replace(fed, train_data=TrainData(tensors, fed.train_data.num_classes))
    return fed


def torchrun_worker(ranks: int, rounds: int) -> dict:
    """``trustfl run`` of the MLP on 100 clients x 600 samples under ``torchrun --nproc_per_node=ranks`` (or one
    plain process): the median ``wall_time_s`` step of rank 0's rows after the first round."""
    import tempfile

    import tomli_w

    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "scale.toml"
        cfg.write_text(tomli_w.dumps(_config("mlp", 100, 600, 0, "cpu", rounds)))
        run = [sys.executable, "-m", "trustfl", "run", str(cfg), "--out", str(Path(tmp) / "run"), "--quiet"]
        if ranks > 1:
            run = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
                   *run[1:]]
        threads = max(1, (os.cpu_count() or 1) // ranks)
        env = _child_env(OMP_NUM_THREADS=str(threads))
        out = subprocess.run(run, capture_output=True, text=True, env=env, cwd=ROOT)
        if out.returncode != 0:
            return {"error": (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1][:200]}
        rows = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    walls = [r["wall_time_s"] for r in rows]
    steps = [b - a for a, b in zip(walls, walls[1:])]
    return {"ranks": ranks, "threads_per_rank": threads, "seconds_per_round": statistics.median(steps),
            "accuracy": rows[-1].get("accuracy")}


def worker(model: str, cohort: int, method: str, samples: int, chunk: int, rounds: int, device: str,
           resident: bool = False) -> dict:
    import torch
    from engine_throughput import _plain_round  # this directory (opacus ships a `benchmarks` package)
    from trustfl.engine.sync import initial_state, run_round

    start = time.perf_counter()
    fed = _federation(model, cohort, samples, chunk, device, resident)
    build_s = time.perf_counter() - start
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    state = initial_state(fed)
    times = []
    for r in range(rounds + 1):  # round 0 warms up (imports, first vmap, allocator)
        sync()
        start = time.perf_counter()
        if method == "plain":
            state.params = _plain_round(fed, state.params, list(range(cohort)), r)
            state.round += 1
        else:
            state, _ = run_round(fed, state)
        sync()
        if r:
            times.append(time.perf_counter() - start)
    start = time.perf_counter()  # the share of a round spent generating the cohort's data (both methods do it)
    if not resident:
        step = chunk or cohort
        for i in range(0, cohort, step):
            fed.train_data.population.materialise(range(i, min(i + step, cohort)))
    out = {"seconds_per_round": statistics.median(times),
           "data_s": build_s if resident else time.perf_counter() - start,
           "peak_rss_mb": _peak_rss_mb(), "finite": bool(torch.isfinite(state.params).all())}
    if device == "cuda":
        out["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
        out["gpu"] = torch.cuda.get_device_name()
    return out


def million_worker() -> dict:
    import tempfile

    from trustfl.config.load import load_config
    from trustfl.experiment import run_experiment

    start = time.perf_counter()
    cfg = load_config(str(ROOT / "configs/scale/synthetic_million.toml"), ["rounds=1"])
    with tempfile.TemporaryDirectory() as out:
        result = run_experiment(cfg, Path(out) / "run", progress=False, plots=False)
    return {"rounds": result.summary["rounds"], "peak_rss_mb": _peak_rss_mb(),
            "seconds": time.perf_counter() - start, "accuracy": result.summary["final_accuracy"]}


def _spawn(args: list[str], threads: int) -> dict:
    env = _child_env()
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env, cwd=ROOT)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["exit %d" % out.returncode])[-1][:200]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _resolve_device(device: str) -> str:
    import torch
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no CUDA device on this machine (use --device cpu or auto)")
    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto")
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--cohorts", default="10,100,1000,10000")
    parser.add_argument("--samples-per-client", type=int, default=600)
    parser.add_argument("--large-cohort", type=int, default=10000,
                        help="from this many clients on, use --large-samples")
    parser.add_argument("--large-samples", type=int, default=32, help="one batch of 32: one local step")
    parser.add_argument("--chunk", type=int, default=0,
                        help="engine.max_clients_per_batch above this many clients (0: \"auto\")")
    parser.add_argument("--torchrun-rounds", type=int, default=4, help="rounds of the 1- vs 2-rank runs (0: skip)")
    parser.add_argument("--max-plain-clients", type=int, default=100, help="plain loop only up to this cohort")
    parser.add_argument("--budget-s", type=float, default=300, help="skip a cell extrapolated to run longer")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds per run (after one warm-up round)")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved runs of every cell; median reported")
    parser.add_argument("--data", choices=("generated", "resident"), default="generated",
                        help="generated: each round generates its cohort's examples on the CPU (both methods); "
                             "resident: generated once at build and held on the device")
    parser.add_argument("--threads", type=int, default=0, help="OMP/torch threads of the workers (0: default)")
    parser.add_argument("--no-million", action="store_true", help="skip the 1,000,000-client population")
    parser.add_argument("--out", help="also write the record (markdown) to this file")
    parser.add_argument("--worker", nargs=4, metavar=("MODEL", "COHORT", "METHOD", "SAMPLES"))
    parser.add_argument("--million-worker", action="store_true")
    args = parser.parse_args()
    device = _resolve_device(args.device)
    if args.million_worker:
        print(json.dumps(million_worker()))
        return
    if args.worker:
        model, cohort, method, samples = args.worker
        print(json.dumps(worker(model, int(cohort), method, int(samples), args.chunk, args.rounds, device,
                                args.data == "resident")))
        return

    command = " ".join([".venv/bin/python", "benchmarks/scale.py"] + sys.argv[1:])
    load_start = os.getloadavg()[0]
    models, cohorts = args.models.split(","), [int(c) for c in args.cohorts.split(",")]
    samples_of = {c: args.large_samples if c >= args.large_cohort else args.samples_per_client for c in cohorts}
    runs: dict[tuple, list[dict]] = {}
    skipped: dict[tuple, str] = {}
    for rep in range(args.repeats):
        for model in models:
            for method in METHODS:
                previous = None
                for cohort in cohorts:
                    key = (model, cohort, method)
                    if method == "plain" and cohort > args.max_plain_clients:
                        skipped[key] = f"plain loop above --max-plain-clients {args.max_plain_clients}"
                        continue
                    if key in skipped:
                        continue
                    need = MESSAGE_COPIES * cohort * NUM_PARAMS[model] * 4 / 2**30
                    if method == "trustfl" and device == "cpu" and need > 0.8 * _available_gib():
                        skipped[key] = (f"needs ~{need:.0f} GiB ({MESSAGE_COPIES} x the {cohort:,} x "
                                        f"{NUM_PARAMS[model]:,} float32 messages), {_available_gib():.0f} GiB "
                                        f"available: not run, so that the kernel does not kill it")
                        continue
                    if previous is not None:  # linear in clients × examples, per round, warm-up included
                        p_cohort, p_res = previous
                        guess = (p_res["seconds_per_round"] * cohort * samples_of[cohort]
                                 / (p_cohort * samples_of[p_cohort]) * (args.rounds + 1))
                        if guess > args.budget_s:
                            skipped[key] = f"extrapolated {guess:.0f} s > --budget-s {args.budget_s:.0f}"
                            continue
                    res = _spawn(["--worker", model, str(cohort), method, str(samples_of[cohort]), "--chunk",
                                  str(args.chunk), "--rounds", str(args.rounds), "--device", device,
                                  "--data", args.data], args.threads)
                    if "error" in res:
                        skipped[key] = f"failed: {res['error']}"
                        continue
                    runs.setdefault(key, []).append(res)
                    previous = (cohort, res)
                    print(f"  {model} {cohort:6d} {method:8s}: {res['seconds_per_round']:.3f} s/round, peak "
                          f"{res['peak_rss_mb']:.0f} MB", file=sys.stderr)
    million = None if args.no_million else _spawn(["--million-worker"], args.threads)
    ranks = [] if not args.torchrun_rounds or device != "cpu" else \
        [torchrun_worker(n, args.torchrun_rounds) for n in (1, 2)]
    text = _record(command, args, device, models, cohorts, samples_of, runs, skipped, million, load_start, ranks)
    print("\n" + text)
    failed = sorted({reason for reason in skipped.values() if reason.startswith("failed")}
                    | {f"failed: {r['error']}" for r in [million or {}, *ranks] if "error" in r})
    if args.out and failed:  # a failed run (e.g. --device cuda where there is none) must not replace a record
        sys.exit(f"not written to {args.out}: {len(failed)} kind(s) of failed cell, first: {failed[0]}")
    if args.out:
        Path(args.out).write_text(text)


def _cell(runs, key, field, fmt):
    if key not in runs:
        return None
    return format(statistics.median(r[field] for r in runs[key]), fmt)


def _record(command, args, device, models, cohorts, samples_of, runs, skipped, million, load_start,
            ranks) -> str:
    notes: dict[str, int] = {}

    def dash(key) -> str:
        reason = skipped.get(key, "not run")
        notes.setdefault(reason, len(notes) + 1)
        return f"—[{notes[reason]}]"

    gpu = next((r[0].get("gpu") for r in runs.values() if r and "gpu" in r[0]), None)
    lines = [f"`{command}`", "", "# Scale: FedAvg rounds for 10 to 10,000 clients per round, trustfl vs a plain loop",
             "", f"Device: {device}{f' ({gpu})' if gpu else ''}; {cpus()}, threads "
             f"{args.threads or 'default'}; 1-minute load average {load_start:.2f} at the start and "
             f"{os.getloadavg()[0]:.2f} at the end. Median of {args.repeats} interleaved run(s), each the median of "
             f"{args.rounds} timed rounds after a warm-up; every (model, cohort, method) in its own process. "
             f"Data: generated Synthetic(1, 1), 784 features; {args.samples_per_client} training examples per "
             f"client ({args.large_samples} from {args.large_cohort} clients per round on); batch 32, 1 local "
             f"epoch. trustfl: vectorized executor, engine.max_clients_per_batch = "
             f"{args.chunk or chr(34) + 'auto' + chr(34)}. Peak = the process's max RSS (VmHWM)"
             + (", GPU = torch.cuda.max_memory_allocated" if device == "cuda" else "") + ". data s = "
             + ("generating the cohort's examples once (inside every round, for both methods)."
                if args.data == "generated" else
                "building the federation, every client's examples generated once and held on the device "
                "(--data resident: not inside the rounds, for both methods)."), "",
             "| model | clients/round | examples/client | trustfl s/round | plain s/round | plain/trustfl | "
             "trustfl rounds/s | data s | peak MB trustfl / plain" + (" | GPU MB trustfl / plain" if device == "cuda"
                                                                      else "") + " |",
             "|---|---|---|---|---|---|---|---|---|" + ("---|" if device == "cuda" else "")]
    for model in models:
        for cohort in cohorts:
            t, p = (model, cohort, "trustfl"), (model, cohort, "plain")
            ts, ps = _cell(runs, t, "seconds_per_round", ".3f"), _cell(runs, p, "seconds_per_round", ".3f")
            ratio = f"{float(ps) / float(ts):.2f}" if ts and ps else "—"
            rate = f"{1 / float(ts):.3f}" if ts else "—"
            mem = (f"{_cell(runs, t, 'peak_rss_mb', '.0f') or dash(t)} / "
                   f"{_cell(runs, p, 'peak_rss_mb', '.0f') or dash(p)}")
            row = (f"| {MODELS[model][2]} | {cohort:,} | {samples_of[cohort]} | {ts or dash(t)} | {ps or dash(p)} | "
                   f"{ratio} | {rate} | {_cell(runs, t, 'data_s', '.2f') or '—'} | {mem} |")
            if device == "cuda":
                row += (f" {_cell(runs, t, 'cuda_peak_mb', '.0f') or '—'} / "
                        f"{_cell(runs, p, 'cuda_peak_mb', '.0f') or '—'} |")
            lines.append(row)
    lines.append("")
    lines += [f"[{n}] {reason}." for reason, n in notes.items()]
    big = [c for c in cohorts if c >= args.large_cohort]
    if big:
        d = 199_210
        lines += ["", f"Memory at {big[-1]:,} clients per round (MLP): the stacked messages are {big[-1]:,} × {d:,} "
                      f"float32 = {big[-1] * d * 4 / 2**30:.1f} GiB and must exist at once (the aggregator sees "
                      f"them all); they are written once into one matrix that the server screens and aggregates "
                      f"without copying it, and the executor trains the cohort in chunks sized to the memory left "
                      f"(\"auto\"). The CNN's messages at that scale would be {big[-1] * 431_080 * 4 / 2**30:.1f} GiB."]
    if device != "cuda":
        lines += ["", "## GPU", "", "Not on this machine: the GPU rows are benchmarks/scale_gpu.md (`--device cuda "
                  "--data resident --no-million` where a GPU is available)."]
    if ranks:
        lines += ["", "## torchrun: 1 rank vs 2 ranks", "",
                  f"`trustfl run` of the MLP on 100 clients × 600 examples (every client every round), "
                  f"{args.torchrun_rounds} rounds, median round time after the first from rank 0's `wall_time_s`; "
                  f"the ranks share this machine's {os.cpu_count()} cores (OMP threads = cores / ranks).", "",
                  "| ranks | threads per rank | s/round | final accuracy |", "|---|---|---|---|"]
        for r in ranks:
            if "error" in r:
                lines.append(f"| ? | ? | failed: {r['error']} | |")
            else:
                lines.append(f"| {r['ranks']} | {r['threads_per_rank']} | {r['seconds_per_round']:.3f} | "
                             f"{r['accuracy']:.4f} |")
    if million is not None:
        lines += ["", "## A population of 1,000,000 clients, 100 per round", ""]
        if "error" in million:
            lines.append(f"failed: {million['error']}")
        else:
            lines.append(f"configs/scale/synthetic_million.toml with rounds = 1 (Synthetic(1, 1), 60 features, "
                         f"logistic regression): peak RSS {million['peak_rss_mb']:.0f} MB, "
                         f"{million['seconds']:.1f} s for the whole run (build, one round, evaluation on the test "
                         f"shares of 1,000 clients).")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
