"""``engine.device`` and ``engine.dtype``: where a run computes, checked against this machine when it is built.

The schema (``config/schema.py``) checks the spelling only, without importing torch; whether the named CUDA device
is present is decided here. ``auto`` is the only value that may fall back to the CPU, and the run records its
choice (``run_info.json``'s ``device``, one printed notice line).
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from trustfl.config.schema import ExperimentConfig
from trustfl.errors import ConfigError


def refuse_meta_default(who: str) -> None:
    """Refuse (a ConfigError) a call made where torch's default device is ``meta`` (inside ``with
    torch.device("meta")``, or after ``torch.set_default_device("meta")``): every tensor made there would hold
    no values. Called once where a run starts (about 20 µs), not in a round."""
    if torch.get_default_device().type == "meta":
        raise ConfigError(f"{who}: torch's default device is 'meta' (a `with torch.device(\"meta\")` block or "
                          f"torch.set_default_device(\"meta\")), where tensors have shapes but no values, so no "
                          f"data can be loaded nor a model trained; call it outside that block (`engine.device` "
                          f"picks where a run computes).")


def resolve_device(cfg: ExperimentConfig) -> tuple[torch.device, str | None]:
    """The device ``engine.device`` names on this machine, and a notice when ``auto`` chose it.

    Returns:
      ``(device, notice)``: ``cuda`` resolves to ``cuda:<current device>``; ``notice`` is ``None`` unless
      ``engine.device = "auto"``.

    Raises:
      ConfigError: naming ``engine.device`` when a CUDA device is asked for and is not present (no CUDA device
        at all, or index ``N`` of ``cuda:N`` out of range), or naming ``engine.dtype`` when ``bfloat16`` is asked
        for on a CUDA device without bfloat16 support.
    """
    name = cfg.engine.device
    available = torch.cuda.is_available()
    if name == "auto":
        device = torch.device("cuda", torch.cuda.current_device()) if available else torch.device("cpu")
        why = "a CUDA device is present" if available else "no CUDA device is present"
        notice = f"NOTICE: `engine.device` = \"auto\" chose {str(device)!r} ({why})."
    elif name == "cpu":
        device, notice = torch.device("cpu"), None
    else:
        if not available:
            raise ConfigError(f"`engine.device` is {name!r}, but no CUDA device is present on this machine (torch "
                              f"sees none); use \"cpu\", or \"auto\" to take a CUDA device only when there is one.")
        count = torch.cuda.device_count()
        index = torch.cuda.current_device() if name == "cuda" else int(name.split(":")[1])
        if index >= count:
            raise ConfigError(f"`engine.device` is {name!r}, but no CUDA device {index} is present on this machine "
                              f"(it has {count}: cuda:0 to cuda:{count - 1}).")
        device, notice = torch.device("cuda", index), None
    if cfg.engine.dtype == "bfloat16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(f"`engine.dtype` is \"bfloat16\", which {device} does not support; use \"float32\".")
    return device, notice


def resolve_engine_device(cfg: ExperimentConfig, vertical: bool) -> tuple[torch.device, str | None]:
    """:func:`resolve_device` for the run's engine: the vertical engine runs on the CPU only (``auto`` picks the
    CPU for it and says so; an explicit CUDA device is refused naming ``engine.device``, never half-moved)."""
    device, notice = resolve_device(cfg)
    if vertical and device.type != "cpu" and cfg.engine.device == "auto":
        return torch.device("cpu"), ("NOTICE: `engine.device` = \"auto\" chose 'cpu' (the vertical engine runs on the "
                                     "CPU only).")
    if vertical and device.type != "cpu":
        raise ConfigError(f"`engine.device`: the vertical engine runs on the CPU only; found {cfg.engine.device!r} "
                          f"(resolved to {device}). Use engine.device = \"cpu\".")
    return device, notice


def compute_dtype(cfg: ExperimentConfig) -> torch.dtype | None:
    """The autocast dtype of local training (``None``: plain float32, the default)."""
    return torch.bfloat16 if cfg.engine.dtype == "bfloat16" else None


def on_device(tensors: Mapping[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """``tensors`` moved to ``device`` (the same tensor objects when they are already there: no copy)."""
    return {k: v.to(device) for k, v in tensors.items()}


def device_info(device: torch.device, dtype: str) -> dict[str, Any]:
    """What ``run_info.json`` records about where the run computed."""
    return {"device": str(device), "dtype": dtype}
