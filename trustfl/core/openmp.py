"""How long torch's idle OpenMP workers spin before they sleep (``GOMP_SPINCOUNT``), set before torch is loaded.

After every parallel operation, libgomp's workers busy-wait for the next one: 300,000 iterations of a pause
instruction when ``OMP_WAIT_POLICY`` is unset. trustfl draws a cohort's noise on Python threads right after the
cohort's parallel matrix products (:func:`trustfl.core.rng.run_draws`); when torch has as many threads as the
machine has cores, the spinning workers take the cores those draws need. A shorter spin (:data:`SPIN_COUNT`) keeps
the workers awake between the ops of one step and lets them sleep before the draws. On a 2-core Xeon a 10-client
DP-SGD ghost step (MLP 784-256-10, batch 256) took 0.89× its time with it, in two runs of
``benchmarks/dp_throughput.py`` (``--gomp-spincount``), Opacus's steps the same in both (``benchmarks/README.md``).

libgomp reads the variable once, when torch loads it, so only a process's entry point can set it: the ``trustfl``
command does (:func:`limit_openmp_spin`). A program that imports torch before trustfl keeps libgomp's setting.
Other OpenMP runtimes (Intel's, LLVM's) ignore the variable.
"""
from __future__ import annotations

import os
import sys

SPIN_COUNT = 50_000
"""libgomp's spin iterations before an idle worker sleeps (its default: 300,000)."""

OPT_OUT = "TRUSTFL_NO_SPIN_LIMIT"
"""Set this environment variable to ``1`` to leave ``GOMP_SPINCOUNT`` alone."""


def limit_openmp_spin() -> str:
    """Set ``GOMP_SPINCOUNT`` to :data:`SPIN_COUNT` for this process and its children, unless it is already set,
    :data:`OPT_OUT` is ``1``, or torch is already imported (too late: libgomp has read its settings); returns what
    is in force, in words."""
    current = os.environ.get("GOMP_SPINCOUNT")
    if current is not None:
        return f"GOMP_SPINCOUNT={current}"
    if os.environ.get(OPT_OUT) == "1":
        return f"GOMP_SPINCOUNT unset ({OPT_OUT}=1)"
    if "torch" in sys.modules:
        return "GOMP_SPINCOUNT unset (torch was imported first)"
    os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    return f"GOMP_SPINCOUNT={SPIN_COUNT}"
