"""trustfl: trustworthy federated learning on PyTorch.

Privacy mechanisms, compressors, robust aggregators and sync/async schedules are independent stages that any
algorithm can combine. Build any registered component by name:

  >>> import torch, trustfl
  >>> trustfl.build("aggregator", "mean")(torch.tensor([[1.0], [3.0]])).tolist()
  [2.0]

``import trustfl`` is cheap (it imports neither torch nor any other heavy dependency): the names below are loaded
on first use (PEP 562), and the registries import the component packages on the first look-up.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from trustfl.core.lazy import lazy_exports

if TYPE_CHECKING:
    from trustfl.core.registry import build, kinds, lookup, names, register
    from trustfl.errors import TrustFLError

__version__ = "0.1.0"
__all__ = ["TrustFLError", "build", "kinds", "lookup", "names", "register", "__version__"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "trustfl.core.registry": ("build", "kinds", "lookup", "names", "register"),
    "trustfl.errors": ("TrustFLError",),
})
