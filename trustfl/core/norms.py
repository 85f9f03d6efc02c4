"""Row norms that do not overflow: a finite row's ℓ2 norm is finite (float64), whatever its size."""
from __future__ import annotations

import torch


def row_norms(x: torch.Tensor) -> torch.Tensor:
    """ℓ2 norms of the rows as float64. One pass in the input dtype; the rare rows whose float32 sum of squares
    overflows (or underflows to 0) are recomputed in float64, so no ``(n, d)`` float64 copy is ever made. Float64
    rows whose sum of squares overflows are recomputed as ``m·‖x_i/m‖`` with ``m = max_k |x_ik|`` (inf only when
    the norm itself exceeds the float64 maximum)."""
    norms = torch.linalg.vector_norm(x, dim=1).to(torch.float64)
    redo = ~torch.isfinite(norms) | (norms > 1e15) | (norms < 1e-15)
    if x.dtype != torch.float64 and bool(redo.any()):
        norms[redo] = torch.linalg.vector_norm(x[redo].to(torch.float64), dim=1)
    elif x.dtype == torch.float64 and bool((~torch.isfinite(norms)).any()):
        redo = ~torch.isfinite(norms)
        peak = x[redo].abs().amax(dim=1, keepdim=True)
        norms[redo] = torch.linalg.vector_norm(x[redo] / peak, dim=1) * peak.squeeze(1)
    return norms
