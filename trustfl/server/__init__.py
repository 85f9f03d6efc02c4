"""Server optimizers: how the aggregated update moves the global model."""
from trustfl.server.optimizers import AbstractServerOptimizer, FedAdam, ServerSGD

__all__ = ["AbstractServerOptimizer", "FedAdam", "ServerSGD"]
