"""Time every trustfl aggregator and pre-aggregator against ByzFL's implementation of the same rule.

Usage (from the repository root)::

    /tmp/venvtest/bin/python benchmarks/aggregators.py            # n ∈ {15, 100} × d ∈ {1e4, 431,080, 1e6}
    /tmp/venvtest/bin/python benchmarks/aggregators.py --quick    # d = 1e4 only
    /tmp/venvtest/bin/python benchmarks/aggregators.py --rules caf,krum --no-byzfl --threads 1

Messages are float32: ``n − f`` rows ~ N(0, 1) and ``f`` rows sending the ALIE vector (mean + 1.5·std), with
``f = 5`` at ``n = 15`` and ``f = 10`` at ``n = 100``. Each cell is the best of up to ``--repeats`` runs (fewer when
one run takes over 2 s). "peak MB" is the growth of the process's peak RSS during the trustfl runs (Linux
``/proc/self/clear_refs``): the fresh memory the rule needed beyond its input (0 when the allocator could reuse
memory it already held).

ByzFL (benchmark-only peer, never a runtime dependency): ``pip install --no-deps byzfl==0.0.11`` into the venv.
Its package ``__init__`` imports a torchvision-based module, so an empty ``byzfl.benchmark`` is put in
``sys.modules`` first. Differences in semantics (noted in the table): ByzFL's geometric median runs 3 Weiszfeld
steps (ours runs to a tolerance), its Krum uses ``n − f − 1`` neighbours (ours ``n − f − 2``), its CAF does one
random power iteration per pass (ours is exact, or a converged power method), and its Clipping/ARC modify their
input in place (a fresh copy is made outside the timed region).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trustfl  # noqa: E402

FULL_D = (10_000, 431_080, 1_000_000)
F_OF_N = {15: 5, 100: 10}
BYZFL_NNM_LIMIT = 2 * 2**30  # ByzFL's NNM materialises an (n, n − f, d) float32 tensor


def load_byzfl() -> Any | None:
    sys.modules.setdefault("byzfl.benchmark", types.ModuleType("byzfl.benchmark"))
    try:
        import byzfl
    except ImportError:
        return None
    return byzfl


def trustfl_rules(f: int) -> list[tuple[str, str, Callable[[], Any], dict[str, Any]]]:
    """(label, kind, builder, params); the label is the table's rule column."""
    agg, pre = "aggregator", "pre_aggregator"
    return [
        ("mean", agg, lambda: trustfl.build(agg, "mean"), {}),
        ("cwtm", agg, lambda: trustfl.build(agg, "cwtm", f=f), {}),
        ("cwmed", agg, lambda: trustfl.build(agg, "cwmed"), {}),
        ("meamed", agg, lambda: trustfl.build(agg, "meamed", f=f), {}),
        ("geometric_median", agg, lambda: trustfl.build(agg, "geometric_median"), {}),
        ("krum", agg, lambda: trustfl.build(agg, "krum", f=f), {}),
        ("multi_krum", agg, lambda: trustfl.build(agg, "multi_krum", f=f), {}),
        ("mda", agg, lambda: trustfl.build(agg, "mda", f=f), {}),
        ("centered_clipping", agg, lambda: trustfl.build(agg, "centered_clipping", tau=100.0), {}),
        ("caf", agg, lambda: trustfl.build(agg, "caf", f=f), {}),
        ("caf (power)", agg, lambda: trustfl.build(agg, "caf", f=f, method="power"), {}),
        ("nnm", pre, lambda: trustfl.build(pre, "nnm", f=f), {}),
        ("bucketing", pre, lambda: trustfl.build(pre, "bucketing", bucket_size=2), {}),
        ("static_clip", pre, lambda: trustfl.build(pre, "static_clip", max_norm=2.0), {}),
        ("static_clip (in place)", pre, lambda: trustfl.build(pre, "static_clip", max_norm=2.0, in_place=True), {}),
        ("arc", pre, lambda: trustfl.build(pre, "arc", f=f), {}),
        ("arc (in place)", pre, lambda: trustfl.build(pre, "arc", f=f, in_place=True), {}),
    ]


def byzfl_rule(byzfl: Any, label: str, f: int) -> tuple[Callable[[], Any] | None, bool]:
    """(factory of a fresh ByzFL instance, whether it modifies its input)."""
    table = {
        "mean": (lambda: byzfl.Average(), False), "cwtm": (lambda: byzfl.TrMean(f), False),
        "cwmed": (lambda: byzfl.Median(), False), "meamed": (lambda: byzfl.Meamed(f), False),
        "geometric_median": (lambda: byzfl.GeometricMedian(), False), "krum": (lambda: byzfl.Krum(f), False),
        "multi_krum": (lambda: byzfl.MultiKrum(f), False), "mda": (lambda: byzfl.MDA(f), False),
        "centered_clipping": (lambda: byzfl.CenteredClipping(tau=100.0), False),
        "caf": (lambda: byzfl.CAF(f), False), "caf (power)": (lambda: byzfl.CAF(f), False),
        "nnm": (lambda: byzfl.NNM(f), False), "bucketing": (lambda: byzfl.Bucketing(2), False),
        "static_clip": (lambda: byzfl.Clipping(2.0), True), "arc": (lambda: byzfl.ARC(f), True),
        "static_clip (in place)": (lambda: byzfl.Clipping(2.0), True), "arc (in place)": (lambda: byzfl.ARC(f), True),
    }
    return table.get(label, (None, False))


def peak_rss_reset() -> int | None:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return _status("VmRSS")
    except OSError:
        return None


def _status(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    return 0


def best_time(fn: Callable[[], Any], repeats: int, fresh_input: Callable[[], Any] | None = None) -> float:
    best = math.inf
    for _ in range(repeats):
        arg = fresh_input() if fresh_input else None
        start = time.perf_counter()
        fn() if arg is None else fn(arg)
        best = min(best, time.perf_counter() - start)
        if best > 2.0:
            break
    return best


def messages(n: int, f: int, d: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(n * 7 + d)
    x = torch.randn(n, d, generator=gen)
    honest = x[f:]
    x[:f] = honest.mean(0) + 1.5 * honest.std(0)
    return x


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    byzfl = None if args.no_byzfl else load_byzfl()
    if byzfl is None and not args.no_byzfl:
        print("ByzFL is not installed: `pip install --no-deps byzfl==0.0.11`; timing trustfl only.", file=sys.stderr)
    wanted = set(args.rules.split(",")) if args.rules else None
    rows = []
    for n in args.n:
        f = F_OF_N.get(n, (n - 1) // 4)
        for d in args.d:
            x = messages(n, f, d)
            for label, kind, make, _ in trustfl_rules(f):
                if wanted and label not in wanted:
                    continue
                row: dict[str, Any] = {"rule": label, "n": n, "d": d, "note": ""}
                if label == "mda" and math.comb(n, f) > 1_000_000:
                    row["note"] = f"skipped: C({n}, {f}) = {math.comb(n, f):.2g} subsets (beyond reach)"
                    rows.append(row)
                    print(row, file=sys.stderr, flush=True)
                    continue
                stage = make()
                in_place = getattr(stage, "in_place", False)
                stage(x.clone() if in_place else x)  # warm-up (and registry/plugin loading)
                base = peak_rss_reset()
                row["trustfl"] = (best_time(lambda v: stage(v), args.repeats, fresh_input=x.clone) if in_place
                                  else best_time(lambda: stage(x), args.repeats))
                if base is not None:
                    row["peak_mb"] = max(_status("VmHWM") - base, 0) / 2**20
                if label in ("caf", "caf (power)", "geometric_median"):
                    out = stage.apply(x, stage.init(None), _ctx(n))
                    row["note"] = f"{out.metrics['iterations']:.0f} iterations"
                factory, mutates = byzfl_rule(byzfl, label, f) if byzfl else (None, False)
                if factory is not None and label == "nnm" and n * (n - f) * d * 4 > BYZFL_NNM_LIMIT:
                    gb = n * (n - f) * d * 4 / 2**30
                    row["note"] = f"ByzFL skipped: its NNM allocates an (n, n−f, d) tensor ({gb:.1f} GB)"
                    factory = None
                if factory is not None:
                    if mutates and in_place:
                        row["byzfl"] = best_time(lambda v: factory()(v), args.repeats, fresh_input=x.clone)
                        row["note"] = "both clip in place (input copies made outside the timing)"
                    elif mutates:
                        row["byzfl"] = best_time(lambda v: factory()(v), args.repeats, fresh_input=x.clone)
                        copy = best_time(x.clone, args.repeats)
                        row["note"] = (f"ByzFL clips in place (copy made outside the timing), trustfl returns a new "
                                       f"matrix; ByzFL with the copy a caller needs to keep its messages: "
                                       f"{row['byzfl'] + copy:.3f} s")
                    else:
                        row["byzfl"] = best_time(lambda: factory()(x), args.repeats)
                    row["ratio"] = row["trustfl"] / row["byzfl"]
                rows.append(row)
                print(row, file=sys.stderr, flush=True)
            del x
    return rows


def _ctx(n: int):
    from trustfl.types import RoundContext
    return RoundContext(round=0, seed=0, client_ids=tuple(range(n)), num_clients=n)


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| rule | n | d | trustfl s | byzfl s | ratio | peak MB | notes |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    fmt = lambda v, p: "–" if v is None else f"{v:.{p}f}"  # noqa: E731
    for r in rows:
        lines.append(f"| {r['rule']} | {r['n']} | {r['d']:,} | {fmt(r.get('trustfl'), 3)} | {fmt(r.get('byzfl'), 3)} "
                     f"| {fmt(r.get('ratio'), 2)} | {fmt(r.get('peak_mb'), 0)} | {r['note']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="d = 1e4 only (n = 15 and 100)")
    parser.add_argument("--n", type=int, nargs="+", default=[15, 100])
    parser.add_argument("--d", type=int, nargs="+", default=list(FULL_D))
    parser.add_argument("--rules", default="", help="comma-separated table labels, e.g. caf,krum")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-byzfl", action="store_true")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    parser.add_argument("--out", default=None, help="also write the table to this Markdown file (e.g. "
                                                     "benchmarks/aggregators_timing.md, which "
                                                     "benchmarks/cafcor.md embeds)")
    parser.add_argument("--no-allocator-tuning", action="store_true",
                        help="leave glibc's allocator alone (trustfl runs apply "
                             "trustfl.engine.allocator.tune_allocator)")
    args = parser.parse_args()
    if not args.no_allocator_tuning:
        # As in every trustfl run (run_experiment): freed (n, d) buffers are reused, not returned to the OS and
        # faulted in again, which is what a fresh output matrix costs otherwise. Applies to both libraries.
        from trustfl.engine.allocator import tune_allocator
        tune_allocator()
    if args.quick:
        args.d = [10_000]
    if args.threads:
        torch.set_num_threads(args.threads)
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    head = (f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs (load average "
            f"{load}), float32; f = 5 at n = 15, f = 10 at n = 100; ratio = trustfl / byzfl (< 1: trustfl faster); "
            f"glibc allocator {'as is' if args.no_allocator_tuning else 'tuned as in trustfl runs'}\n")
    print(head)
    table = markdown(run(args))
    print(table)
    if args.out:
        command = "python benchmarks/aggregators.py " + " ".join(sys.argv[1:])
        Path(args.out).write_text(f"Command: `{command}`\n\n{head}\n{table}\n")


if __name__ == "__main__":
    main()
