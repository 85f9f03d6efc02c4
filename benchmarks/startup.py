"""Fast start (issue #18 item 4): import and CLI start-up, first round vs steady rounds, end to end vs plain PyTorch.

Every figure is measured in fresh processes (median of ``--repeats``, default 5), wall clock from the parent:

- ``python -c "import trustfl"`` (target < 1.0 s) and ``trustfl --help`` (target < 1.5 s), with ``python -c pass``
  and ``python -c "import torch"`` for reference;
- the first round (target ≤ 2 × a steady round), three ways: (a) ``trustfl run configs/quickstart.toml``, round 1
  against the median of rounds 2–20 from metrics.jsonl (``wall_time_s`` counts each round's own time; the rounds'
  cohorts differ, so their work differs: the record gives round 1's local steps and the median of the later rounds',
  each round's longest client's, which is what the vectorized executor runs; for information); (b) the same from the
  end-to-end runs below, whose rounds all do the same work (10 clients × 19 steps; the target); (c) timing hooks in one
  process: round 1 cold, then the same round 1 again on a second, identical federation (the same work, warm), and rounds
  2–20; the same for the quickstart with DP-SGD (per-example clipping, ghost norms) and with CafCor's batch clipping
  (plain autograd since 2026-11-26; before, its ``torch.func.grad`` imported ``torch._dynamo`` on first use);
- end to end, process start to summary (the target; and, for information, to exit): ``run_experiment`` on FedAvg,
  20 rounds, 10 of 100 clients per round (IID, 600 samples each), MLP 784-200-200-10, batch 32, one local epoch,
  evaluated once at the end, no checkpoints; against a plain per-client PyTorch loop in this file (``nn.Module`` +
  ``torch.optim.SGD`` per client, the same SGD steps on the same data, mean of the client models, test accuracy at
  the end); target trustfl ≤ 0.6 × plain. trustfl's summary is ``summary.json`` (its modification time), written
  after the final evaluation and before the model file and the plots; the plain loop's is its final accuracy.
  MNIST when ``trustfl.data.dataset_available("mnist")``, else synthetic data of that shape (an npz file both
  processes read). The two alternate, so that a change of machine load hits both alike.

Run: ``make bench`` or ``.venv/bin/python benchmarks/startup.py [--repeats 5] [--out benchmarks/startup.md]``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROUNDS, CLIENTS, COHORT, PER_CLIENT, BATCH, LR = 20, 100, 10, 600, 32, 0.05
VARIANTS = {
    "FedAvg (plain gradients)": (),
    "DP-SGD (per-example clipping, ghost norms)": ("client.dp.mode=\"per_example\"", "client.dp.noise_multiplier=1.0",
                                                   "client.batch_sampler=\"poisson\""),
    "batch clipping (CafCor's gradient method)": ("client.dp.mode=\"batch_clip\"", "client.dp.noise_multiplier=1.0"),
}
"""The quickstart, and the quickstart with each DP gradient method (timing hooks: round 1 cold vs warm)."""
TARGETS = {"import": 1.0, "help": 1.5, "first_round": 2.0, "end_to_end": 0.6}


# -- children (each runs in its own fresh process) ---------------------------------------------------------------
def child_trustfl(config: str, out: str) -> dict:
    from trustfl.config.load import load_config
    from trustfl.experiment import run_experiment

    result = run_experiment(load_config(config), out, progress=False)
    return {"accuracy": result.summary["final_accuracy"], "wall_time_s": result.summary["wall_time_s"],
            "summary_at": (result.run_dir / "summary.json").stat().st_mtime}  # written before the model and plots


def child_rounds(config: str, *overrides: str) -> dict:
    """Round 1 cold, the same round 1 warm (a second federation built from the same config), rounds 2–20."""
    import statistics as stats

    from trustfl.config.build import build_federation
    from trustfl.config.load import load_config
    from trustfl.engine.allocator import tune_allocator
    from trustfl.engine.sync import initial_state, run_round

    tune_allocator()  # as run_experiment does
    cfg = load_config(config, list(overrides))
    fed = build_federation(cfg, quiet=True)
    start = time.perf_counter()
    state, _ = run_round(fed, initial_state(fed))
    cold = time.perf_counter() - start
    dynamo = "torch._dynamo" in sys.modules
    twin = build_federation(cfg, quiet=True)
    start = time.perf_counter()
    run_round(twin, initial_state(twin))
    warm = time.perf_counter() - start
    later = []
    while state.round < cfg.rounds:
        start = time.perf_counter()
        state, _ = run_round(fed, state)
        later.append(time.perf_counter() - start)
    return {"cold": cold, "warm": warm, "steady": stats.median(later), "dynamo": dynamo}


def _read_idx(path: Path):
    import gzip

    import numpy as np

    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    ndim = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _plain_data(source: str):
    """(train_x, train_y, test_x, test_y) as torch tensors, read without trustfl."""
    import numpy as np
    import torch

    if source.endswith(".npz"):
        with np.load(source) as z:
            arrays = [z[k] for k in ("x", "y", "x_test", "y_test")]
        return [torch.from_numpy(a) for a in arrays]
    folder = Path(source)
    out = []
    for split in ("train", "t10k"):
        images = next(folder.glob(f"{split}-images-idx3-ubyte*"))
        labels = next(folder.glob(f"{split}-labels-idx1-ubyte*"))
        pixels = torch.tensor(_read_idx(images), dtype=torch.float32)  # the copy trustfl's loader makes
        out += [pixels.div_(255.0).sub_(0.1307).div_(0.3081).reshape(-1, 1, 28, 28),  # MNIST's usual scaling
                torch.from_numpy(_read_idx(labels).astype(np.int64))]
    return out


def child_plain(source: str) -> dict:
    """FedAvg as a plain PyTorch loop: one client after another, each an nn.Module with torch.optim.SGD."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    x, y, x_test, y_test = _plain_data(source)
    gen = torch.Generator().manual_seed(0)
    shards = torch.randperm(x.shape[0], generator=gen)[:CLIENTS * PER_CLIENT].view(CLIENTS, PER_CLIENT)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(x[0].numel(), 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(),
                          nn.Linear(200, 10))
    global_params = parameters_to_vector(model.parameters()).detach().clone()
    for _ in range(ROUNDS):
        total = torch.zeros_like(global_params)
        for cid in torch.randperm(CLIENTS, generator=gen)[:COHORT].tolist():
            # a copy: vector_to_parameters makes the parameters views of the vector it is given
            vector_to_parameters(global_params.clone(), model.parameters())
            opt = torch.optim.SGD(model.parameters(), lr=LR)
            rows = shards[cid][torch.randperm(PER_CLIENT, generator=gen)]
            for start in range(0, PER_CLIENT, BATCH):
                idx = rows[start:start + BATCH]
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(x[idx]), y[idx]).backward()
                opt.step()
            total += parameters_to_vector(model.parameters()).detach()
        global_params = total / COHORT
    vector_to_parameters(global_params, model.parameters())
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).double().mean().item()
    return {"accuracy": accuracy, "summary_at": time.time()}


# -- the parent: spawn, time, record -----------------------------------------------------------------------------
def _timed(cmd: list[str], cwd: Path = REPO) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return elapsed, proc.stdout


def _timed_from(cmd: list[str]) -> tuple[float, float, dict]:
    """(seconds to the child's exit, seconds to its ``summary_at`` stamp, its JSON line), from its spawn."""
    spawned = time.time()
    elapsed, out = _timed(cmd)
    result = json.loads(out.strip().splitlines()[-1])
    return elapsed, result["summary_at"] - spawned, result


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f})"


def _trustfl_command() -> list[str]:
    script = Path(sys.executable).with_name("trustfl")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "trustfl"]


def _round_times(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    walls = [r["wall_time_s"] for r in rows]
    return [b - a for a, b in zip([0.0] + walls, walls)]


def _quickstart_steps() -> list[int]:
    """The local steps of each quickstart round: its longest client's, the steps the vectorized executor runs."""
    from trustfl.config.build import build_federation
    from trustfl.config.load import load_config
    from trustfl.engine.local import num_local_steps
    from trustfl.engine.round_parts import sample_cohort

    fed = build_federation(load_config(REPO / "configs/quickstart.toml"), quiet=True)
    return [max(num_local_steps(fed.training, int(fed.client_rows[c].numel()), fed.batch_sizes[c])
                for c in sample_cohort(fed, r)) for r in range(fed.rounds)]


def _e2e_setup(tmp: Path, synthetic: bool) -> tuple[Path, str, str]:
    """The experiment config and the plain loop's data source (MNIST's folder, or a synthetic npz)."""
    from trustfl.data import dataset_available, resolve_data_dir

    if not synthetic and dataset_available("mnist"):
        data = 'dataset = "mnist"'
        source, label = str(resolve_data_dir() / "mnist"), "MNIST"
    else:
        import numpy as np

        rng = np.random.default_rng(0)
        npz = tmp / "synthetic.npz"
        np.savez(npz, x=rng.standard_normal((CLIENTS * PER_CLIENT, 784), dtype=np.float32),
                 y=rng.integers(0, 10, CLIENTS * PER_CLIENT),
                 x_test=rng.standard_normal((10000, 784), dtype=np.float32), y_test=rng.integers(0, 10, 10000))
        data = f'dataset = "npz"\npath = "{npz}"\noptions = {{ standardize = false }}'
        source, label = str(npz), "synthetic (784 features, 60,000 + 10,000 samples)"
    config = tmp / "e2e.toml"
    config.write_text(f'name = "startup-e2e"\nseed = 0\nrounds = {ROUNDS}\n\n[data]\n{data}\n'
                      f'num_clients = {CLIENTS}\npartition = {{ name = "iid" }}\n\n'
                      f'[model]\nname = "mlp"\nhidden = [200, 200]\n\n'
                      f'[cohort]\nsampler = "uniform"\nsize = {COHORT}\n\n'
                      f'[client]\nepochs = 1\nbatch_size = {BATCH}\nlr = {LR}\n\n'
                      f'[engine]\nexecutor = "vectorized"\neval_every = {ROUNDS}\ncheckpoint_every = 0\n')
    return config, source, label


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per measurement (median)")
    parser.add_argument("--synthetic", action="store_true", help="synthetic data even when MNIST is present")
    parser.add_argument("--out", help="also write the record (markdown) to this file")
    parser.add_argument("--child", nargs="+", metavar="ARG", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        child = {"trustfl": child_trustfl, "plain": child_plain, "rounds": child_rounds}[kind]
        print(json.dumps(child(*rest)))
        return

    py, n = sys.executable, args.repeats
    load_start = os.getloadavg()
    times: dict[str, list[float]] = {k: [] for k in ("pass", "torch", "import", "help")}
    for _ in range(n):
        for key, cmd in (("pass", [py, "-c", "pass"]), ("torch", [py, "-c", "import torch"]),
                         ("import", [py, "-c", "import trustfl"]), ("help", _trustfl_command() + ["--help"])):
            times[key].append(_timed(cmd)[0])
        print(f"  start-up: import trustfl {times['import'][-1]:.3f} s, --help {times['help'][-1]:.3f} s",
              file=sys.stderr)

    firsts, steadies, ratios = [], [], []
    hooks: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for i in range(n):
            run_dir = tmp / f"quickstart{i}"
            _timed(_trustfl_command() + ["run", "configs/quickstart.toml", "--out", str(run_dir), "--quiet"])
            rounds = _round_times(run_dir)
            first, steady = rounds[0], statistics.median(rounds[1:])
            firsts.append(first)
            steadies.append(steady)
            ratios.append(first / steady)
            for name, overrides in VARIANTS.items():
                out = _timed([py, __file__, "--child", "rounds", "configs/quickstart.toml", *overrides])[1]
                hooks[name].append(json.loads(out.strip().splitlines()[-1]))
            print(f"  quickstart: first round {first:.3f} s, steady {steady:.3f} s; cold/warm round 1: "
                  + ", ".join(f"{k} {v[-1]['cold'] / v[-1]['warm']:.2f}" for k, v in hooks.items()), file=sys.stderr)

        config, source, data_label = _e2e_setup(tmp, args.synthetic)
        e2e: dict[str, list[float]] = {k: [] for k in ("trustfl", "plain", "ratio", "trustfl_exit", "plain_exit",
                                                         "ratio_exit", "first", "steady", "first_ratio")}
        accuracy: dict[str, list[float]] = {"trustfl": [], "plain": []}
        for i in range(n):
            exit_t, summary_t, result = _timed_from([py, __file__, "--child", "trustfl", str(config),
                                                     str(tmp / f"e2e{i}")])
            accuracy["trustfl"].append(result["accuracy"])
            exit_p, summary_p, result = _timed_from([py, __file__, "--child", "plain", source])
            accuracy["plain"].append(result["accuracy"])
            rounds = _round_times(tmp / f"e2e{i}")  # every round: 10 clients x 19 steps, the same work
            first, steady = rounds[0], statistics.median(rounds[1:])
            for key, value in (("trustfl", summary_t), ("plain", summary_p), ("ratio", summary_t / summary_p),
                               ("trustfl_exit", exit_t), ("plain_exit", exit_p), ("ratio_exit", exit_t / exit_p),
                               ("first", first), ("steady", steady), ("first_ratio", first / steady)):
                e2e[key].append(value)
            print(f"  end to end: trustfl {summary_t:.2f} s to its summary ({exit_t:.2f} s to exit), plain loop "
                  f"{summary_p:.2f} s ({exit_p:.2f} s); round 1 {first / steady:.2f} x a steady round",
                  file=sys.stderr)
    load_end = os.getloadavg()

    def verdict(value: float, target: float, strict: bool) -> str:
        return "met" if (value < target if strict else value <= target) else "**not met**"

    def ratio_row(label: str, values: list[float], target: float, note: str = "") -> str:
        value = statistics.median(values)
        return (f"| {label} | {value:.2f} ({min(values):.2f}–{max(values):.2f}) | ≤ {target} | "
                f"{verdict(value, target, False)}{note} |")

    med = {k: statistics.median(v) for k, v in times.items()}
    steps = _quickstart_steps()
    command = " ".join([".venv/bin/python", "benchmarks/startup.py"] + sys.argv[1:])
    import torch  # only to report the thread count both kinds of process use

    lines = [
        f"`{command}`", "",
        "# Fast start: import, CLI, first round, end to end vs a plain PyTorch loop (issue #18 item 4)", "",
        f"Fresh processes, wall clock, median of {n} (min–max in brackets); {os.cpu_count()} CPUs, torch's default "
        f"{torch.get_num_threads()} threads; load average (1/5/15 min) "
        f"{'/'.join(f'{v:.2f}' for v in load_start)} at the start and "
        f"{'/'.join(f'{v:.2f}' for v in load_end)} at the end (other jobs shared the machine).", "",
        "| measurement | median (min–max) | target | |", "|---|---|---|---|",
        f"| `python -c pass` (interpreter alone), s | {_median(times['pass'])} | | |",
        f"| `python -c \"import torch\"` (reference), s | {_median(times['torch'])} | | |",
        f"| `python -c \"import trustfl\"`, s | {_median(times['import'])} | < {TARGETS['import']} s | "
        f"{verdict(med['import'], TARGETS['import'], True)} |",
        f"| `trustfl --help`, s | {_median(times['help'])} | < {TARGETS['help']} s | "
        f"{verdict(med['help'], TARGETS['help'], True)} |",
        f"| quickstart (`trustfl run`): round 1, s | {_median(firsts)} | | |",
        f"| quickstart (`trustfl run`): median of rounds 2–20, s | {_median(steadies)} | | |",
        f"| quickstart (`trustfl run`): round 1 / median of rounds 2–20 (round 1: {steps[0]} local steps, the "
        f"median round: {statistics.median(steps[1:]):g}) | {statistics.median(ratios):.2f} "
        f"({min(ratios):.2f}–{max(ratios):.2f}) | (information: unequal work) | |",
        f"| end-to-end run (below): round 1 / median of rounds 2–20, s | {_median(e2e['first'])} / "
        f"{_median(e2e['steady'])} | | |",
        ratio_row("end-to-end run: round 1 / median of rounds 2–20 (every round the same work)", e2e["first_ratio"],
                  TARGETS["first_round"]),
    ]
    for i, (name, runs) in enumerate(hooks.items()):
        lines.append(f"| {name}: round 1 cold / the same round warm, s | {_median([h['cold'] for h in runs])} / "
                     f"{_median([h['warm'] for h in runs])} | | |")
        ratios_hook = [h["cold"] / h["warm"] for h in runs]
        dynamo = " (imports torch._dynamo)" if any(h["dynamo"] for h in runs) else ""
        if i == 0:  # the quickstart itself: the target
            lines.append(ratio_row(f"{name}: round 1 cold / warm (timing hooks){dynamo}", ratios_hook,
                                   TARGETS["first_round"]))
        else:  # the DP variants: for information
            lines.append(f"| {name}: round 1 cold / warm (timing hooks){dynamo} | "
                         f"{statistics.median(ratios_hook):.2f} ({min(ratios_hook):.2f}–{max(ratios_hook):.2f}) | "
                         f"(information) | |")
    lines += [
        f"| end to end, process start to summary: trustfl `run_experiment` / plain PyTorch loop, s | "
        f"{_median(e2e['trustfl'])} / {_median(e2e['plain'])} | | |",
        ratio_row("end to end, process start to summary: trustfl / plain (paired runs)", e2e["ratio"],
                  TARGETS["end_to_end"]),
        f"| end to end, process start to exit (trustfl: model and plots written too): trustfl / plain, s | "
        f"{_median(e2e['trustfl_exit'])} / {_median(e2e['plain_exit'])} | | |",
        f"| end to end, process start to exit: trustfl / plain (paired runs) | "
        f"{statistics.median(e2e['ratio_exit']):.2f} ({min(e2e['ratio_exit']):.2f}–{max(e2e['ratio_exit']):.2f}) "
        f"| (information) | |", "",
        f"End to end: FedAvg, {ROUNDS} rounds, {COHORT} of {CLIENTS} clients per round ({PER_CLIENT} samples each, "
        f"IID), MLP 784-200-200-10, batch {BATCH}, 1 local epoch, lr {LR}, data {data_label}. Each process is timed "
        f"from its spawn to its summary (the issue's measure: trustfl's summary.json written, after every round's "
        f"metrics; the plain loop's final accuracy computed) and to its exit (trustfl also saves the model and "
        f"draws the plots, which import matplotlib). "
        f"Final accuracy: trustfl {statistics.median(accuracy['trustfl']):.4f}, plain loop "
        f"{statistics.median(accuracy['plain']):.4f} (medians). The quickstart's DP variants set "
        f"`client.dp.mode` and `client.dp.noise_multiplier = 1.0` (DP-SGD with Poisson batches); their cold round "
        f"also computes the RDP of each client's event for the privacy ledger, once per process (cached). A row "
        f"marked \"imports torch._dynamo\" paid that import (seconds) in its first round.",
    ]
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
