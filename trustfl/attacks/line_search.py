"""Line-search attacks: ALIE and FOE with the factor that hurts a given aggregator most (simulation only).

The attacker knows the server's rule ``Agg`` and chooses the factor ``t >= 0`` of the attack ``B(t)`` (ALIE's ``z``
or FOE's ``τ``) that maximises the damage

    φ(t) = ‖Agg(H ∪ {B(t)}^f) − mean(H)‖₂,

where the f Byzantine rows all equal ``B(t)``. ``t = 0`` is harmless for both (``B(0) = mean(H)``). The search is
the best-effort exploration of the authors' group ("LineMaximize" in ByzFL; docs/papers/cafcor.md) with its defaults:
16 evaluations, start 0, initial step Δ = 1, contraction ratio 0.8. :func:`line_maximize` gives the exact steps.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping

import torch

from trustfl.attacks.base import AbstractAttack, check_honest, repeat_row, round_context, without_overflow
from trustfl.attacks.update import alie_vector
from trustfl.core.checks import check_number
from trustfl.core.registry import build, register
from trustfl.errors import ConfigError
from trustfl.types import RoundContext

if TYPE_CHECKING:
    from trustfl.aggregate.base import AbstractAggregator


def line_maximize(objective: Callable[[float], float], evals: int = 16, start: float = 0.0, delta: float = 1.0,
                  ratio: float = 0.8) -> tuple[float, float, int]:
    """Best-effort ``argmax_{t >= 0} φ(t)`` by exploration with exactly ``evals`` evaluations of ``φ``.

    1. Evaluate ``φ(start)``; the best point is ``t* = start`` and the step is ``s = delta``.
    2. Expansion: evaluate ``t* + s``. If it beats ``φ(t*)``, move ``t*`` there, double ``s`` and repeat;
       otherwise multiply ``s`` by ``ratio`` and go to 3.
    3. Contraction: the last probe ``p`` lies on one side of ``t*``. The next probe walks from ``p`` towards (and
       possibly past) ``t*`` by ``s``: ``p + s`` if ``p < t*``, else ``p − s``; a probe below 0 is replaced by the
       midpoint between it and ``p`` until it is ``>= 0``. Keep the probe if it beats ``φ(t*)`` and multiply ``s``
       by ``ratio``. Repeat until the budget is spent.

    Ties keep the earlier point, so a flat objective returns ``start``.

    Args:
      objective: ``φ``; called exactly ``evals`` times.
      evals: the evaluation budget, ``>= 1``.
      start: the first point, ``>= 0``.
      delta: the initial step, ``> 0``.
      ratio: the contraction ratio, in ``(0.5, 1)``.

    Returns:
      ``(t*, φ(t*), evaluations used)``.

    Example:
      >>> t, v, used = line_maximize(lambda t: -(t - 3.0) ** 2)
      >>> used, abs(t - 3.0) < 0.5
      (16, True)
    """
    _check_search(evals, start, delta, ratio)
    best_t, best_v = float(start), float(objective(float(start)))
    used, step, probe = 1, float(delta), float(start)
    while used < evals:  # expansion
        probe = best_t + step
        value = float(objective(probe))
        used += 1
        if value > best_v:
            best_t, best_v, step = probe, value, 2.0 * step
        else:
            step *= ratio
            break
    while used < evals:  # contraction
        if probe < best_t:
            probe = probe + step
        else:
            candidate = probe - step
            while candidate < 0.0:
                candidate = 0.5 * (candidate + probe)
            probe = candidate
        value = float(objective(probe))
        used += 1
        if value > best_v:
            best_t, best_v = probe, value
        step *= ratio
    return best_t, best_v, used


def _check_search(evals: int, start: float, delta: float, ratio: float) -> None:
    check_number("evals", evals, integer=True, low=1)
    if not 0.0 <= float(start) < float("inf"):
        raise ConfigError(f"`start` must be a finite number >= 0, found {start!r}.")
    if not 0.0 < float(delta) < float("inf"):
        raise ConfigError(f"`delta` must be a finite number > 0, found {delta!r}.")
    if not 0.5 < float(ratio) < 1.0:
        raise ConfigError(f"`ratio` must lie in (0.5, 1), found {ratio!r}.")


_FAMILIES = ("alie", "foe")


@dataclass(frozen=True)
class LineSearchAttack(AbstractAttack):
    """ALIE or FOE whose factor is chosen each round by :func:`line_maximize` against the server's aggregator.

    Build it as ``alie_ls`` (``B(z) = mean(H) + z·std(H)``, ddof = 1) or ``foe_ls`` (``B(τ) = (1 − τ)·mean(H)``).

    Args:
      family: ``"alie"`` or ``"foe"``.
      evals, start, delta, ratio: the search (defaults 16, 0, 1, 0.8: the authors' group's "LineMaximize").
      aggregator: a registered aggregator name, built when :meth:`craft` gets no ``aggregator``.
      aggregator_params: its parameters.
    """

    min_honest: ClassVar[int] = 2  # the standard deviation of the honest rows

    family: str
    evals: int = 16
    start: float = 0.0
    delta: float = 1.0
    ratio: float = 0.8
    aggregator: str | None = None
    aggregator_params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.family not in _FAMILIES:
            raise ConfigError(f"`family` must be one of {_FAMILIES}, found {self.family!r}.")
        _check_search(self.evals, self.start, self.delta, self.ratio)
        if self.aggregator is not None and not isinstance(self.aggregator, str):
            raise ConfigError(f"`aggregator` must be None or a registered aggregator name, found {self.aggregator!r}.")

    def label(self) -> str:
        """``attack 'alie_ls'`` or ``attack 'foe_ls'`` (the registered factories' names)."""
        return f"attack '{self.family}_ls'"

    def vector(self, honest: torch.Tensor, factor: float) -> torch.Tensor:
        """``B(t)``, shape ``(d,)``; saturates at ``±finfo(dtype).max`` instead of overflowing."""
        if self.family == "alie":
            return alie_vector(honest, factor)
        return without_overflow(lambda h: (1.0 - factor) * h.mean(dim=0), honest)

    def _resolve(self, aggregator: AbstractAggregator | None) -> AbstractAggregator:
        if aggregator is not None:
            return aggregator
        if self.aggregator is not None:
            return build("aggregator", self.aggregator, **dict(self.aggregator_params))
        raise ConfigError(f"{self.family}_ls optimises its factor against the server's rule: pass `aggregator=` "
                          "to craft() or configure `aggregator` (a registered aggregator name).")

    def search(self, honest: torch.Tensor, num_byzantine: int, ctx: RoundContext,
               aggregator: AbstractAggregator | None = None) -> tuple[float, float, int]:
        """Run :func:`line_maximize` on ``φ``; return ``(best factor, its damage, evaluations used)``.

        The aggregator is called as ``agg(x, seed=ctx.seed)`` (uniform weights) on ``x = [H; B(t)·1_f]``.
        """
        check_honest(honest, num_byzantine, min_rows=self.min_honest, attack=self)
        ctx = round_context(ctx, self, "the aggregator it searches against runs with the round's seed")
        agg = self._resolve(aggregator)
        mean = without_overflow(lambda h: h.mean(dim=0), honest).to(torch.float64)

        def damage(t: float) -> float:  # in float64: rows near the float32 maximum must not make it inf
            x = torch.cat([honest, repeat_row(self.vector(honest, t), num_byzantine)], dim=0)
            return float(torch.linalg.vector_norm(agg(x, seed=ctx.seed).to(torch.float64) - mean))

        return line_maximize(damage, self.evals, self.start, self.delta, self.ratio)

    def craft(self, honest: torch.Tensor, num_byzantine: int, ctx: RoundContext,
              aggregator: AbstractAggregator | None = None) -> torch.Tensor:
        """``B(t*)`` repeated ``f`` times, with ``t*`` from :meth:`search`.

        Raises:
          ConfigError: if no aggregator is passed or configured.
          MessageError: if ``H`` has fewer than 2 rows.
        """
        check_honest(honest, num_byzantine, min_rows=self.min_honest, attack=self)
        if num_byzantine == 0:
            return honest.new_empty((0, honest.shape[1]))
        best, _, _ = self.search(honest, num_byzantine, ctx, aggregator)
        return repeat_row(self.vector(honest, best), num_byzantine)


@register("attack", "alie_ls")
def alie_ls(evals: int = 16, start: float = 0.0, delta: float = 1.0, ratio: float = 0.8,
            aggregator: str | None = None, aggregator_params: Mapping[str, Any] | None = None) -> LineSearchAttack:
    """ALIE ``mean(H) + z·std(H)`` with ``z`` chosen by line search against the aggregator.

    Example:
      >>> import torch; from trustfl.aggregate.base import Mean; from trustfl.types import RoundContext
      >>> h = torch.tensor([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]])
      >>> alie_ls().craft(h, 1, RoundContext(0, 0, (0, 1, 2)), Mean()).shape
      torch.Size([1, 2])
    """
    return LineSearchAttack("alie", evals, start, delta, ratio, aggregator, dict(aggregator_params or {}))


@register("attack", "foe_ls")
def foe_ls(evals: int = 16, start: float = 0.0, delta: float = 1.0, ratio: float = 0.8,
           aggregator: str | None = None, aggregator_params: Mapping[str, Any] | None = None) -> LineSearchAttack:
    """FOE ``(1 − τ)·mean(H)`` with ``τ`` chosen by line search against the aggregator."""
    return LineSearchAttack("foe", evals, start, delta, ratio, aggregator, dict(aggregator_params or {}))
