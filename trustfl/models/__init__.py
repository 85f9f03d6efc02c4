"""Models that work under torch.func per-example gradients (no BatchNorm; GroupNorm where needed)."""
from trustfl.models.zoo import CafCorCNN, LogisticRegression, MLP, RobustHDPCNN, build_model

__all__ = ["CafCorCNN", "LogisticRegression", "MLP", "RobustHDPCNN", "build_model"]
