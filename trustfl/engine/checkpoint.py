"""``checkpoint.pt``: the whole :class:`EngineState` of a run, and what a resume checks before trusting it.

A checkpoint is stamped with the configuration's hash and a digest of the data the run trained on
(:func:`data_digest`). Resuming refuses a file whose zip records fail their CRC-32 (damaged after it was written),
one of another configuration, one whose run started on other data (an edited data file, or a fallback data set
where the real one has since been fetched, would otherwise continue the run on different data without a word), and
one whose contents are not an :class:`EngineState` with parameters of this run's shape and dtype.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import tomllib
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Mapping

import torch

from trustfl.data.datasets import Dataset
from trustfl.engine.federation import EngineState
from trustfl.errors import CheckpointError

CHECKPOINT = "checkpoint.pt"
_DATA_FIELDS = ("train_x", "train_y", "test_x", "test_y", "train_groups")


def data_digest(dataset: Dataset, files: Mapping[str, torch.Tensor] | None = None) -> str:
    """SHA-256 of the data set's tensors (dtype, shape and bytes of each split, and the training rows' owners):
    equal for the same data on any device. ``files``: named tensors a run read from other files (a speed model's
    ``file_data()``), covered too; none leaves the digest as it was."""
    digest = hashlib.sha256()
    named = [(name, getattr(dataset, name)) for name in _DATA_FIELDS] + list((files or {}).items())
    for name, tensor in named:
        if tensor is None:
            digest.update(f"{name}:none;".encode())
            continue
        tensor = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        if tensor.numel():
            digest.update(memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))
    return digest.hexdigest()


@contextmanager
def _with_crc32() -> Iterator[None]:
    """torch.save writing each record's CRC-32 (its default; a process may have turned it off), which
    :func:`load_checkpoint` checks."""
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(True)
    try:
        yield
    finally:
        torch.serialization.set_crc32_options(before)


def save_checkpoint(run_dir: Path, state: EngineState, cfg_hash: str, data: str | None = None,
                    config: str | None = None) -> None:
    """Write ``state`` to ``run_dir/checkpoint.pt`` atomically, stamped with ``cfg_hash``, the data digest
    ``data`` (:func:`data_digest`; ``None``: unchecked at resume) and ``config``, the TOML text ``cfg_hash`` hashes
    (so that a resume under an edited config can name the keys that changed)."""
    with _with_crc32():
        save_atomically({"config_hash": cfg_hash, "data_digest": data, "config": config,
                         "state": dataclasses.asdict(state)}, run_dir / CHECKPOINT)


def save_atomically(obj: Any, path: Path, private: bool = False) -> None:
    """``torch.save(obj)`` to ``path`` through a temporary file renamed over it, so a reader never sees half a
    file; written through a Python file object, so a full disk or a read-only folder is an OSError naming
    the file. ``private``: readable by its owner only (a deployed node's secrets) and synced to the disk before
    the rename."""
    _replace_atomically(path, private, lambda handle: torch.save(obj, handle))


def write_atomically(data: bytes, path: Path, private: bool = False) -> None:
    """``data``, already serialised (e.g. by ``torch.save`` into a buffer), to ``path`` as :func:`save_atomically`
    writes it."""
    _replace_atomically(path, private, lambda handle: handle.write(data))


def _replace_atomically(path: Path, private: bool, write: Callable[[BinaryIO], object]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o666)
    with os.fdopen(fd, "wb") as handle:
        if private:
            os.fchmod(fd, 0o600)  # also when an earlier temporary file was left with another mode
        write(handle)
        if private:
            handle.flush()
            os.fsync(fd)
    tmp.replace(path)


def load_checkpoint(run_dir: Path, cfg_hash: str, map_location: torch.device | str | None = None,
                    data: str | None = None, like: torch.Tensor | None = None,
                    config: str | None = None) -> EngineState:
    """The :class:`EngineState` saved in ``run_dir``, its tensors on ``map_location`` (the resuming run's device;
    ``None``: where they were saved), so a run checkpointed on a GPU resumes on the CPU and vice versa.

    The virtual clock (``EngineState.clock``: the asynchronous engine's host-side schedule) stays on the CPU.

    Raises:
      CheckpointError: no checkpoint, an unreadable or damaged file, one of another configuration, one whose run
        trained on other data than ``data`` (a :func:`data_digest`; checked when both it and the file have one), or
        one that holds no :class:`EngineState` whose parameters have the shape and dtype of ``like`` (the run's
        initial parameters; ``None``: unchecked). Of another configuration, it names the keys that differ when
        both ``config`` (the TOML text ``cfg_hash`` hashes) and the file have one.
    """
    path = run_dir / CHECKPOINT
    if not path.is_file():
        what = ("is a directory, not a checkpoint file" if path.is_dir() else
                "is a link to nothing" if path.is_symlink() else "is not a regular file") \
            if os.path.lexists(path) else None
        if what is not None:
            raise CheckpointError(f"{path} {what}: nothing to resume from; remove it (or start afresh with "
                                  f"--overwrite).")
        raise CheckpointError(f"{run_dir} has no {CHECKPOINT}: nothing to resume (was checkpoint_every 0?).")
    _check_records(path)
    try:  # weights_only: tensors, numbers, strings and containers only, so a foreign file cannot run code
        saved = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # a foreign file; torch's own message spans lines and advises unsafe loading
        if "weights only" in str(err).lower():
            raise CheckpointError(f"{path} cannot be read: it holds objects other than tensors, numbers, strings and "
                                  f"containers (e.g. a pickled module), which are not loaded; it is not a trustfl "
                                  f"checkpoint. Start afresh with --overwrite.") from None
        raise CheckpointError(f"{path} cannot be read ({type(err).__name__}: "
                              f"{' '.join(str(err).split())[:200]}); it is not a trustfl checkpoint.") from None
    if not isinstance(saved, dict) or saved.get("config_hash") != cfg_hash:
        differ = config_difference(saved.get("config") if isinstance(saved, dict) else None, config)
        raise CheckpointError(f"{path} belongs to another configuration than {run_dir / 'config.toml'}"
                              f"{differ}. Restore that config.toml, or start afresh with --overwrite.")
    if data is not None and saved.get("data_digest") not in (None, data):
        raise CheckpointError(f"{path} was written by a run on other data than this configuration loads now (the "
                              f"data set's contents differ: an edited `data.path` file, another `--data-dir`, or a "
                              f"fallback data set where the real one is now present; or the step times of an edited "
                              f"`engine.speed.path` trace); resuming would continue on different data. Restore the "
                              f"data, or start afresh with --overwrite.")
    state = _checked_state(path, saved, like)
    if map_location is not None and state.get("clock"):
        state["clock"] = _to_cpu(state["clock"])
    return EngineState(**state)


def config_difference(saved: Any, config: str | None, where: str = "the checkpoint") -> str:
    """`` (it differs at `client.lr` (0.1 in the checkpoint, 0.2 now), ...)`` between two configs' TOML texts,
    ``saved`` (the one in ``where``) and ``config``; ``""`` when either is missing or unreadable (a checkpoint from
    before the text was kept)."""
    try:
        mine, theirs = _flat(tomllib.loads(config)), _flat(tomllib.loads(saved))  # type: ignore[arg-type]
    except (TypeError, AttributeError, tomllib.TOMLDecodeError):
        return ""
    keys = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k, _MISSING) != theirs.get(k, _MISSING))
    shown = ", ".join(f"`{k}` ({_show(theirs, k)} in {where}, {_show(mine, k)} now)" for k in keys[:5])
    return f" (it differs at {shown}{', ...' if len(keys) > 5 else ''})" if keys else ""


_MISSING = object()


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"client": {"lr": 0.1}}`` → ``{"client.lr": 0.1}``."""
    if isinstance(data, dict) and data:
        return {k: v for key, value in data.items() for k, v in _flat(value, f"{prefix}{key}.").items()}
    return {prefix[:-1]: data}


def _show(flat: dict[str, Any], key: str) -> str:
    return repr(flat[key])[:40] if key in flat else "unset"


_REQUIRED = tuple(f.name for f in dataclasses.fields(EngineState)
                  if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
"""The :class:`EngineState` fields without a default: every checkpoint holds them."""


def _checked_state(path: Path, saved: dict[str, Any], like: torch.Tensor | None) -> dict[str, Any]:
    """``saved["state"]``, refused unless it holds an :class:`EngineState`'s fields (no others), a round >= 0 and
    parameters shaped like ``like``: a file of another run or trustfl version whose config hash matches."""
    state = saved.get("state")
    fields = {f.name for f in dataclasses.fields(EngineState)}
    params = state.get("params") if isinstance(state, dict) else None
    if not isinstance(state, dict):
        problem = "it holds no engine state"
    elif extra := sorted(repr(k)[:40] for k in state if k not in fields):
        problem = f"its state has fields an engine state lacks ({', '.join(extra[:5])})"
    elif missing := [k for k in _REQUIRED if k not in state]:
        problem = f"its state lacks {', '.join(missing)}"
    elif isinstance(state["round"], bool) or not isinstance(state["round"], int) or state["round"] < 0:
        problem = f"its round is {repr(state['round'])[:40]}, not an integer >= 0"
    elif not isinstance(params, torch.Tensor):
        problem = f"its parameters are a {type(params).__name__}, not a tensor"
    elif like is not None and (params.shape != like.shape or params.dtype != like.dtype):
        problem = (f"its parameters are {tuple(params.shape)} {params.dtype}, this run's model has "
                   f"{tuple(like.shape)} {like.dtype}")
    else:
        return state
    raise CheckpointError(f"{path} is not a checkpoint of this run, or was written by another trustfl version: "
                          f"{problem}. Start afresh with --overwrite.")


def _check_records(path: Path) -> None:
    """Refuse a checkpoint that is not a whole zip archive or whose records fail their CRC-32."""
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        raise CheckpointError(f"{path} cannot be read: it is not a whole checkpoint ({err}); it was cut short or "
                              f"is not a trustfl checkpoint.") from None
    if damaged is not None:
        raise CheckpointError(f"{path} is damaged: its record {damaged!r} fails its CRC-32 check (the file changed "
                              f"after it was written). Resume from a copy, or start afresh with --overwrite.")


def _to_cpu(value: Any) -> Any:
    """``value`` with every tensor in its (nested) dicts, lists and tuples on the CPU."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value
