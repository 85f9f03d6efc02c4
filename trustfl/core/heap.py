"""Start-up: exempt the objects that importing torch leaves behind from the cyclic garbage collector.

Importing torch leaves about 170,000 tracked objects (modules, classes, functions) that live as long as the
process. CPython's collector walks all of them again at every full collection: about 0.09 s each on a 2-core
machine, and the imports after torch's (trustfl's own, then matplotlib's for the plots) trigger one each.
:func:`import_torch` imports torch and, when that import is the process's first (a run starting up), moves the
objects alive at that moment to the collector's permanent generation (``gc.freeze()``), so later collections skip
them. Frozen objects are still freed by reference counting, and ``gc.unfreeze()`` undoes it. A process that had
imported torch before (a notebook, a test session) is left as it is: it may hold cyclic garbage that a freeze would
keep. ``benchmarks/startup.py`` measures the start-up it saves.
"""
from __future__ import annotations

import gc
import sys


def import_torch() -> None:
    """``import torch``, then ``gc.freeze()`` if this call was the process's first import of torch."""
    first = "torch" not in sys.modules
    import torch  # noqa: F401

    if first:
        gc.freeze()
