"""glibc allocator tuning for batched client tensors.

With glibc's default mmap threshold, tensors of a few MB are mapped and unmapped at every step, and the time goes
into page faults. ``mallopt(M_MMAP_MAX, 0)`` (the in-process form of ``MALLOC_MMAP_MAX_=0``) keeps them on the
heap; ``benchmarks/engine_throughput.py`` measures the effect (see benchmarks/README.md).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

_M_MMAP_MAX = -4
_M_TRIM_THRESHOLD = -1
_applied = False


def tune_allocator() -> bool:
    """Disable mmap and heap trimming for large allocations on glibc (idempotent); whether it is in force.

    Set ``TRUSTFL_NO_MALLOPT=1`` to leave the allocator alone.
    """
    global _applied
    if _applied or os.environ.get("TRUSTFL_NO_MALLOPT") == "1":
        return _applied
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        # no mmap for large blocks, and no trimming of the heap top (1 GiB threshold): freed per-step tensors
        # are reused instead of being returned to the OS and faulted in again.
        _applied = bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30))
    except (OSError, AttributeError):
        _applied = False
    return _applied
