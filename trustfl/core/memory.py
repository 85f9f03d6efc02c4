"""Failed allocations as errors a user can act on.

An allocation that fails (Python's MemoryError, NumPy's, torch's CPU or CUDA allocator, or torch's size
computation overflowing) is not a bug in trustfl but a setting larger than the machine: :func:`out_of_memory_as_error`
turns it into a :class:`~trustfl.errors.ResourceError` that says what was running, how much it asked for and which
settings size it. Every other error passes unchanged. Where the size of a request is known before it is made,
:func:`refuse_beyond_free` fails it up front: on a machine that overcommits memory a request larger than the machine
can succeed and the process be killed (or the machine stall) only when the memory is first written.
"""
from __future__ import annotations

import contextlib
import os
import re
from typing import Iterator

import torch

from trustfl.errors import ResourceError

_OUT_OF_MEMORY = ("can't allocate memory", "out of memory", "storage size calculation overflowed")
_AMOUNT = re.compile(r"allocate (\d+) bytes|allocate ([\d.]+ [KMGTPE]?i?B)")


def format_bytes(nbytes: int) -> str:
    """``nbytes`` in GB (from 1 GB up) or MB, one decimal."""
    return f"{nbytes / 1e9:,.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:,.1f} MB"


@contextlib.contextmanager
def out_of_memory_as_error(what: str, sized_by: str) -> Iterator[None]:
    """Turn a failed allocation inside the block into a ResourceError: "``what`` needs more memory than this
    machine has (N asked for): lower ``sized_by`` ..."; other errors pass unchanged."""
    try:
        yield
    except (MemoryError, RuntimeError) as err:
        text = str(err)
        if not isinstance(err, MemoryError) and not any(m in text.lower() for m in _OUT_OF_MEMORY):
            raise
        asked = _AMOUNT.search(text)
        amount = "" if asked is None else (f" ({format_bytes(int(asked.group(1)))} asked for)" if asked.group(1)
                                           else f" ({asked.group(2)} asked for)")
        raise ResourceError(f"{what} needs more memory than this machine has{amount}: lower {sized_by} or use a "
                            f"larger machine.") from None


def free_memory(device: torch.device | str) -> int:
    """Bytes free on ``device``: CUDA's free memory (with the blocks torch's allocator caches), or the operating
    system's ``MemAvailable`` for the CPU."""
    device = torch.device(device)
    if device.type == "cuda":  # the driver's free memory, plus what torch's caching allocator holds unused
        free, _ = torch.cuda.mem_get_info(device)
        return int(free) + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:  # other POSIX systems: free pages (a lower bound of what can be had)
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 8 << 30  # unknown: assume a small machine


def refuse_beyond_free(nbytes: int, device: torch.device | str = "cpu") -> None:
    """A MemoryError (which :func:`out_of_memory_as_error` reports) when ``nbytes`` exceed the memory free on
    ``device``, before anything is allocated."""
    free = free_memory(device)
    if nbytes > free:
        raise MemoryError(f"can't allocate memory: asked to allocate {nbytes} bytes with {free} bytes free")
