"""What travels between a deployed server and its nodes: named arrays plus a flat table of scalars.

A *wire message* is ``(arrays, config)``: ``arrays`` maps names to NumPy arrays and ``config`` maps names to
ints, floats, strings, bytes or lists of them, the two record kinds every transport carries (Flower's
``ArrayRecord`` and ``ConfigRecord``). Three messages exist:

* hello (node → server, once): the node's client id, its 32-byte X25519 public key and its number of examples;
* train request (server → node, each round): the round, the downlink payload (the model and the gradient
  transforms' shared values, encoded by the downlink stages; with ``compress.downlink``, the model as the
  compressor encoded it, under ``coded/``) and the public-key directory;
* train reply (node → server): the message row (with ``compress.uplink``, as the compressor encoded it, under
  ``coded/``), its extras, the completed local steps, the local loss and the client stages' metrics, and whether
  it is a *replay*: the node's earlier reply to the same request, sent again to a resumed server.

Everything read from the other side is untrusted: :func:`read_reply` never raises, and turns anything malformed
into ``None`` fields the server screens out like a malformed simulated message.
"""
from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import torch

from trustfl.errors import MessageError
from trustfl.privacy.keys import KEY_BYTES, PublicKeyDirectory

_F32_MAX = float(torch.finfo(torch.float32).max)

Arrays = dict[str, np.ndarray]
Config = dict[str, Any]
Wire = tuple[Arrays, Config]

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
           "bfloat16": torch.bfloat16}
_CODE_DTYPES = {**_DTYPES, "uint8": torch.uint8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64}
"""What a compressor's payload may hold besides floats (packed codes)."""
_ENTRY = struct.Struct(">Q")


def to_array(t: torch.Tensor) -> tuple[np.ndarray, str]:
    """A CPU NumPy copy of ``t`` and its dtype name (bfloat16 travels as its int16 bit pattern)."""
    name = str(t.dtype).removeprefix("torch.")
    if name not in _CODE_DTYPES:
        raise MessageError(f"a wire tensor must be one of {sorted(_CODE_DTYPES)}, found {t.dtype}.")
    t = t.detach().to("cpu").contiguous()
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().copy(), name


def from_array(a: Any, dtype: str, device: torch.device | str = "cpu", kinds: Mapping[str, torch.dtype] = _DTYPES
               ) -> torch.Tensor:
    """The tensor :func:`to_array` sent, on ``device``; ``kinds``: the dtypes accepted (floats unless said).

    Raises:
      MessageError: if ``a`` is not an array of the announced dtype.
    """
    if dtype not in kinds or not isinstance(a, np.ndarray):
        raise MessageError(f"a wire tensor must be an array of one of {sorted(kinds)}, found {type(a).__name__} "
                           f"announced as {dtype!r}.")
    want = np.int16 if dtype == "bfloat16" else torch.empty(0, dtype=kinds[dtype]).numpy().dtype
    if a.dtype != want:
        raise MessageError(f"a wire tensor announced as {dtype} holds {a.dtype} values.")
    t = torch.from_numpy(np.ascontiguousarray(a).copy())
    return (t.view(torch.bfloat16) if dtype == "bfloat16" else t).to(device)


def put_coded(coded: Mapping[str, torch.Tensor], arrays: Arrays, config: Config) -> None:
    """Add a compressor's payload (one row) to a wire message, under ``coded/``."""
    for name, t in coded.items():
        arrays[f"coded/{name}"], config[f"dtype/coded/{name}"] = to_array(t)


def get_coded(arrays: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The compressor payload :func:`put_coded` added (empty if none).

    Raises:
      MessageError: if one of its arrays is not of its announced dtype.
    """
    return {k.removeprefix("coded/"): from_array(a, str(config.get(f"dtype/{k}")), kinds=_CODE_DTYPES)
            for k, a in arrays.items() if isinstance(k, str) and k.startswith("coded/")}


def pack_directory(directory: PublicKeyDirectory) -> bytes:
    """The directory as bytes: per client its id (8 bytes, big-endian) then its 32-byte public key."""
    return b"".join(_ENTRY.pack(cid) + directory[cid] for cid in directory.ids)


def unpack_directory(blob: Any) -> PublicKeyDirectory:
    """The inverse of :func:`pack_directory`.

    Raises:
      MessageError: if ``blob`` is not a whole number of entries.
    """
    width = _ENTRY.size + KEY_BYTES
    if not isinstance(blob, bytes) or len(blob) % width:
        raise MessageError(f"a public-key directory must be bytes in entries of {width}, found "
                           f"{type(blob).__name__} of length {len(blob) if isinstance(blob, bytes) else '?'}.")
    entries = {_ENTRY.unpack_from(blob, i)[0]: blob[i + _ENTRY.size:i + width] for i in range(0, len(blob), width)}
    return PublicKeyDirectory.of(entries)


@dataclass(frozen=True)
class Hello:
    """A node's introduction: who it is, its public key and how many examples it holds."""

    client_id: int
    public_key: bytes
    num_samples: int

    def to_wire(self) -> Wire:
        return {}, {"client_id": self.client_id, "public_key": self.public_key, "num_samples": self.num_samples}

    @classmethod
    def from_wire(cls, wire: Wire) -> "Hello":
        """Raises MessageError if a field is missing or of the wrong kind."""
        _, config = wire
        cid, key, size = config.get("client_id"), config.get("public_key"), config.get("num_samples")
        if not (_is_int(cid) and 0 <= cid < 2**63 and isinstance(key, bytes) and len(key) == KEY_BYTES
                and _is_int(size) and 0 <= size < 2**63):
            raise MessageError(f"a hello needs an int client_id in [0, 2^63), a {KEY_BYTES}-byte public_key and an int "
                               f"num_samples in [0, 2^63), found {sorted(config)}.")
        return cls(int(cid), key, int(size))


@dataclass(frozen=True)
class TrainRequest:
    """Round ``round``'s job for one node: the encoded downlink payload and the public-key directory."""

    round: int
    payload: Mapping[str, torch.Tensor]
    dtypes: Mapping[str, str]
    """Each payload tensor's dtype *before* the downlink stages encoded it (the decoder's target)."""
    directory: bytes = b""
    coded: Mapping[str, torch.Tensor] = field(default_factory=dict)
    """With ``compress.downlink``: the model as the compressor encoded it (one row), in place of
    ``payload["model"]``."""

    def to_wire(self) -> Wire:
        arrays, config = {}, {"round": self.round, "directory": self.directory}
        for name, t in self.payload.items():
            arrays[f"payload/{name}"], config[f"wire_dtype/{name}"] = to_array(t)
            config[f"dtype/{name}"] = self.dtypes[name]
        put_coded(self.coded, arrays, config)
        return arrays, config

    @classmethod
    def from_wire(cls, wire: Wire) -> "TrainRequest":
        """Raises MessageError if the request is malformed (a node refuses it)."""
        arrays, config = wire
        if not _is_int(config.get("round")) or not 0 <= config["round"] < 2 ** 63:
            raise MessageError(f"a train request needs an int round in [0, 2^63), found {config.get('round')!r}.")
        if not isinstance(config.get("directory", b""), bytes):  # a string or a list of ints is no directory
            raise MessageError(f"a train request's directory must be bytes, found "
                               f"{type(config['directory']).__name__}.")
        payload, dtypes = {}, {}
        for key, a in arrays.items():
            if not isinstance(key, str) or not key.startswith("payload/"):
                continue
            name = key.removeprefix("payload/")
            payload[name] = from_array(a, str(config.get(f"wire_dtype/{name}")))
            dtypes[name] = str(config.get(f"dtype/{name}"))
            if dtypes[name] not in _DTYPES:
                raise MessageError(f"payload {name!r} announces the unknown dtype {dtypes[name]!r}.")
        coded = get_coded(arrays, config)
        if ("model" in payload) == bool(coded):
            raise MessageError("a train request must carry the model, either as it is or encoded (coded/), not "
                               f"{'both' if coded else 'neither'}.")
        return cls(int(config["round"]), payload, dtypes, bytes(config.get("directory", b"")), coded)

    def torch_dtypes(self) -> dict[str, torch.dtype]:
        return {k: _DTYPES[v] for k, v in self.dtypes.items()}

    def digest(self, with_directory: bool) -> bytes:
        """A SHA-256 of everything a node's reply depends on: the round, every array with its name and dtypes,
        and the public-key directory when ``with_directory`` (the node draws pair noise from it)."""
        h = hashlib.sha256(_ENTRY.pack(self.round))
        arrays, config = self.to_wire()
        for name in sorted(arrays):
            a = np.ascontiguousarray(arrays[name])
            for part in (name, str(a.dtype), str(a.shape), config.get(f"dtype/{name.removeprefix('payload/')}")):
                h.update(str(part).encode() + b"\0")
            h.update(a.tobytes())
        if with_directory:
            h.update(self.directory)
        return h.digest()


@dataclass
class TrainReply:
    """A node's answer: its message row and extras, its completed steps, its local loss and stage metrics.

    Read from the wire, a malformed field is ``None`` (the server screens it out), never an exception.
    """

    client_id: int | None
    message: torch.Tensor | None
    extras: dict[str, torch.Tensor | None] = field(default_factory=dict)
    num_steps: int | None = None
    train_loss: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    coded: dict[str, torch.Tensor] | None = None
    """With ``compress.uplink``: the message as the compressor encoded it (one row), in place of ``message``
    (``None`` read from the wire: malformed)."""
    replayed: bool = False
    """The node's earlier reply to the same request, sent again (no new release of its data)."""

    def to_wire(self) -> Wire:
        arrays, config = {}, {"client_id": self.client_id, "num_steps": self.num_steps,
                              "train_loss": self.train_loss, "replayed": self.replayed}
        if self.message is not None:
            arrays["message"], config["dtype/message"] = to_array(self.message)
        put_coded(self.coded or {}, arrays, config)
        for name, t in self.extras.items():
            arrays[f"extra/{name}"], config[f"dtype/extra/{name}"] = to_array(t)
        config.update({f"metric/{k}": float(v) for k, v in self.metrics.items()})
        return arrays, config


def read_reply(wire: Any) -> TrainReply:
    """A :class:`TrainReply` from an untrusted wire message; never raises."""
    arrays, config = wire if isinstance(wire, tuple) and len(wire) == 2 else ({}, {})
    arrays = arrays if isinstance(arrays, Mapping) else {}
    config = config if isinstance(config, Mapping) else {}

    def tensor(key: str, dtype_key: str) -> torch.Tensor | None:
        try:
            return from_array(arrays.get(key), str(config.get(dtype_key)))
        except MessageError:
            return None

    extras = {k.removeprefix("extra/"): tensor(k, f"dtype/{k}") for k in arrays
              if isinstance(k, str) and k.startswith("extra/")}
    cid, steps, loss = config.get("client_id"), config.get("num_steps"), config.get("train_loss")
    metrics = {k.removeprefix("metric/"): float(v) for k, v in config.items()
               if isinstance(k, str) and k.startswith("metric/") and _is_number(v)}
    try:
        coded = get_coded(arrays, config) or None
    except MessageError:
        coded = None
    return TrainReply(int(cid) if _is_int(cid) else None, tensor("message", "dtype/message"), extras,
                      int(steps) if _is_int(steps) and steps >= 0 else None,
                      float(loss) if _is_number(loss) else None, metrics, coded, config.get("replayed") is True)


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    """A finite number float32 holds (a node's loss or metric; 10**400 or 1e308 would make the round's mean inf)."""
    if not isinstance(v, (int, float, np.integer, np.floating)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v) and abs(float(v)) <= _F32_MAX
    except OverflowError:  # an int beyond float64
        return False
