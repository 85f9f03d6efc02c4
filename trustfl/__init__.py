"""trustfl: trustworthy federated learning on PyTorch.

Privacy mechanisms, compressors, robust aggregators and sync/async schedules are independent stages that any
algorithm can combine. Build any registered component by name:

  >>> import torch, trustfl
  >>> trustfl.build("aggregator", "mean")(torch.tensor([[1.0], [3.0]])).tolist()
  [2.0]
"""
from trustfl.core.registry import build, kinds, lookup, names, register
from trustfl.errors import TrustFLError

__version__ = "0.1.0"
__all__ = ["TrustFLError", "build", "kinds", "lookup", "names", "register", "__version__"]
