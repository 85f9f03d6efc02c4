"""The compressed links between server and clients: one compressor on the uplink, one on the downlink.

A link call is the simulated transmission: the sender encodes, the receiver decodes (with its own reference
point when the compressor needs one, e.g. the lattice quantizer), and the bits counted are those of the encoded
payload. Decode failures of a quantizer with a reference point are counted exactly (a simulation oracle: the
receiver's value is compared with what decoding against the sender's own value gives), never silently wrong. The
shared seed (for the lattice rotation) derives from the run seed, the round and the direction; the
sender's private randomness (dithering, stochastic rounding) from the run seed, the round, the sender (each client
of an uplink its own, the server on the downlink) and the direction, on the device of the data: a deployed node
encodes its own message exactly as the simulation did (:meth:`Links.encode`). A deployment's server sees only the
failures the receiver detects itself (:meth:`Links.decode`); the oracle needs the sent value.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from trustfl.compress.base import AbstractCompressor, Encoded
from trustfl.core.checks import describe_value
from trustfl.core.finite import finite_rows
from trustfl.core.registry import component_name, of_trustfl
from trustfl.core.rng import SERVER, derive_seed, make_generator
from trustfl.errors import ConfigError, MessageError

UNCOMPRESSED_BITS = 32


@dataclass(frozen=True)
class Sent:
    """What the receivers decoded (``(m, d)``), the bits of one message and the coordinates flagged as unsafe."""

    decoded: torch.Tensor
    bits_per_message: int
    decode_failures: int


@dataclass(frozen=True)
class Links:
    """``uplink`` and ``downlink`` compressors (``None``: float32 both ways)."""

    uplink: AbstractCompressor | None
    downlink: AbstractCompressor | None
    seed: int

    def compressor(self, direction: str) -> AbstractCompressor | None:
        """The compressor of ``direction``: ``"up"`` (clients → server) or ``"down"``."""
        return self.uplink if direction == "up" else self.downlink

    def nominal_bits(self, direction: str) -> float:
        comp = self.compressor(direction)
        return float(UNCOMPRESSED_BITS if comp is None else comp.bits_per_coordinate)

    def _send(self, x: torch.Tensor, key: torch.Tensor | None, r: int, senders: Sequence[int], direction: str,
              receivers: int) -> Sent:
        comp = self.compressor(direction)
        if comp is None:
            return Sent(x.expand(receivers, -1) if x.shape[0] == 1 else x, UNCOMPRESSED_BITS * x.shape[1], 0)
        sent = self.encode(x, r, senders, direction)
        enc = sent
        if enc.rows != receivers:  # one message decoded by several receivers (the server's broadcast)
            enc = Encoded({k: v.expand(receivers, *v.shape[1:]) for k, v in enc.payload.items()}, receivers, enc.dim)
        decoded, failures = self.decode(enc, key, r, direction, x)
        if comp.needs_key and key is not None:
            # Simulation oracle: decoding against the sender's own value is always exact, so any coordinate the
            # receiver decoded differently landed on a wrong lattice point (the receiver's own check only sees
            # coordinates near the edge of its decoding window). One exact decode per message, not per receiver.
            # A message whose coding overflowed float32 (a finite row times 1/step past 3.4e38) decodes to NaN even
            # against itself: every such coordinate is a failure (`not <=` counts NaN, `>` did not).
            exact, _ = comp.decode(sent, x, self.shared_seed(r, direction))
            failures = max(failures, int((~((decoded - exact).abs() <= 0.5 * getattr(comp, "step", 0.0))).sum()))
        # No quantizer's code carries NaN or ±inf (the lattice's integer cast lands them on a finite point near the
        # key): a row that held one arrives as not-a-number, for screening to reject, as on a float32 link.
        decoded = torch.where(finite_rows(x).view(-1, 1), decoded, torch.nan)
        return Sent(decoded.to(x.dtype), enc.bits_per_row(), failures)

    def shared_seed(self, r: int, direction: str) -> int:
        """The seed both ends of a ``direction`` link know in round ``r`` (the lattice's rotation)."""
        return derive_seed(self.seed, r, SERVER, f"compress/{direction}/shared") % (2 ** 62)

    def encode(self, x: torch.Tensor, r: int, senders: Sequence[int], direction: str,
               private_seed: int | None = None) -> Encoded:
        """``x`` (one row per sender) as its senders encode it on ``direction``'s compressor: each with its own
        generator, from the run seed (or a deployed node's ``private_seed``), the round, the sender and the
        direction, so that a node encoding its own message draws what the simulation drew for it (a compressor
        without :attr:`~AbstractCompressor.rowwise_generators` encodes row by row)."""
        comp, shared = self.compressor(direction), self.shared_seed(r, direction)
        seed = self.seed if private_seed is None else private_seed
        gens = [make_generator(seed, r, s, f"compress/{direction}", device=x.device) for s in senders]
        if len(gens) == 1:
            return comp.encode(x, gens[0], shared)
        if comp.rowwise_generators:
            return comp.encode(x, gens, shared)
        parts = [comp.encode(x[i:i + 1], g, shared) for i, g in enumerate(gens)]
        return Encoded({k: torch.cat([p.payload[k] for p in parts]) for k in parts[0].payload}, len(parts),
                       parts[0].dim)

    def expected_payload(self, r: int, direction: str, like: torch.Tensor) -> Encoded:
        """One message of ``like``'s width encoded on ``direction`` (zeros): the arrays, shapes and dtypes that a
        payload received over a network must have (:func:`payload_problem`)."""
        return self.encode(like.new_zeros(1, like.numel()), r, [SERVER], direction)

    def decode(self, enc: Encoded, key: torch.Tensor | None, r: int, direction: str,
               sent: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
        """What the receivers of ``direction`` decode from ``enc`` (``(rows, d)``) and the failures they detect
        themselves. ``sent``: the encoded rows, where known (the simulation), to check a compressor of your own
        against."""
        comp = self.compressor(direction)
        out = comp.decode(enc, key, self.shared_seed(r, direction))
        if not of_trustfl(comp):
            _check_decoded(comp, direction, out, sent, enc.dim, enc.rows)
        decoded, flagged = out
        return decoded, int(flagged.sum())

    def decode_received(self, payload: object, expected: Encoded, r: int, direction: str, like: torch.Tensor,
                        what: str) -> tuple[torch.Tensor, int]:
        """One message received over a network on ``direction`` (a deployment), decoded into ``like``'s device,
        dtype and width (a quantizer with a reference point against 0, as the simulator's delta messages), and the
        failures the receiver detects itself.

        Raises:
          MessageError: ``what`` (e.g. "node 3's reply") followed by the problem: a payload of other arrays,
            shapes or dtypes than ``expected`` (:meth:`expected_payload`), or one that cannot be decoded.
        """
        problem = payload_problem(payload, expected)
        if problem is not None:
            raise MessageError(f"{what} {problem}.")
        d = like.numel()
        enc = Encoded({k: v.to(like.device) for k, v in payload.items()}, 1, d)  # type: ignore[union-attr]
        key = like.new_zeros(1, d) if self.compressor(direction).needs_key else None
        try:
            decoded, failures = self.decode(enc, key, r, direction)
        except (RuntimeError, ValueError) as err:  # the right shapes, still not decodable
            raise MessageError(f"{what} cannot be decoded ({err}).") from None
        return decoded[0].to(like.dtype), failures

    def up(self, messages: torch.Tensor, keys: torch.Tensor | None, r: int, senders: Sequence[int]) -> Sent:
        """Clients ``senders``' ``(m, d)`` messages as the server decodes them (``keys``: the server's reference
        points)."""
        if keys is None and self.uplink is not None and self.uplink.needs_key:
            keys = torch.zeros_like(messages)
        return self._send(messages, keys, r, senders, "up", messages.shape[0])

    def down(self, model: torch.Tensor, r: int, keys: torch.Tensor | None = None, receivers: int = 1) -> Sent:
        """The server's ``(d,)`` model, encoded once, as ``receivers`` clients decode it (``keys``: theirs)."""
        if keys is not None:
            receivers = keys.shape[0]
        return self._send(model.unsqueeze(0), keys, r, [SERVER], "down", receivers)


def payload_problem(coded: object, like: Encoded) -> str | None:
    """Why ``coded``, one message's payload from the other side of a deployment, is not shaped as ``like``'s
    payload (the encoder's own output for one row), or ``None``: decoding a payload of other shapes or dtypes
    would fail or read garbage."""
    if not isinstance(coded, dict) or set(coded) != set(like.payload):
        found = sorted(coded) if isinstance(coded, dict) else type(coded).__name__
        return f"holds {found}, not the compressor's {sorted(like.payload)}"
    for name, want in like.payload.items():
        got = coded[name]
        if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
            return f"holds {name!r} as {describe_value(got)}, not {describe_value(want)}"
    return None


def _check_decoded(comp: AbstractCompressor, direction: str, out: object, x: torch.Tensor | None, d: int,
                   rows: int) -> None:
    """Refuse (ConfigError naming the compressor) what a compressor of your own decoded from ``x`` (the sent rows;
    one row for a broadcast; ``None`` where the receiver does not know them) unless it is ``(decoded, failures)``:
    ``(rows, d)`` floats, finite where the sent row was, and ``(rows,)`` integer counts, none negative. Otherwise
    its messages would be rejected as malformed (uplink) or poison every client (downlink), as if the senders were
    at fault."""
    problem = None
    if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out)):
        problem = f"a {type(out).__name__}"
    else:
        decoded, flagged = out
        if decoded.shape != (rows, d) or not decoded.is_floating_point() or flagged.shape != (rows,) or \
                flagged.is_floating_point() or flagged.dtype == torch.bool:
            problem = f"({describe_value(decoded)}, {describe_value(flagged)})"
        elif bool((flagged < 0).any()):
            problem = f"negative failure counts ({describe_value(flagged)})"
        elif x is not None and bool((finite_rows(x).expand(rows) & ~finite_rows(decoded)).any()):
            problem = "non-finite values (NaN or ±inf) where the sent rows were finite"
    if problem is not None:
        key = "compress.uplink" if direction == "up" else "compress.downlink"
        raise ConfigError(f"`{key}`: {component_name('compressor', comp)} decoded {problem} ({rows} "
                          f"message(s) of {d} coordinates); decode() must return (decoded, failures): a ({rows}, {d}) "
                          f"float tensor, finite where the message is, and a ({rows},) integer tensor of counts >= 0.")
