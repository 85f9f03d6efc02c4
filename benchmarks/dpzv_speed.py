"""DPZV speed and party memory: trustfl's vertical engine vs a per-party loop, and one party step's peak memory.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/dpzv_speed.py [--iterations 500] [--repeats 5] [--quick]
[--no-vafl] [--out benchmarks/dpzv_speed.md]`` (the raw numbers go to the ``.json`` beside ``--out``).

1. Iterations per second on configs/dpzv/mnist_dpzv.toml (7 parties of 4 MNIST rows, party MLP 112-64-16, head
   112-64-10, B = 64, 10,000 images, ε = 1): ``VerticalEngine.run_round`` with ``engine.iterations_per_round`` =
   ``--iterations`` (the first round is a warm-up) vs :class:`LoopDPZV`, the same algorithm written as a plain
   per-party loop (an ``nn.Module`` per party, a head module with ``torch.optim.SGD``, one materialised direction
   per iteration), on the same data, initial model, activation order, learning rates, clip and noise. The two
   alternate ``--repeats`` times in one process; the figures are medians of process CPU time on one torch thread
   (wall clock beside them). VAFL (configs/dpzv/mnist_vafl.toml) likewise against :class:`LoopVAFL`.
2. Party memory (the DPZV paper's Fig. 6 in small): one party MLP 112-h1-h2-16 with d_m >= 1 M parameters, run
   through trustfl's ``Party`` and ``DPZV``/``ZOOVFL``/``VAFL`` code paths, each method in a fresh subprocess
   (glibc's mmap threshold fixed at 64 KiB so freed tensors leave the RSS): (a) analytic bytes from tensor sizes,
   (b) peak RSS (``VmHWM``, reset before the steps) minus the RSS after building, (c) the peak of the torch
   allocator's live bytes from ``torch.profiler`` memory events, (d) ``torch.cuda.max_memory_allocated`` when a
   GPU is present. Everything is reported as bytes beyond the parameters, divided by the parameter bytes.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {"dpzv": "configs/dpzv/mnist_dpzv.toml", "vafl": "configs/dpzv/mnist_vafl.toml"}
MEMORY_METHODS = ("dpzv", "zoo_vfl", "vafl", "vafl_momentum")
HIDDEN = ((1024, 896), (2048, 512), (4096, 1024))
MEM_SAMPLES, MEM_STEPS, BATCH, PARTIES, STRIP, EMBED = 2000, 3, 64, 7, 112, 16


# -- 1. iterations per second ---------------------------------------------------------------------------------------
def build(method: str, iterations: int, rounds: int):
    """The federation of ``CONFIGS[method]`` with ``iterations`` per round, and its engine."""
    from trustfl.config.build import build_federation, resolve_engine
    from trustfl.config.load import load_config

    cfg = load_config(os.path.join(ROOT, CONFIGS[method]),
                      [f"engine.iterations_per_round={iterations}", f"rounds={rounds}", "engine.checkpoint_every=0"])
    fed = build_federation(cfg, quiet=True)
    return fed, resolve_engine(cfg), cfg


class _Loop:
    """What both reference loops share: plain modules initialised from trustfl's initial model, the same data."""

    def __init__(self, fed, cfg, cache_forward: bool) -> None:

        setup, init = fed.vertical, fed.initial_params
        slices = fed.model.slices()
        hidden = list(cfg.model.params.get("party_hidden", [64]))
        head_hidden = list(cfg.model.params.get("head_hidden", [64]))
        self.dh = fed.model.embedding_dim
        self.features, self.labels = setup.features, setup.labels
        self.order = setup.order.tolist()
        self.n, self.b, self.m = setup.num_samples, setup.batch_size, setup.num_parties

        def mlp(sizes, last_relu):
            layers = []
            for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
                layers.append(nn.Linear(a, b))
                if i < len(sizes) - 2 or last_relu:
                    layers.append(nn.ReLU())
            return nn.Sequential(*layers)

        self.parties = []
        for k in range(self.m):
            party = mlp([self.features[k].shape[1], *hidden, self.dh], True)
            nn.utils.vector_to_parameters(init[slices[k]].clone(), party.parameters())
            self.parties.append(party)
        self.head = mlp([self.m * self.dh, *head_hidden, int(self.labels.max()) + 1], False)
        nn.utils.vector_to_parameters(init[slices[-1]].clone(), self.head.parameters())
        self.head_opt = torch.optim.SGD(self.head.parameters(), lr=setup.server_lr, momentum=setup.server_momentum)
        self.cache = torch.zeros(self.m, self.n, self.dh)
        if cache_forward:  # DPZV's warm-up pass, as the engine's initial state
            with torch.no_grad():
                for k in range(self.m):
                    self.cache[k] = self.parties[k](self.features[k])
        self.gen = torch.Generator().manual_seed(1)
        self.t = 0

    def run(self, iterations: int) -> float:
        """``iterations`` server iterations; the mean training loss the server saw."""

        total = torch.zeros(())
        for _ in range(iterations):
            total += self.iterate(self.order[self.t])
            self.t += 1
        return float(total) / iterations


class LoopDPZV(_Loop):
    """DPZV (Alg. 1) as a per-party loop: u ~ N(0, I) scaled to the sphere of radius sqrt(d), materialised."""

    def __init__(self, fed, cfg) -> None:
        super().__init__(fed, cfg, cache_forward=True)
        method = fed.vertical.method
        self.lam, self.clip, self.sigma, self.lr = method.smoothing, method.clip, method.noise_std, method.party_lr
        self.params = [list(p.parameters()) for p in self.parties]
        self.numel = [sum(p.numel() for p in ps) for ps in self.params]

    @staticmethod
    def _add(params, u, alpha: float) -> None:
        start = 0
        for p in params:
            p.add_(u[start:start + p.numel()].view_as(p), alpha=alpha)
            start += p.numel()

    def iterate(self, m: int):

        ids = torch.randperm(self.n, generator=self.gen)[:self.b]
        x, params, d = self.features[m][ids], self.params[m], self.numel[m]
        u = torch.randn(d, generator=self.gen)
        u.mul_(math.sqrt(d) / u.norm())
        with torch.no_grad():  # the party: w + λu, w − λu, back to w
            self._add(params, u, self.lam)
            h_plus = self.parties[m](x)
            self._add(params, u, -2 * self.lam)
            h_minus = self.parties[m](x)
            self._add(params, u, self.lam)
        # the server: per-sample losses with the other parties' cached embeddings
        both = self.cache[:, ids].unsqueeze(0).repeat(2, 1, 1, 1)
        both[0, m], both[1, m] = h_plus, h_minus
        inputs = both.permute(0, 2, 1, 3).reshape(2 * self.b, self.m * self.dh)
        losses = F.cross_entropy(self.head(inputs), self.labels[ids].repeat(2), reduction="none")
        f_plus, f_minus = losses.detach().view(2, -1)
        reply = ((f_plus - f_minus) / self.lam).clamp(-self.clip, self.clip).mean()
        reply = reply + self.sigma * torch.randn((), generator=self.gen)
        self.head_opt.zero_grad(set_to_none=True)
        loss = losses.mean()
        loss.backward()
        self.head_opt.step()
        self.cache[m, ids] = (h_plus + h_minus) / 2
        with torch.no_grad():  # the party's step w ← w − η·Δ·u
            self._add(params, u, -self.lr * float(reply))
        return loss.detach()


class LoopVAFL(_Loop):
    """VAFL as a per-party loop: the party back-propagates the server's gradient of its (clipped, noised)
    embedding; one ``torch.optim.SGD`` per party."""

    def __init__(self, fed, cfg) -> None:

        super().__init__(fed, cfg, cache_forward=fed.vertical.cache_init == "forward")
        setup = fed.vertical
        privacy = setup.method.privacy
        self.clip, self.sigma = privacy.clip, privacy.noise_std
        self.opts = [torch.optim.SGD(p.parameters(), lr=setup.method.party_lr, momentum=setup.party_momentum)
                     for p in self.parties]

    def iterate(self, m: int):

        ids = torch.randperm(self.n, generator=self.gen)[:self.b]
        h = self.parties[m](self.features[m][ids])
        clipped = h * (self.clip / h.norm(dim=1, keepdim=True).clamp_min(self.clip))
        message = (clipped.detach() + self.sigma * torch.randn(h.shape, generator=self.gen)).requires_grad_(True)
        inputs = self.cache[:, ids]
        inputs[m] = message
        loss = F.cross_entropy(self.head(inputs.permute(1, 0, 2).reshape(self.b, self.m * self.dh)),
                               self.labels[ids])
        self.head_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.head_opt.step()
        self.cache[m, ids] = message.detach()
        self.opts[m].zero_grad(set_to_none=True)
        clipped.backward(message.grad)
        self.opts[m].step()
        return loss.detach()


def time_speed(method: str, iterations: int, repeats: int) -> dict:
    """Alternate trustfl's rounds and the loop's runs; per-run CPU and wall seconds, losses, medians."""

    fed, engine, cfg = build(method, iterations, repeats + 1)
    loop = (LoopDPZV if method == "dpzv" else LoopVAFL)(fed, cfg)
    state = engine.initial_state(fed)
    state, _ = engine.run_round(fed, state)  # warm-up round (not timed)
    loop.run(iterations)
    runs = {"trustfl": [], "loop": []}
    for r in range(repeats):
        for who in (("trustfl", "loop") if r % 2 == 0 else ("loop", "trustfl")):
            gc.collect()
            c0, w0 = time.process_time(), time.perf_counter()
            if who == "trustfl":
                state, metrics = engine.run_round(fed, state)
                loss = metrics["train_loss"]
            else:
                loss = loop.run(iterations)
            runs[who].append({"cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - w0, "loss": loss})
    out = {"method": method, "config": CONFIGS[method], "iterations": iterations, "repeats": repeats,
           "threads": torch.get_num_threads(), "runs": runs, "info": fed.info["vertical"]}
    for who in runs:
        for clock in ("cpu_s", "wall_s"):
            out[f"{who}_{clock}_median"] = statistics.median(x[clock] for x in runs[who])
        out[f"{who}_its"] = iterations / out[f"{who}_cpu_s_median"]
        out[f"{who}_its_wall"] = iterations / out[f"{who}_wall_s_median"]
    ratios = [iterations / t["cpu_s"] / (iterations / lp["cpu_s"]) for t, lp in zip(runs["trustfl"], runs["loop"])]
    out["ratio_per_repeat"] = ratios
    out["ratio"] = statistics.median(ratios)
    out["ratio_wall"] = statistics.median(lp["wall_s"] / t["wall_s"] for t, lp in zip(runs["trustfl"], runs["loop"]))
    return out


PROFILED = (("Server.losses (head forward)", "trustfl/vertical/server.py", "losses"),
            ("  of which torch.func.functional_call", "torch/_functorch/functional_call.py", "functional_call"),
            ("torch.autograd.grad (head backward)", "torch/autograd/__init__.py", "grad"),
            ("Party.embed (2 party forwards)", "trustfl/vertical/parties.py", "embed"),
            ("direction_scale (the sphere's scale)", "trustfl/vertical/directions.py", "direction_scale"),
            ("add_direction (4 calls: ±λu, restore, step)", "trustfl/vertical/directions.py", "add_direction"),
            ("Server.inputs", "trustfl/vertical/server.py", "inputs"),
            ("Server.step + Server.remember", "trustfl/vertical/server.py", ("step", "remember")),
            ("_finite + torch.where guards", "trustfl/vertical/methods.py", "_finite"),
            ("Iteration.generator (seeded generators)", "trustfl/vertical/methods.py", "generator"),
            ("torch.randperm (batch ids)", "~", "<built-in method torch.randperm>"))


def profile_dpzv(iterations: int) -> dict:
    """cProfile of one trustfl round and one loop run of ``iterations`` DPZV iterations: ms per iteration of the
    main parts (profiling inflates Python-heavy code; an attribution, not a timing)."""
    import cProfile
    import pstats

    fed, engine, cfg = build("dpzv", iterations, 2)
    loop = LoopDPZV(fed, cfg)
    state, _ = engine.run_round(fed, engine.initial_state(fed))
    loop.run(iterations)
    prof = cProfile.Profile()
    prof.runcall(engine.run_round, fed, state)
    stats = pstats.Stats(prof).stats
    rows = {}
    for label, path, names in PROFILED:
        names = (names,) if isinstance(names, str) else names
        rows[label] = sum(v[3] for (f, _, n), v in stats.items() if f.endswith(path) and n in names)
    rows = {k: 1e3 * v / iterations for k, v in rows.items()}
    total = 1e3 * sum(v[3] for (f, _, n), v in stats.items() if f.endswith("trustfl/vertical/engine.py")
                      and n == "run_round") / iterations
    prof = cProfile.Profile()
    prof.runcall(loop.run, iterations)
    loop_total = 1e3 * sum(v[3] for (f, _, n), v in pstats.Stats(prof).stats.items()
                          if f.endswith("dpzv_speed.py") and n == "run") / iterations
    return {"iterations": iterations, "trustfl_ms": total, "loop_ms": loop_total, "parts_ms": rows}


# -- 2. party memory ------------------------------------------------------------------------------------------------
def _sizes(hidden) -> list[int]:
    return [STRIP, *hidden, EMBED]


def party_params(hidden) -> int:
    s = _sizes(hidden)
    return sum(a * b + b for a, b in zip(s[:-1], s[1:]))


def analytic(method: str, hidden) -> dict:
    """Bytes beyond the parameters one party step needs (float32): the paper's accounting ("ideal") and what
    trustfl's code paths allocate ("trustfl"), from tensor sizes."""
    from trustfl.vertical.directions import CHUNK

    p, s = party_params(hidden), _sizes(hidden)
    k = min(p, CHUNK)
    largest = max(a * b for a, b in zip(s[:-1], s[1:]))  # the largest weight matrix
    saved = BATCH * (s[0] + sum(s[1:]))  # autograd keeps each Linear's input and each ReLU's output
    fwd = BATCH * (s[0] + max(a + 2 * b for a, b in zip(s[:-1], s[1:])))  # no graph: a layer's input and outputs
    if method in ("dpzv", "zoo_vfl"):
        ideal = 4 * (k + fwd + 2 * BATCH * EMBED)
        # direction_scale: the float32 chunk g, g.double() and its .square() (8 bytes each) live together
        trustfl = max(4 * k + 8 * k + 8 * k, ideal)
        what = "chunk + one forward (no graph)"
        code = ("the chunk g" + (" (kept in Party.direction_cache: d_m <= CHUNK)" if p <= CHUNK else "")
                + " + g.double() + .square() in direction_scale: 4 + 8 + 8 B per chunk element")
    else:
        momentum = p if method == "vafl_momentum" else 0
        ideal = 4 * (p + momentum + saved)
        # the leaf copy w; during the backward the flat gradient being summed, one zero-padded slice gradient
        # (the backward of a parameter's view into w) and the largest parameter's own gradient; the velocity
        trustfl = 4 * (p + 2 * p + largest + momentum + saved)
        what = "grad" + (" + momentum" if momentum else "") + " + saved activations"
        code = ("w copy + 2 flat grads + largest layer grad" + (" + velocity" if momentum else "")
                + " + saved activations")
    return {"ideal_bytes": ideal, "trustfl_bytes": trustfl, "ideal_terms": what, "trustfl_terms": code}


def _status(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _memory_setup(method: str, hidden, device: str):
    """One party (party 0 of a 7-party VerticalModel), the server, the method and the step's sample ids."""
    from trustfl.models.vertical import VerticalModel
    from trustfl.objectives.builtin import CrossEntropy
    from trustfl.vertical.methods import DPZV, VAFL, ZOOVFL
    from trustfl.vertical.parties import EmbeddingPrivacy, Party
    from trustfl.vertical.server import Server

    blocks = [list(range(STRIP * m, STRIP * (m + 1))) for m in range(PARTIES)]
    model = VerticalModel((28, 28), 10, blocks, party_hidden=list(hidden), embedding_dim=EMBED).to(device)
    master = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    start = 0
    for p in model.parameters():  # every parameter a view into the flat vector, as the engine binds them
        p.data = master[start:start + p.numel()].view_as(p)
        start += p.numel()
    gen = torch.Generator().manual_seed(0)
    features = torch.rand(MEM_SAMPLES, STRIP, generator=gen).to(device)
    labels = torch.randint(10, (MEM_SAMPLES,), generator=gen).to(device)
    slices = model.slices()
    privacy = EmbeddingPrivacy(1.0, 1.0)
    methods = {"dpzv": lambda: DPZV(party_lr=0.01, noise_std=0.3), "zoo_vfl": lambda: ZOOVFL(0.01, privacy=privacy),
               "vafl": lambda: VAFL(0.01, privacy=privacy), "vafl_momentum": lambda: VAFL(0.01, privacy=privacy)}
    party = Party.of(0, model.parties[0], master[slices[0]], features, 0.9 if method == "vafl_momentum" else 0.0)
    cache = torch.zeros(PARTIES, MEM_SAMPLES, EMBED, device=device)
    server = Server(model.head, master[slices[-1]], labels, cache, CrossEntropy(), 0.005, 0.9)
    ids = [torch.randperm(MEM_SAMPLES, generator=gen)[:BATCH].to(device) for _ in range(MEM_STEPS)]
    return {"model": model, "master": master, "party": party, "server": server, "method": methods[method](),
            "ids": ids}


def _steps(s) -> None:
    from trustfl.vertical.methods import Iteration

    for t, ids in enumerate(s["ids"]):
        s["method"].iterate(Iteration(0, t), s["party"], s["server"], ids)


def memory_child(method: str, hidden, device: str) -> dict:
    """Run in a fresh process: the peak bytes ``MEM_STEPS`` party steps of ``method`` add."""

    torch.set_num_threads(1)
    _steps(_memory_setup(method, (8,), device))  # warm-up on a tiny party: lazy initialisation, not the method
    gc.collect()
    out = {"method": method, "hidden": list(hidden), "device": device}
    s = _memory_setup(method, hidden, device)
    out["params"] = s["party"].num_params
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        _steps(s)
        torch.cuda.synchronize()
        out["cuda_bytes"] = torch.cuda.max_memory_allocated() - base
        return out
    gc.collect()
    base = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as fh:  # reset VmHWM to the current RSS
        fh.write("5")
    _steps(s)
    out["rss_bytes"] = _status("VmHWM") - base
    del s
    gc.collect()
    s = _memory_setup(method, hidden, device)  # a fresh party (no momentum buffer yet) for the profiler
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        _steps(s)
    events = sorted((e.start_ns(), i, e.nbytes()) for i, e in enumerate(prof.profiler.kineto_results.events())
                    if e.name() == "[memory]")
    live = peak = 0
    for _, _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    out["profiler_bytes"] = peak
    return out


def measure_memory(method: str, hidden, device: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1", TRUSTFL_NO_MALLOPT="1")
    cmd = [sys.executable, os.path.abspath(__file__), "--memory-child", method,
           "--child-hidden", ",".join(map(str, hidden)), "--child-device", device]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- the record -----------------------------------------------------------------------------------------------------
def machine() -> dict:

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "python": platform.python_version(), "load_average_start": os.getloadavg(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def _mib(x: float) -> str:
    return f"{x / 2 ** 20:.2f}"


def render(result: dict, command: str) -> str:
    mach = result["machine"]
    lines = ["# DPZV speed and party memory", "", f"Command: `{command}`", "",
             f"Machine: {mach['cpu']}, {mach['cores']} cores, torch {mach['torch']} (CPU), {mach['threads']} torch "
             f"thread(s), Python {mach['python']}; GPU: {mach['gpu'] or 'none'}; load average at start "
             f"{mach['load_average_start'][0]:.2f}, at end {result['load_average_end'][0]:.2f}. "
             f"Script run time {result['elapsed_s']:.0f} s.", "",
             "## 1. Server iterations per second (MNIST, 7 parties)", ""]
    speed = result["speed"]
    if speed:
        first = speed[0]
        lines += [f"Each method: `{first['iterations']}` iterations per timed run, {first['repeats']} runs of trustfl "
                  f"(`VerticalEngine.run_round`, one round each after one warm-up round) alternating with "
                  f"{first['repeats']} runs of the per-party loop written in this script (after a warm-up run of the "
                  f"same length); "
                  f"medians of process CPU time (wall clock in brackets). Same data, initial model, activation order, "
                  f"learning rates, clipping and noise; the loop draws its own random numbers, so the trajectories "
                  f"agree in distribution only (mean training loss of the timed runs beside); it has no checks "
                  f"for non-finite messages and no message accounting.", "",
                  "| method | config | trustfl it/s | loop it/s | ratio trustfl/loop (median of the repeats' ratios) | "
                  "ratio per repeat | "
                  "trustfl loss | loop loss |", "|---|---|---|---|---|---|---|---|"]
        for s in speed:
            tl = statistics.mean(x["loss"] for x in s["runs"]["trustfl"])
            ll = statistics.mean(x["loss"] for x in s["runs"]["loop"])
            lines.append(f"| {s['method']} | `{s['config']}` | {s['trustfl_its']:.0f} ({s['trustfl_its_wall']:.0f}) | "
                         f"{s['loop_its']:.0f} ({s['loop_its_wall']:.0f}) | **{s['ratio']:.2f}** "
                         f"({s['ratio_wall']:.2f}) | {', '.join(f'{r:.2f}' for r in s['ratio_per_repeat'])} | "
                         f"{tl:.3f} | {ll:.3f} |")
        dp = next(s for s in speed if s["method"] == "dpzv")
        met = dp["ratio"] >= 1.0
        lines += ["", f"Target (DPZV, trustfl/loop >= 1x): **{'met' if met else 'not met'}** "
                      f"({dp['ratio']:.2f}x; trustfl {dp['trustfl_its']:.0f} it/s, loop {dp['loop_its']:.0f} it/s)."]
    prof = result.get("profile")
    if prof:
        lines += ["", f"Where a DPZV iteration's time goes (cProfile of one more round of {prof['iterations']} "
                      f"iterations and one loop run; profiling inflates Python-heavy code, so these attribute "
                      f"time, they do not time it): trustfl {prof['trustfl_ms']:.2f} ms per iteration, loop "
                      f"{prof['loop_ms']:.2f} ms.", "", "| part of trustfl's iteration | ms per iteration | share |",
                  "|---|---|---|"]
        for label, ms in prof["parts_ms"].items():
            lines.append(f"| {label} | {ms:.3f} | {100 * ms / prof['trustfl_ms']:.0f} % |")
    mem = result["memory"]
    lines += ["", "## 2. Peak memory of one party step beyond its parameters", "",
              f"Party 0 of a 7-party `VerticalModel` (party MLP 112-h1-h2-16, head 112-64-10), B = {BATCH}, "
              f"{MEM_SAMPLES} samples, {MEM_STEPS} steps through trustfl's `Party` and method code "
              f"(`DPZV` with clip 10 and noise, `ZOOVFL` and `VAFL` with embedding clipping and noise; "
              f"`vafl_momentum`: party momentum 0.9), direction chunk `CHUNK` = {result['chunk']:,} elements. "
              "Figures are MiB beyond the party's parameters, and in brackets that divided by the parameter bytes. "
              "Analytic: *ideal* is the paper's accounting (DPZV/ZOO-VFL: one direction chunk + one forward without "
              "a graph; VAFL: gradient (+ momentum) + saved activations), *trustfl* the tensors trustfl's code "
              "allocates (see the terms). Measured: *RSS* = peak RSS (VmHWM, reset before the steps) − RSS after "
              "building, in a fresh subprocess per method with glibc's mmap threshold fixed at 64 KiB; *allocator* = "
              "peak of the torch CPU allocator's live bytes during the steps from `torch.profiler` memory events; "
              f"*CUDA* = `torch.cuda.max_memory_allocated` − allocated before the steps "
              f"({'measured' if mach['gpu'] else 'skipped: no GPU on this machine'}).", "",
              "| party MLP | d_m | params MiB | method | ideal | trustfl (analytic) | RSS | allocator | CUDA | "
              "trustfl terms |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in mem:
        pb = 4 * row["params"]

        def cell(x):
            return "–" if x is None else f"{_mib(x)} ({x / pb:.2f}×)"

        lines.append(f"| 112-{'-'.join(map(str, row['hidden']))}-16 | {row['params']:,} | {_mib(pb)} | "
                     f"{row['method']} | {cell(row['ideal_bytes'])} | {cell(row['trustfl_bytes'])} | "
                     f"{cell(row.get('rss_bytes'))} | {cell(row.get('profiler_bytes'))} | "
                     f"{cell(row.get('cuda_bytes'))} | {row['trustfl_terms']} |")
    lines += ["", "Targets (the paper's claim: DPZV ≈ 1× params plus one forward without a graph and one chunk; "
              "ZOO-VFL a bit more; VAFL > 2× params). Totals below are (params + allocator peak) / params:", ""]
    for hidden in sorted({tuple(r["hidden"]) for r in mem}):
        rows = {r["method"]: r for r in mem if tuple(r["hidden"]) == hidden}
        tot = {m: 1 + r["profiler_bytes"] / (4 * r["params"]) for m, r in rows.items()}
        dp = rows["dpzv"]
        ideal = 1 + dp["ideal_bytes"] / (4 * dp["params"])
        dp_ok = tot["dpzv"] <= 1.1 * ideal
        lines.append(
            f"- 112-{'-'.join(map(str, hidden))}-16 (d_m = {dp['params']:,}): DPZV {tot['dpzv']:.2f}× params against "
            f"{ideal:.2f}× for params + chunk + forward: **{'met' if dp_ok else 'not met'}**"
            + ("" if dp_ok else f" (its extra {_mib(dp['profiler_bytes'])} MiB is direction_scale's float32 chunk "
               f"and two float64 copies of it)") + f". ZOO-VFL {tot['zoo_vfl']:.2f}× "
            f"({'above' if tot['zoo_vfl'] > tot['dpzv'] * 1.01 else 'the same as'} DPZV). VAFL "
            f"{tot['vafl']:.2f}× without party momentum, {tot['vafl_momentum']:.2f}× with it: > 2× "
            f"**{'met' if min(tot['vafl'], tot['vafl_momentum']) > 2 else 'not met'}**; VAFL with momentum / DPZV "
            f"= {tot['vafl_momentum'] / tot['dpzv']:.2f}: DPZV "
            f"{'lighter' if tot['vafl_momentum'] > 1.05 * tot['dpzv'] else 'not lighter (within 5 %)'}.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=500, help="server iterations per timed run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--quick", action="store_true", help="100 iterations, 2 repeats, one model size")
    parser.add_argument("--no-vafl", action="store_true", help="time DPZV only")
    parser.add_argument("--out", help="write the Markdown record here (and the raw numbers to the .json beside)")
    parser.add_argument("--memory-child", choices=MEMORY_METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--child-hidden", help=argparse.SUPPRESS)
    parser.add_argument("--child-device", default="cpu", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    torch.set_num_threads(args.threads)
    if args.memory_child:
        hidden = tuple(int(x) for x in args.child_hidden.split(","))
        print(json.dumps(memory_child(args.memory_child, hidden, args.child_device)))
        return
    from trustfl.engine.allocator import tune_allocator
    from trustfl.vertical.directions import CHUNK

    tune_allocator()  # as run_experiment does; it applies to the loop alike
    start = time.perf_counter()
    iterations, repeats = (100, 2) if args.quick else (args.iterations, args.repeats)
    result = {"machine": machine(), "chunk": CHUNK, "speed": [], "memory": []}
    for method in ("dpzv",) if args.no_vafl else ("dpzv", "vafl"):
        s = time_speed(method, iterations, repeats)
        print(f"{method}: trustfl {s['trustfl_its']:.0f} it/s, loop {s['loop_its']:.0f} it/s, "
              f"ratio {s['ratio']:.2f}", file=sys.stderr)
        result["speed"].append(s)
    result["profile"] = profile_dpzv(iterations)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for hidden in HIDDEN[1:2] if args.quick else HIDDEN:
        for method in MEMORY_METHODS:
            row = {"method": method, "hidden": list(hidden), "params": party_params(hidden), **analytic(method, hidden)}
            for device in devices:
                row.update({k: v for k, v in measure_memory(method, hidden, device).items() if k.endswith("_bytes")})
            print(f"memory {hidden} {method}: " + ", ".join(f"{k} {v / (4 * row['params']):.2f}x"
                                                        for k, v in row.items() if k.endswith("_bytes")),
                  file=sys.stderr)
            result["memory"].append(row)
    result["elapsed_s"] = time.perf_counter() - start
    result["load_average_end"] = os.getloadavg()
    command = " ".join(["OMP_NUM_THREADS=1", ".venv/bin/python", "benchmarks/dpzv_speed.py", *sys.argv[1:]])
    text = render(result, command)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
        with open(os.path.splitext(args.out)[0] + ".json", "w") as fh:
            json.dump({"command": command, **result}, fh, indent=1)


if __name__ == "__main__":
    main()
