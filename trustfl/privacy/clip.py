"""Per-row L2 clipping, the sensitivity-bounding half of a DP mechanism (noising is a separate stage).

Each row ``x_i`` of the ``(m, d)`` message matrix becomes

    x_i · min(1, C / (‖x_i‖₂ + 1e-6))        (CafCor eq. 1; Opacus's factor, with its 1e-6 guard),

so ``‖x_i‖₂ <= C`` after clipping and rows already inside the ball are unchanged. Row ``i`` depends on row ``i`` only.
The norms are accurate to about 1e-8 on rows of any length (:func:`trustfl.core.norms.row_norms`; float32's own
``vector_norm`` is 4.6e-6 low on a 431,080-entry row, 9e-5 on 4,000,000, which let clipped rows exceed ``C`` by as
much), and the factor of a row that is clipped is lowered by twice its dtype's machine epsilon, so that rounding the
product to the dtype cannot take the row past ``C`` (float32: a relative 2.4e-7). A finite row whose norm overflows
its dtype (float32 beyond ~1.8e19) is clipped in float64.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trustfl.core.checks import check_number
from trustfl.core.norms import row_norms
from trustfl.core.registry import register
from trustfl.core.stage import AbstractStage
from trustfl.errors import PrivacyError
from trustfl.types import RoundContext, StageOut

EPS = 1e-6
"""Added to the norm in the clip factor (Opacus's convention); it also keeps zero rows at zero."""


def clip_factors(x: torch.Tensor, max_norm: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(min(1, C/(‖x_i‖ + 1e-6)), ‖x_i‖)`` for every row of ``x``, both float64 of shape ``(m,)``; a factor below
    1 is lowered by ``2·eps`` of ``x``'s dtype, which covers the rounding of the factor and of the product to it."""
    norms = row_norms(x)
    factors = torch.clamp(max_norm / (norms + EPS), max=1.0)
    margin = 1.0 - 2.0 * torch.finfo(x.dtype).eps
    return torch.where(factors < 1.0, factors * margin, factors), norms


@dataclass(frozen=True)
class ClipL2(AbstractStage):
    """Clip each row to L2 norm ``max_norm`` (see the module docstring for the factor).

    Metrics: ``fraction_clipped`` (rows with factor < 1) and ``mean_norm`` (mean pre-clip norm).

    Clipping twice changes a clipped row by a relative ``< 1e-6/C`` (the guard makes the clipped norm
    ``C·‖x‖/(‖x‖ + 1e-6)``, just below ``C``): idempotent up to that, exactly so for unclipped rows.

    Warning:
      Clip before noising: the noise std of a DP mechanism is calibrated to the clip norm.
    """

    max_norm: float

    def __post_init__(self) -> None:
        check_number("max_norm", self.max_norm, low=0, low_open=True, finite=True)

    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        if x.ndim != 2 or not x.is_floating_point():
            raise PrivacyError(f"clip_l2 takes a floating (m, d) tensor, found shape {tuple(x.shape)} and "
                               f"dtype {x.dtype}.")
        if x.shape[0] == 0:
            return StageOut(x, state, {"fraction_clipped": 0.0, "mean_norm": 0.0})
        factors, norms = clip_factors(x, float(self.max_norm))
        narrow = factors.to(x.dtype)
        y = x * narrow.unsqueeze(1)
        tiny = (narrow < torch.finfo(x.dtype).tiny) & (factors > 0)
        if bool(tiny.any()):  # rare: a finite row far beyond x's dtype, whose factor is subnormal there: in float64
            y[tiny] = (x[tiny].double() * factors[tiny].unsqueeze(1)).to(x.dtype)
        metrics = {"fraction_clipped": float((factors < 1.0).float().mean()), "mean_norm": float(norms.mean())}
        return StageOut(y, state, metrics)


@register("client_stage", "clip_l2")
def clip_l2(max_norm: float) -> ClipL2:
    """Per-row L2 clipping to ``max_norm``.

    Args:
      max_norm: the clip norm ``C > 0``.

    Example:
      >>> from trustfl.types import RoundContext
      >>> out = clip_l2(1.0).apply(torch.tensor([[3.0, 4.0], [0.3, 0.4]]), None, RoundContext(0, 0, (0, 1)))
      >>> [round(v, 4) for v in torch.linalg.vector_norm(out.x, dim=1).tolist()], out.metrics["fraction_clipped"]
      ([1.0, 0.5], 0.5)
    """
    return ClipL2(max_norm)
