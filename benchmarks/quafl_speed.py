"""QuAFL simulation speed: trustfl's async engine vs a straightforward per-client loop (QuAFL issue acceptance).

Acceptance: QuAFL with n = 100, s = 10, K = 5, MLP 784-200-200-10, 200 server rounds runs in at most 0.5x the
time of a per-client loop implementation of the same algorithm written here, both measured in one invocation.

Run: ``.venv/bin/python benchmarks/quafl_speed.py [--rounds 200] [--quick] [--batch-size 128] [--threads N]
[--processes 3] [--device cuda] [--out benchmarks/quafl_speed.md]``. Every variant (:data:`VARIANTS`) runs in fresh
processes, ``--processes`` times each, interleaved, and the table gives medians: glibc's allocator setting is
process-wide, and the plain loop's time moves from one process to the next on the project's VMs. trustfl is timed as
every run applies it (``tune_allocator`` at start-up) and without it; the loop with and without it, and the ratios
divide by the loop's faster setting.

"The same algorithm" (QuAFL's Algorithm 1, structured as the authors' code): n = 100 clients, each an
``nn.Module`` MLP 784-200-200-10 with its own ``torch.optim.SGD`` (lr 0.05, created once), plus a server module.
Each round the server samples s = 10 clients uniformly; each client draws K = 5 fresh step durations
(exponential, mean 8 for the 25 slow clients, 2 for the others: the speed model of trustfl's
``exponential_groups``) and runs the steps that complete strictly before the server time (at most K; trustfl's
``simtime`` semantics), each on a random minibatch of its own rows; it sends a copy of its state_dict (identity
quantizer), mixes ``current = p*Dec(server) + (1-p)*current`` with p = 1/(s+1) and restarts at the server time;
then ``server = p*server + (1-p)*mean(messages)`` and the server time advances by sit = 10. trustfl runs the
``quafl`` recipe on the ``async`` engine with the same n, s, K, batch size, lr, speed model, sit and data tensors,
so both do the same number of SGD steps in expectation (not bitwise the same steps: the random streams differ).
Both start from trustfl's initial model. Rounds 0 and 1 are warm-up (round 0 has no local steps: every clock starts
at 0) and are not timed; no evaluation is timed. The lattice row runs trustfl with the lattice quantizer on both
links (14 bits, step 1e-4, paper mode), which also shortens a round to sit*14/32, against the identity loop.

Two rows are bounds, not methods. ``lean`` (:class:`LeanQuAFL`) is the loop's algorithm, with the loop's random
draws in the loop's order, as straight-line batched code (the polled clients' steps in one batched computation,
every client's layers kept stacked in the layout their in-place updates want); its worker first checks that it
computes the loop's models. ``floor`` is the batched matrix products of one step alone (:func:`product_floor`).
Until 2026-11-28 the loop's clients all shared one parameter vector (``vector_to_parameters`` makes the parameters
views of the vector it is given, and every client was given the same one): the same work, on one model's memory;
each client now gets its own copy.

``--device cuda`` runs trustfl (``engine.device``), the loop (its modules, optimizers and data) and the floor on
the GPU, and synchronises before each clock reading; the loop draws each step's permutation on the CPU and moves
it, as a data loader would.

On a loaded machine pass ``--threads 1``: with more torch threads than free cores, OpenMP workers spin at every
small op and the per-client loop slows down about 20x (measured on 2 busy cores), which flatters trustfl.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from cpu_info import cpus

N, S, K, SIT, LR, SEED, WARMUP = 100, 10, 5, 10.0, 0.05, 0, 2
SLOW_SHARE, FAST_MEAN, SLOW_MEAN = 0.25, 2.0, 8.0
LATTICE = {"name": "lattice", "bits": 14, "step": 1e-4, "mode": "paper"}


def trustfl_config(batch: int, lattice: bool, mnist: bool, device: str = "cpu") -> dict:
    data = {"dataset": "mnist", "num_clients": N, "partition": {"name": "iid"},
            "options": {"max_train": 60000}} if mnist else {"dataset": "digits", "num_clients": N}
    cfg = {"name": "quafl_speed", "seed": SEED, "rounds": 1, "algorithm": "quafl", "data": data,
           "model": {"name": "mlp", "hidden": [200, 200]}, "cohort": {"sampler": "uniform", "size": S},
           "client": {"steps": K, "batch_size": batch, "lr": LR},
           "engine": {"kind": "async", "checkpoint_every": 0, "interaction_time": SIT,
                      "speed": {"name": "exponential_groups", "slow_share": SLOW_SHARE, "fast_mean": FAST_MEAN,
                                "slow_mean": SLOW_MEAN}}}
    if device != "cpu":
        cfg["engine"]["device"] = device
    if lattice:
        cfg["compress"] = {"uplink": dict(LATTICE), "downlink": dict(LATTICE)}
    return cfg


def build(cfg_dict: dict, batch: int, mnist: bool):
    """The federation and engine of ``cfg_dict``; without MNIST, synthetic data of its shape is installed."""
    from trustfl.config.build import build_federation, resolve_engine
    from trustfl.config.load import config_from_dict

    cfg = config_from_dict(cfg_dict)
    fed = build_federation(cfg, quiet=True)
    if not mnist:  # as benchmarks/engine_throughput.py: 60,000 x 784 Gaussian features, 10 classes, 600 per client
        from trustfl.engine.federation import ClientRows
        from trustfl.engine.local import TrainData
        from trustfl.models.zoo import build_model
        from trustfl.types import ParamLayout
        gen = torch.Generator().manual_seed(0)
        device = fed.initial_params.device  # drawn on the CPU (the same data on every device), then moved
        x = torch.randn(60000, 784, generator=gen).to(device)
        y = torch.randint(0, 10, (60000,), generator=gen).to(device)
        fed.train_data = TrainData({"x": x, "y": y}, 10)
        fed.client_rows = ClientRows(torch.arange(60000), torch.arange(0, 60001, 600))
        fed.batch_sizes = [batch] * N
        fed.noise_multipliers = [0.0] * N
        fed.reports["num_samples"] = torch.full((N,), 600.0, dtype=torch.float64, device=device)
        fed.model = build_model("mlp", (784,), 10, SEED, hidden=[200, 200]).to(device)
        params = {k: v.detach() for k, v in fed.model.named_parameters()}
        fed.layout = ParamLayout.of(params)
        fed.initial_params = fed.layout.flatten(params).clone()
    return fed, resolve_engine(cfg)


def _sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA kernels run asynchronously), so that a clock reading covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_trustfl(fed, engine, rounds: int) -> tuple[float, int]:
    state = engine.initial_state(fed)
    for _ in range(WARMUP):
        state, _ = engine.run_round(fed, state)
    steps = 0
    _sync(fed.initial_params.device)
    start = time.perf_counter()
    for _ in range(rounds):
        state, metrics = engine.run_round(fed, state)
        steps += metrics["local_steps"]
    _sync(fed.initial_params.device)
    return time.perf_counter() - start, steps


class Schedule:
    """What the loop and the lean round share: the clients' speeds and clocks, and the random streams (the polled
    clients, each one's step durations, each step's batch permutation from ``gen``)."""

    def __init__(self) -> None:
        slow = int(np.ceil(SLOW_SHARE * N))
        self.means = [SLOW_MEAN if i < slow else FAST_MEAN for i in range(N)]
        self.client_time = [0.0] * N
        self.server_time = 0.0
        self.p = 1.0 / (S + 1)
        self.sampler, self.np_rng = random.Random(SEED), np.random.default_rng(SEED)
        self.gen = torch.Generator().manual_seed(SEED)

    def steps_done(self, i: int) -> int:
        """Client ``i``'s steps of fresh durations while ``taken < K and client.time + next_step_time <
        server.time``."""
        durations = self.np_rng.exponential(self.means[i], K).tolist()
        taken, t = 0, self.client_time[i]
        while taken < K and t + durations[taken] < self.server_time:
            t += durations[taken]
            taken += 1
        return taken

    def finish_round(self, ids: list[int]) -> None:
        for i in ids:
            self.client_time[i] = self.server_time
        self.server_time += SIT


class LoopQuAFL(Schedule):
    """The reference: QuAFL as the authors' code is structured (one module and optimizer per client)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, rows: list[torch.Tensor], init: torch.Tensor,
                 batch: int) -> None:
        super().__init__()
        self.x, self.y, self.rows, self.batch = x.reshape(x.shape[0], -1), y, rows, batch
        self.device = x.device  # the data's; each step's permutation is drawn on the CPU and moved, as a loader would
        self.server = self._mlp(init)
        self.clients = [self._mlp(init) for _ in range(N)]
        self.opts = [torch.optim.SGD(c.parameters(), lr=LR) for c in self.clients]

    @staticmethod
    def _mlp(init: torch.Tensor) -> torch.nn.Module:
        model = torch.nn.Sequential(torch.nn.Linear(784, 200), torch.nn.ReLU(), torch.nn.Linear(200, 200),
                                    torch.nn.ReLU(), torch.nn.Linear(200, 10))
        model.to(init.device)
        # a copy: vector_to_parameters makes the parameters views of the vector, which every client would share
        torch.nn.utils.vector_to_parameters(init.clone(), model.parameters())
        return model

    def _step(self, i: int) -> None:
        rows = self.rows[i]
        idx = rows[torch.randperm(rows.numel(), generator=self.gen)[:self.batch].to(self.device)]
        self.opts[i].zero_grad(set_to_none=True)
        F.cross_entropy(self.clients[i](self.x[idx]), self.y[idx]).backward()
        self.opts[i].step()

    @torch.no_grad()
    def round(self) -> int:
        p, steps, messages = self.p, 0, []
        server_msg = {k: v.clone() for k, v in self.server.state_dict().items()}  # Enc(X_t), once per round
        ids = self.sampler.sample(range(N), S)
        for i in ids:
            taken = self.steps_done(i)
            with torch.enable_grad():
                for _ in range(taken):
                    self._step(i)
            steps += taken
            current = self.clients[i].state_dict()
            messages.append({k: v.clone() for k, v in current.items()})  # Enc(Y^i), identity quantizer
            for k, v in current.items():  # current = p*Dec(key=current, Enc(X_t)) + (1-p)*current
                v.mul_(1 - p).add_(server_msg[k], alpha=p)
        for k, v in self.server.state_dict().items():  # server = p*server + (1-p)*mean Dec(key=server, msg)
            v.mul_(p).add_(torch.stack([m[k] for m in messages]).mean(0), alpha=1 - p)
        self.finish_round(ids)
        return steps


class LeanQuAFL(Schedule):
    """A bound, not a method: the loop's algorithm, with its random draws in its order, as straight-line batched code.

    Every client's layers live in stacked tensors ``(n, in, out)`` (the layout in which a batched weight-gradient
    product updates them in place); a round gathers the polled clients' rows, runs their steps as one batched
    computation (a client whose steps are done gets a zero output gradient, so its update adds exact zeros), fuses
    each weight's SGD update into the product computing its gradient, mixes and scatters back. No checks and no
    generality: what the batched computation costs without a library around it, for
    judging how far trustfl's executor is from what this machine allows. :func:`lean_vs_loop` checks that it
    computes the loop's models (same batches, same updates, float rounding apart)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, rows: list[torch.Tensor], init: torch.Tensor,
                 batch: int) -> None:
        super().__init__()
        self.x, self.y, self.batch = x.reshape(x.shape[0], -1), y, batch
        self.rows = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True).to(x.device)  # (n, most rows)
        self.sizes = [int(r.numel()) for r in rows]
        shapes = [(200, 784), (200,), (200, 200), (200,), (10, 200), (10,)]
        parts = init.split([int(np.prod(sh)) for sh in shapes])
        self.server = [t.view(sh).t().contiguous() if len(sh) == 2 else t.clone() for t, sh in zip(parts, shapes)]
        self.clients = [t.unsqueeze(0).repeat(N, *([1] * t.dim())) for t in self.server]  # (n, in, out) and (n, out)

    @torch.no_grad()
    def round(self) -> int:
        ids = self.sampler.sample(range(N), S)
        done = [self.steps_done(i) for i in ids]
        steps = max(done)
        ids_t = torch.tensor(ids)
        pos = torch.zeros(max(steps, 1), S, self.batch, dtype=torch.long)  # a finished client re-reads row 0
        for j, (i, n) in enumerate(zip(ids, done)):  # the loop's permutations, in its order
            for step in range(n):
                pos[step, j] = torch.randperm(self.sizes[i], generator=self.gen)[:self.batch]
        pos = pos.to(self.x.device)
        rows = torch.gather(self.rows[ids_t.to(self.x.device)].unsqueeze(0).expand(pos.shape[0], -1, -1), 2, pos)
        (w1, b1, w2, b2, w3, b3) = layers = [t.index_select(0, ids_t.to(t.device)) for t in self.clients]
        active = (torch.arange(steps).unsqueeze(1) < torch.tensor(done).unsqueeze(0)).to(self.x.device)
        for step in range(steps):
            flat = rows[step].reshape(-1)
            h0 = self.x.index_select(0, flat).view(S, self.batch, -1)
            h1 = torch.baddbmm(b1.unsqueeze(1), h0, w1).relu_()
            h2 = torch.baddbmm(b2.unsqueeze(1), h1, w2).relu_()
            logits = torch.baddbmm(b3.unsqueeze(1), h2, w3)
            g3 = logits.softmax(-1)  # the mean cross-entropy's output gradient: (softmax − one-hot) / B
            g3.view(-1, 10)[torch.arange(flat.numel(), device=flat.device), self.y.index_select(0, flat)] -= 1.0
            g3.mul_(torch.where(active[step], 1.0 / self.batch, 0.0).view(S, 1, 1))
            g2 = torch.bmm(g3, w3.transpose(1, 2)).mul_(h2 > 0)
            g1 = torch.bmm(g2, w2.transpose(1, 2)).mul_(h1 > 0)
            for w, b, h, g in ((w3, b3, h2, g3), (w2, b2, h1, g2), (w1, b1, h0, g1)):
                w.baddbmm_(h.transpose(1, 2), g, alpha=-LR)
                b.sub_(g.sum(1), alpha=LR)
        for server, client, new in zip(self.server, self.clients, layers):
            old = server.clone()  # Enc(X_t): the model every polled client mixes in
            server.mul_(self.p).add_(new.mean(0), alpha=1 - self.p)
            client.index_copy_(0, ids_t.to(client.device), new.mul_(1 - self.p).add_(old, alpha=self.p))
        self.finish_round(ids)
        return sum(done)

    def server_model(self) -> torch.Tensor:
        """The server's flat model, in the layout of trustfl's parameters (and the loop's)."""
        return torch.cat([t.t().reshape(-1) if t.dim() == 2 else t for t in self.server])


def lean_vs_loop(fed, batch: int, rounds: int = 3) -> float:
    """Max |difference| of the server models after ``rounds`` rounds of :class:`LeanQuAFL` and :class:`LoopQuAFL`
    from the same start: the same draws, so the same steps; only float rounding differs."""
    args = (fed.train_data.tensors["x"], fed.train_data.tensors["y"], [fed.client_rows[c] for c in range(N)],
            fed.initial_params, batch)
    lean, loop = LeanQuAFL(*args), LoopQuAFL(*args)
    for _ in range(rounds):
        lean.round()
        loop.round()
    with torch.no_grad():
        loop_model = torch.nn.utils.parameters_to_vector(loop.server.parameters())
    return float((lean.server_model() - loop_model).abs().max())


def time_reference(kind: type[Schedule], fed, batch: int, rounds: int) -> tuple[float, int]:
    """Seconds and local steps of ``rounds`` timed rounds of the loop or the lean round (``kind``) on ``fed``'s data,
    after the warm-up rounds."""
    ref = kind(fed.train_data.tensors["x"], fed.train_data.tensors["y"], [fed.client_rows[c] for c in range(N)],
               fed.initial_params, batch)
    for _ in range(WARMUP):
        ref.round()
    steps = 0
    _sync(ref.x.device)
    start = time.perf_counter()
    for _ in range(rounds):
        steps += ref.round()
    _sync(ref.x.device)
    return time.perf_counter() - start, steps


VARIANTS = ("loop", "loop_mallopt", "trustfl", "trustfl_glibc", "lattice", "lean", "floor")
"""Each timed in its own processes: the plain loop with glibc's default allocator settings and with the setting
every trustfl run applies at start-up (``trustfl.engine.allocator.tune_allocator``); trustfl as it runs (the
setting on) and with ``TRUSTFL_NO_MALLOPT=1``; trustfl with the lattice quantizer (setting on); the lean batched
round (:class:`LeanQuAFL`, setting on); the matrix-product floor (:func:`product_floor`)."""


def product_floor(batch: int, repeats: int = 100, device: str = "cpu") -> float:
    """Seconds per client step of the batched matrix products of one s-client MLP step alone (forward, the input
    gradients of layers 2 and 3, the weight gradients; ``torch.bmm`` into preallocated outputs, median of
    ``repeats``): what an executor doing these products at their own speed and nothing else would take."""
    dims = [784, 200, 200, 10]
    x = [torch.randn(S, batch, d, device=device) for d in dims]  # each layer's input (d = 10: the output's gradient)
    w = [torch.randn(S, a, b, device=device) for a, b in zip(dims[:-1], dims[1:])]
    grads = [torch.randn(S, batch, d, device=device) for d in dims[1:]]  # gradients of the layers' outputs
    products = [(x[i], w[i]) for i in range(3)]  # forward
    products += [(grads[i], w[i].transpose(1, 2)) for i in (1, 2)]  # input gradients of layers 2 and 3
    products += [(x[i].transpose(1, 2), grads[i]) for i in range(3)]  # weight gradients
    outs = [torch.empty(S, a.shape[1], b.shape[2], device=device) for a, b in products]
    times = []
    for _ in range(repeats + 5):
        _sync(outs[0].device)
        start = time.perf_counter()
        for (a, b), out in zip(products, outs):
            torch.bmm(a, b, out=out)
        _sync(outs[0].device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[5:]) / S


def worker(variant: str, rounds: int, batch: int, threads: int, device: str = "cpu") -> dict:
    """One variant's timed rounds in this process (``--worker``)."""
    if threads:
        torch.set_num_threads(threads)
    mallopt = variant in ("loop_mallopt", "trustfl", "lattice", "lean", "floor")
    if mallopt:
        from trustfl.engine.allocator import tune_allocator
        mallopt = tune_allocator()
    from trustfl.data.datasets import dataset_available
    mnist = dataset_available("mnist")
    if variant == "floor":
        return {"variant": variant, "seconds_per_step": product_floor(batch, device=device), "mallopt": mallopt,
                "mnist": mnist, "threads": torch.get_num_threads()}
    fed, engine = build(trustfl_config(batch, variant == "lattice", mnist, device), batch, mnist)
    extra = {"lean_vs_loop": lean_vs_loop(fed, batch)} if variant == "lean" else {}
    seconds, steps = (time_reference(LoopQuAFL, fed, batch, rounds) if variant.startswith("loop") else
                      time_reference(LeanQuAFL, fed, batch, rounds) if variant == "lean" else
                      time_trustfl(fed, engine, rounds))
    gpu = torch.cuda.get_device_name(fed.initial_params.device) if fed.initial_params.is_cuda else None
    return {"variant": variant, "seconds": seconds, "steps": steps, "mallopt": mallopt, "mnist": mnist,
            "threads": torch.get_num_threads(), "gpu": gpu, **extra}


def _spawn(variant: str, rounds: int, batch: int, threads: int, device: str = "cpu") -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_MAX_", "TRUSTFL_NO_MALLOPT")}
    if variant == "trustfl_glibc":
        env["TRUSTFL_NO_MALLOPT"] = "1"
    cmd = [sys.executable, __file__, "--worker", variant, "--rounds", str(rounds), "--batch-size", str(batch),
           "--threads", str(threads), "--device", device]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="20 rounds")
    parser.add_argument("--batch-size", type=int, default=128, help="the paper's MNIST batch")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--processes", type=int, default=3,
                        help="fresh processes per variant, interleaved; the table gives medians (min-max)")
    parser.add_argument("--out", help="also write the command and the table to this Markdown file")
    parser.add_argument("--device", default="cpu", help="where trustfl and the loop compute: cpu (default) or cuda")
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    rounds = 20 if args.quick else args.rounds
    if args.worker:
        print(json.dumps(worker(args.worker, rounds, args.batch_size, args.threads, args.device)))
        return
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for _ in range(max(args.processes, 1)):  # interleaved: a slow spell of the machine hits every variant alike
        for variant in VARIANTS:
            res = _spawn(variant, rounds, args.batch_size, args.threads, args.device)
            runs[variant].append(res)
            print(f"  {variant:14s} " + (f"{1e3 * res['seconds_per_step']:.2f} ms/step" if variant == "floor" else
                                         f"{res['seconds']:.2f} s, {res['steps']} steps"), file=sys.stderr)
    n = max(args.processes, 1)
    timed = VARIANTS[:-1]
    median = {v: statistics.median(r["seconds"] for r in runs[v]) for v in timed}
    per_step = {v: statistics.median(r["seconds"] / max(r["steps"], 1) for r in runs[v]) for v in timed}
    per_step["floor"] = statistics.median(r["seconds_per_step"] for r in runs["floor"])
    steps = {v: round(statistics.median(r["steps"] for r in runs[v])) for v in timed}

    def cell(v: str) -> str:
        times = [r["seconds"] for r in runs[v]]
        return f"{median[v]:.2f}" if n == 1 else f"{median[v]:.2f} ({min(times):.2f}–{max(times):.2f})"

    loop = min(("loop", "loop_mallopt"), key=median.__getitem__)
    first = runs["trustfl"][0]
    on_gpu = f"; trustfl and the loop on {first['gpu']}" if first.get("gpu") else ""
    labels = {"loop": "plain loop, glibc defaults", "loop_mallopt": "plain loop, trustfl's allocator setting",
              "trustfl": "trustfl (as every run: allocator setting on)",
              "trustfl_glibc": "trustfl, `TRUSTFL_NO_MALLOPT=1`",
              "lattice": "trustfl, lattice b=14 both ways (sit 4.375)",
              "lean": "bound: the lean batched round (straight-line code in the benchmark, allocator setting on)",
              "floor": f"matrix-product floor: the batched products of one {S}-client step alone"}
    lines = [f"Command: `{' '.join(['.venv/bin/python', *sys.argv])}`", "",
             f"QuAFL, n={N}, s={S}, K={K}, MLP 784-200-200-10, batch {args.batch_size}, lr {LR}, sit {SIT}, "
             f"exponential steps (25% slow, means {SLOW_MEAN:g}/{FAST_MEAN:g}); data: "
             f"{'MNIST' if first['mnist'] else 'synthetic 60,000 x 784 (MNIST absent)'}; {rounds} timed rounds "
             f"after {WARMUP} warm-up; torch threads {first['threads']}, {cpus()}{on_gpu}; wall clock; each variant in "
             f"its own process" + ("." if n == 1 else f", {n} times, interleaved: median (min–max) over them."),
             "", f"The ratios divide by the plain loop's faster setting ({labels[loop]}).", "",
             "| variant | s | steps | ms/step | ratio s | ratio ms/step |", "|---|---|---|---|---|---|"]
    for v in timed:
        lines.append(f"| {labels[v]} | {cell(v)} | {steps[v]} | {1e3 * per_step[v]:.2f} | "
                     f"{median[v] / median[loop]:.2f} | {per_step[v] / per_step[loop]:.2f} |")
    lines.append(f"| {labels['floor']} | | | {1e3 * per_step['floor']:.2f} | | "
                 f"{per_step['floor'] / per_step[loop]:.2f} |")
    ratio = median["trustfl"] / median[loop]
    diff = max(r["lean_vs_loop"] for r in runs["lean"])
    lines += ["", "The lean round computes the loop's models: after 3 rounds from the same start, with the same "
              f"draws, the server models differ by at most {diff:.2e} [{'OK' if diff <= 1e-4 else 'FAIL'} <= 1e-4]."]
    lines += ["", f"Acceptance (trustfl as it runs, identity, time ratio <= 0.5): {'PASS' if ratio <= 0.5 else 'FAIL'} "
              f"({ratio:.2f})"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(f"# QuAFL simulation speed\n\n{text}\n")


if __name__ == "__main__":
    main()
