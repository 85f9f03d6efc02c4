"""Failed allocations as errors a user can act on.

An allocation that fails (Python's MemoryError, NumPy's, torch's CPU or CUDA allocator, or torch's size
computation overflowing) is not a bug in trustfl but a setting larger than the machine: :func:`out_of_memory_as_error`
turns it into a :class:`~trustfl.errors.ResourceError` that says what was running, how much it asked for and which
settings size it. Every other error passes unchanged.
"""
from __future__ import annotations

import contextlib
import re
from typing import Iterator

from trustfl.errors import ResourceError

_OUT_OF_MEMORY = ("can't allocate memory", "out of memory", "storage size calculation overflowed")
_AMOUNT = re.compile(r"allocate (\d+) bytes|allocate ([\d.]+ [KMGTPE]?i?B)")


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
        amount = "" if asked is None else (f" ({int(asked.group(1)) / 1e9:,.1f} GB asked for)" if asked.group(1)
                                           else f" ({asked.group(2)} asked for)")
        raise ResourceError(f"{what} needs more memory than this machine has{amount}: lower {sized_by} or use a "
                            f"larger machine.") from None
