"""Where a FedAvg round's time goes: one round of ``benchmarks/scale.py``'s setting (MLP 784-200-200-10, 600
examples per client held on the device, batch 32, one epoch) under ``torch.profiler``, with the allocator setting
of every trustfl run (applied by ``scale._federation``).

Prints the round's wall time (after two warm-up rounds), the operators by device time (CUDA) or host time (CPU),
and the host synchronisations seen.

Run: ``.venv/bin/python benchmarks/profile_round.py [--device cpu|cuda] [--clients 100] [--rows 30]
[--sync-debug]``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--samples-per-client", type=int, default=600)
    parser.add_argument("--rows", type=int, default=30, help="operators listed per table")
    parser.add_argument("--sync-debug", action="store_true",
                        help="CUDA: run one more round with torch.cuda.set_sync_debug_mode('warn'), which prints where "
                             "each host synchronisation comes from")
    args = parser.parse_args()

    import torch
    from scale import _federation
    from trustfl.engine.sync import initial_state, run_round

    fed = _federation("mlp", args.clients, args.samples_per_client, 0, args.device, resident=True)
    state = initial_state(fed)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    for _ in range(2):
        state, _ = run_round(fed, state)
    sync()
    start = time.perf_counter()
    state, _ = run_round(fed, state)
    sync()
    print(f"round: {time.perf_counter() - start:.4f} s ({args.clients} clients, {args.device})")
    activities = [torch.profiler.ProfilerActivity.CPU]
    if args.device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        state, _ = run_round(fed, state)
        sync()
    table = prof.key_averages()
    if args.device == "cuda":
        print(table.table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=60))
    print(table.table(sort_by="cpu_time_total", row_limit=args.rows, max_name_column_width=60))
    for event in table:
        if "Synchronize" in event.key or event.key in ("aten::item", "aten::_local_scalar_dense"):
            print(f"host sync: {event.key} x {event.count}")
    if args.sync_debug and args.device == "cuda":
        torch.cuda.set_sync_debug_mode("warn")
        state, _ = run_round(fed, state)
        torch.cuda.set_sync_debug_mode("default")


if __name__ == "__main__":
    main()
