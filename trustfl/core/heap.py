"""Exempt the objects that importing torch leaves behind from the cyclic garbage collector.

Importing torch leaves about 170,000 tracked objects (modules, classes, functions) that live as long as the
process. CPython's collector walks all of them again at every full collection: about 0.09 s each on a 2-core
machine, and the imports after torch's (trustfl's own, then matplotlib's for the plots) trigger one each.
:func:`freeze_imported` moves the objects alive at that moment to the collector's permanent generation
(``gc.freeze()``), so later collections skip them. Nothing else changes: frozen objects are still freed by
reference counting, and ``gc.unfreeze()`` undoes it. ``benchmarks/startup.py`` measures the start-up it saves.
"""
from __future__ import annotations

import gc

_done = False


def freeze_imported() -> None:
    """``gc.freeze()`` once per process (:mod:`trustfl.experiment` calls it right after ``import torch``)."""
    global _done
    if not _done:
        gc.freeze()
        _done = True
