"""Random perturbation directions that are never stored: regenerated from a seed, chunk by chunk, in place.

DPZV (Alg. 1, §2.4 of the DPZV paper, after MeZO) perturbs a party's parameters ``w`` by ``±λu`` and later steps
along the same ``u``: only the seed is kept, and ``u`` is regenerated each time it is needed, so a party's memory
stays the model's size plus one chunk. ``u`` is uniform on the sphere of radius √d (``"sphere"``; the DPZV
paper, eq. 3), on the unit sphere (``"unit_sphere"``; ZOO-VFL), or standard Gaussian (``"gaussian"``; MeZO's
simplification, ``E‖u‖² = d``). The sphere's scale ``√d/‖g‖`` needs one pass over the regenerated ``g``; it stays a
0-dim tensor on the parameters' device (no host synchronisation). A model that fits in one chunk may keep that
chunk between the calls of one iteration (``cache``, a dict the caller owns): the same values, drawn once, within
the same memory bound (the parameters plus one chunk).
"""
from __future__ import annotations

import math

import torch

DIRECTIONS = ("sphere", "unit_sphere", "gaussian")
CHUNK = 1 << 16
"""Elements generated at once: the memory a regeneration adds to the parameters."""


def _chunks(numel: int, seed: int, device: torch.device, dtype: torch.dtype, cache: dict | None = None):
    if cache is not None and numel <= CHUNK:
        if cache.get("key") != (seed, numel, device, dtype):
            gen = torch.Generator(device=device)
            gen.manual_seed(seed)
            cache["key"], cache["g"] = (seed, numel, device, dtype), torch.randn(numel, generator=gen, device=device,
                                                                               dtype=dtype)
        yield 0, numel, cache["g"]
        return
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    for start in range(0, numel, CHUNK):
        stop = min(start + CHUNK, numel)
        yield start, stop, torch.randn(stop - start, generator=gen, device=device, dtype=dtype)


def direction_scale(flat: torch.Tensor, seed: int, kind: str, cache: dict | None = None) -> torch.Tensor:
    """The factor ``s`` with ``u = s·g`` (``g`` the standard Gaussian drawn from ``seed``): ``√d/‖g‖`` on the
    sphere of radius √d, ``1/‖g‖`` on the unit sphere, 1 for Gaussian directions. A 0-dim tensor on ``flat``'s
    device."""
    if kind == "gaussian":
        return torch.ones((), device=flat.device, dtype=flat.dtype)
    total = torch.zeros((), device=flat.device, dtype=torch.float64)
    for _, _, g in _chunks(flat.numel(), seed, flat.device, flat.dtype, cache):
        total += g.double().square().sum()
    radius = math.sqrt(flat.numel()) if kind == "sphere" else 1.0
    return (radius / total.sqrt()).to(flat.dtype)


def add_direction(flat: torch.Tensor, seed: int, coefficient: torch.Tensor, cache: dict | None = None) -> None:
    """``flat += coefficient · g`` in place, ``g`` regenerated from ``seed`` (``coefficient``: a 0-dim tensor,
    e.g. ``λ·s`` or ``−η·Δ·s``)."""
    with torch.no_grad():
        for start, stop, g in _chunks(flat.numel(), seed, flat.device, flat.dtype, cache):
            flat[start:stop].addcmul_(g, coefficient)


def direction(numel: int, seed: int, kind: str, device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The whole direction ``u`` as one tensor (tests and small models; the engine never materialises it)."""
    flat = torch.zeros(numel, device=device, dtype=dtype)
    add_direction(flat, seed, direction_scale(flat, seed, kind))
    return flat


def row_directions(rows: int, cols: int, generator: torch.Generator, device: torch.device | str,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``rows`` directions uniform on the unit sphere of R^cols (VFL-CZOFO's perturbation of the embeddings)."""
    v = torch.randn(rows, cols, generator=generator, device=device, dtype=dtype)
    return v / v.norm(dim=1, keepdim=True).clamp_min(torch.finfo(dtype).tiny)
