"""Batched image augmentations for self-supervised learning: the augmentation kernel 𝒜(·|x̄) of the FedSC paper.

Every operation acts on a whole batch ``(N, C, H, W)`` at once, on the batch's device (no torchvision, no loop over
samples). All randomness comes from one ``torch.Generator`` on that device, drawn in a fixed order, so the same
generator state gives the same views. One view of image ``x`` is, in this order:

    shift/crop   x ← crop(pad(x, s), offset ∼ U{0..2s}²)       (zero padding, a random translation by ±s pixels)
                 ``shift_mode="keep"``: a translation by d ∼ U{lo..hi} per axis, [lo, hi] the shifts within ±s
                 that keep every nonzero pixel inside the image (a digit re-pasted in its canvas; nothing cut off)
    brightness   x ← b·x,                b ∼ U(b_lo, b_hi)
    contrast     x ← c·(x − x̄) + x̄,      c ∼ U(c_lo, c_hi), x̄ the image mean
    flip         x ← x[..., ::-1] with probability 1/2          (only with ``flip=True``)
    dropout      x ← x · 1[u ≥ p],        u ∼ U(0, 1) per pixel (all channels of a pixel together)
    noise        x ← x + ε,               ε ∼ N(0, s_n²) per value

Draw order per call (it fixes reproducibility): offsets ``(n, 2)`` (integers; ``"keep"``: uniforms in [0, 1)),
brightness ``(n,)``, contrast ``(n,)``, flip ``(n,)``, dropout ``(n, 1, H, W)``, noise ``(n, C, H, W)``; a disabled
operation draws nothing.

Example:
  >>> x = torch.rand(4, 1, 8, 8)
  >>> views = make_views(x, 2, view_generator(0, 3, 1, x.device))
  >>> tuple(views.shape)
  (4, 2, 1, 8, 8)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from trustfl.core.checks import check_number, describe_value
from trustfl.core.rng import make_generator
from trustfl.errors import ConfigError

__all__ = ["Augmentation", "FACTOR_MAX", "SHIFT_MODES", "make_views", "make_views_cohort", "view_generator"]

SHIFT_MODES = ("crop", "keep")
"""How ``shift`` translates: ``"crop"`` any offset within ±s (content may leave the image), ``"keep"`` only offsets
that keep all nonzero content inside the image."""


def view_generator(seed: int, round: int, client: int, device: torch.device | str = "cpu",
                   stage: str = "views") -> torch.Generator:
    """The generator of a client's augmentations in a round: ``make_generator(seed, round, client, stage)`` on
    ``device`` (the device of the images it augments). Use another ``stage`` for another stream (e.g. ``"calr"``
    for the views of DP-CalR, Algorithm 2)."""
    return make_generator(seed, round, client, stage, device=device)


FACTOR_MAX = 1e30
"""The largest brightness or contrast factor and noise std: the views are float32 (1e39 is inf there)."""


def _range(name: str, value: Sequence[float], low: float) -> tuple[float, float]:
    if len(tuple(value)) != 2:
        raise ConfigError(f"`{name}` must be a pair (low, high), found {value!r}.")
    lo, hi = (float(check_number(name, v, low=low, high=FACTOR_MAX, note="the views are float32")) for v in value)
    if lo > hi:
        raise ConfigError(f"`{name}` must be a pair (low, high) with low <= high, found {value!r}.")
    return lo, hi


@dataclass(frozen=True)
class Augmentation:
    """The random augmentation of one view (the kernel 𝒜(·|x̄)); defaults suit small grey-scale images.

    Args:
      shift: maximal translation in pixels ``s >= 0`` (zero padding, then a random crop of the original size).
      shift_mode: ``"crop"`` or ``"keep"`` (:data:`SHIFT_MODES`; ``"keep"`` suits objects on a blank background).
      brightness: ``(b_lo, b_hi)``, the range of the multiplicative brightness factor (``(1, 1)``: off).
      contrast: ``(c_lo, c_hi)``, the range of the contrast factor around each image's mean (``(1, 1)``: off).
      dropout: probability ``p in [0, 1)`` that a pixel (all its channels) is set to zero.
      noise_std: std ``s_n >= 0`` of the additive Gaussian noise.
      flip: mirror each image horizontally with probability 1/2.

    The factors and ``noise_std`` are at most :data:`FACTOR_MAX` (the views are float32).

    Raises:
      ConfigError: a parameter out of range (the message names it).
    """

    shift: int = 2
    brightness: tuple[float, float] = (0.7, 1.3)
    contrast: tuple[float, float] = (1.0, 1.0)
    dropout: float = 0.2
    noise_std: float = 0.1
    flip: bool = False
    shift_mode: str = "crop"

    def __post_init__(self) -> None:
        check_number("shift", self.shift, integer=True, low=0)
        if self.shift_mode not in SHIFT_MODES:
            raise ConfigError(f"`shift_mode` must be one of {SHIFT_MODES}, found {self.shift_mode!r}.")
        object.__setattr__(self, "brightness", _range("brightness", self.brightness, 0.0))
        object.__setattr__(self, "contrast", _range("contrast", self.contrast, 0.0))
        check_number("dropout", self.dropout, low=0, high=1, high_open=True)
        check_number("noise_std", self.noise_std, low=0, high=FACTOR_MAX, note="the views are float32")
        if not isinstance(self.flip, bool):
            raise ConfigError(f"`flip` must be a bool, found {self.flip!r}.")

    def draw(self, n: int, shape: Sequence[int], generator: torch.Generator, device: torch.device,
             dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The random parameters of ``n`` views of images of shape ``(C, H, W)``, in the documented order."""
        c, h, w = shape
        kw = {"generator": generator, "device": device}
        out: dict[str, torch.Tensor] = {}
        if self.shift and self.shift_mode == "keep":
            out["offset_u"] = torch.rand((n, 2), dtype=dtype, **kw)
        elif self.shift:
            out["offset"] = torch.randint(0, 2 * self.shift + 1, (n, 2), **kw)
        for name, (lo, hi) in (("brightness", self.brightness), ("contrast", self.contrast)):
            if lo != 1.0 or hi != 1.0:
                out[name] = lo + (hi - lo) * torch.rand(n, dtype=dtype, **kw)
        if self.flip:
            out["flip"] = torch.rand(n, dtype=dtype, **kw) < 0.5
        if self.dropout:
            out["keep"] = torch.rand((n, 1, h, w), dtype=dtype, **kw) >= self.dropout
        if self.noise_std:
            out["noise"] = torch.randn((n, c, h, w), dtype=dtype, **kw).mul_(self.noise_std)
        return out

    def apply(self, x: torch.Tensor, params: dict[str, torch.Tensor], views: int = 1) -> torch.Tensor:
        """Apply drawn parameters (from :meth:`draw`) to images ``x`` ``(n, C, H, W)``; deterministic.

        ``views`` > 1: ``x`` holds each image ``views`` times in a row (rows ``k·views … k·views + views − 1`` are
        copies of one image, as :func:`make_views` lays them out), so what depends on the content alone (where a
        ``"keep"`` shift may move it) is computed once per image.

        Raises:
          ConfigError: ``views`` is not a positive integer dividing the number of images."""
        n, _, h, w = x.shape
        check_number("views", views, integer=True, low=1)
        if n % views:
            raise ConfigError(f"`views` = {views} must divide the number of images ({n}): each image is held "
                              f"`views` times in a row.")
        if "offset_u" in params:
            params = {**params, "offset": self._keeping_offsets(x, params["offset_u"], views)}
        fresh = False  # x is a tensor of this call's own (written in place from here on), not the caller's
        if "offset" in params:
            s = self.shift
            padded, width = F.pad(x, (s, s, s, s)).flatten(2), w + 2 * s                # (n, C, (H+2s)(W+2s))
            grid = torch.arange(h, device=x.device).unsqueeze(1) * width + torch.arange(w, device=x.device)
            # each output pixel's position in its padded image (the grid moved by the image's offset), one gather
            # for every channel
            where = (params["offset"][:, :1] * width + params["offset"][:, 1:] + grid.view(1, -1)).view(n, 1, h * w)
            x, fresh = padded.gather(2, where.expand(n, padded.shape[1], h * w)).view(n, -1, h, w), True
        if "brightness" in params:
            b = params["brightness"].view(n, 1, 1, 1)
            x, fresh = (x.mul_(b) if fresh else x * b), True
        if "contrast" in params:
            mean = x.mean(dim=(1, 2, 3), keepdim=True)
            x, fresh = (x - mean) * params["contrast"].view(n, 1, 1, 1) + mean, True
        if "flip" in params:
            x, fresh = torch.where(params["flip"].view(n, 1, 1, 1), x.flip(-1), x), True
        if "keep" in params:
            x, fresh = (x.mul_(params["keep"]) if fresh else x * params["keep"].to(x.dtype)), True
        if "noise" in params:
            x, fresh = (x.add_(params["noise"]) if fresh else x + params["noise"]), True
        return x.contiguous()

    def _keeping_offsets(self, x: torch.Tensor, u: torch.Tensor, views: int = 1) -> torch.Tensor:
        """Crop offsets ``(n, 2)`` in {0..2s} whose translations d = s − offset keep every nonzero pixel of each
        image inside it: per axis d ∼ U{lo..hi}, lo = max(−first, −s), hi = min(last_free, s), from ``u`` ∈ [0, 1).
        An all-zero image gets d = 0. ``views``: as in :meth:`apply` (one copy's bounds serve all of its copies)."""
        s = self.shift
        images = x[::views] if views > 1 else x
        offsets = []
        for axis, dims in ((0, (1, 3)), (1, (1, 2))):                     # rows: any over C, W; columns: over C, H
            occupied = (images != 0).any(dim=dims)                          # (n / views, size)
            size = occupied.shape[1]
            first = occupied.int().argmax(dim=1)                            # 0 when empty
            last = size - 1 - occupied.flip(1).int().argmax(dim=1)          # size − 1 when empty
            lo = torch.clamp(-first, min=-s)
            hi = torch.clamp(size - 1 - last, max=s)
            if views > 1:
                lo, hi = lo.repeat_interleave(views), hi.repeat_interleave(views)
            d = lo + torch.floor(u[:, axis] * (hi - lo + 1).to(u.dtype)).long()
            offsets.append(s - torch.minimum(d, hi))
        return torch.stack(offsets, dim=1)

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """One augmented view of every image of ``x`` ``(n, C, H, W)``."""
        _check_images(x, 4, "x")
        return self.apply(x, self.draw(x.shape[0], x.shape[1:], generator, x.device, x.dtype))


DEFAULT = Augmentation()


def _check_images(x: torch.Tensor, dims: int, name: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != dims or not x.is_floating_point():
        layout = "(N, C, H, W)" if dims == 4 else "(J, N, C, H, W)"
        raise ConfigError(f"`{name}` must be a floating-point {layout} tensor of images, found {describe_value(x)}.")


def _repeat_views(x: torch.Tensor, num_views: int) -> torch.Tensor:
    """``(N, C, H, W)`` → ``(N·V, C, H, W)``, example-major (row ``n·V + v`` is view ``v`` of image ``n``)."""
    return x.unsqueeze(1).expand(x.shape[0], num_views, *x.shape[1:]).reshape(-1, *x.shape[1:])


def make_views(x: torch.Tensor, num_views: int, generator: torch.Generator,
               augmentation: Augmentation = DEFAULT) -> torch.Tensor:
    """``num_views`` independent augmented views x_1..x_V ∼ 𝒜(·|x̄) of every image x̄ of a batch.

    Args:
      x: images ``(N, C, H, W)``, floating point, on any device.
      num_views: V >= 1. For the FedSC training loss use 2V views (pairs ``(v, v + V)``, Sec. 5.2 of the FedSC
        paper); for DP-CalR (Algorithm 2) the paper uses V = 5.
      generator: a generator on ``x``'s device (see :func:`view_generator`); it alone makes all draws.
      augmentation: the kernel (default :class:`Augmentation`).

    Returns:
      ``(N, V, C, H, W)`` in ``x``'s dtype and device (examples first, as batches are).

    Raises:
      ConfigError: ``x`` is not a floating-point image batch, or ``num_views < 1``.
    """
    _check_images(x, 4, "x")
    check_number("num_views", num_views, integer=True, low=1)
    flat = _repeat_views(x, num_views)
    views = augmentation.apply(flat, augmentation.draw(flat.shape[0], x.shape[1:], generator, x.device, x.dtype),
                               num_views)
    return views.view(x.shape[0], num_views, *x.shape[1:])


def make_views_cohort(x: torch.Tensor, num_views: int, generators: Sequence[torch.Generator],
                      augmentation: Augmentation = DEFAULT) -> torch.Tensor:
    """:func:`make_views` for a cohort: ``x`` ``(J, N, C, H, W)``, client ``j``'s draws from ``generators[j]``.

    Equal to stacking ``make_views(x[j], num_views, generators[j])`` over ``j`` (client ``j``'s views depend on its
    own stream only); the draws are made per client, the augmentation itself runs once on all ``J·N·V`` images.

    Returns:
      ``(J, N, V, C, H, W)``.
    """
    _check_images(x, 5, "x")
    check_number("num_views", num_views, integer=True, low=1)
    j, n = x.shape[:2]
    if len(generators) != j:
        raise ConfigError(f"`generators` must hold one generator per client ({j}), found {len(generators)}.")
    draws = [augmentation.draw(n * num_views, x.shape[2:], g, x.device, x.dtype) for g in generators]
    params = {k: torch.cat([d[k] for d in draws]) for k in draws[0]} if draws else {}
    flat = _repeat_views(x.reshape(j * n, *x.shape[2:]), num_views)
    return augmentation.apply(flat, params, num_views).view(j, n, num_views, *x.shape[2:])
