"""Pairwise seeds by real key agreement: X25519 key pairs, a public-key directory and HKDF-SHA256 seeds.

Every client holds an X25519 key pair. The server relays only public keys (:class:`PublicKeyDirectory`). Clients
``i`` and ``j`` compute the same shared secret ``X25519(sk_i, pk_j) = X25519(sk_j, pk_i)`` and derive, for each
``(purpose, round)``, a 64-bit seed with HKDF-SHA256 (RFC 5869) whose ``info`` binds
``(min(i, j), max(i, j), purpose, round)``, as in secure aggregation (Bonawitz et al. 2017). The seed keeps its full
64 bits (``torch.Generator.manual_seed`` takes up to ``2**64 − 1``); folding it to 32 bits, as Flower's SecAgg+
does before ``RandomState``, would make collisions between the ``n(n−1)/2`` pair streams likely at scale.

For reproducible simulation, :meth:`ClientKeys.generate` derives the private key deterministically from a 32-byte
seed and the client id; in a deployment each client generates its key from the OS (``seed=None``).

References:
  Bonawitz et al. Practical Secure Aggregation for Privacy-Preserving Machine Learning. CCS 2017.
  https://eprint.iacr.org/2017/281
  Krawczyk, Eronen. RFC 5869: HKDF. https://www.rfc-editor.org/rfc/rfc5869
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from trustfl.core.checks import check_number
from trustfl.errors import PrivacyError

KEY_BYTES = 32
_KEY_SALT = b"trustfl/x25519-client-key/v1"
_SEED_SALT = b"trustfl/pair-seed/v1"


def _check_id(value: object, name: str) -> int:
    return int(check_number(name, value, integer=True, low=0, high=2**63, high_open=True, error=PrivacyError))


def _hkdf(key_material: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(key_material)


@dataclass(frozen=True, eq=False)
class ClientKeys:
    """One client's X25519 key pair. The private key never leaves the client; share :attr:`public_bytes`.

    Attributes:
      client_id: the client's id.
      private_key: the X25519 private key (not shown in ``repr``).
    """

    client_id: int
    private_key: X25519PrivateKey = field(repr=False)

    def __post_init__(self) -> None:
        _check_id(self.client_id, "client_id")
        if not isinstance(self.private_key, X25519PrivateKey):
            raise PrivacyError(f"`private_key` must be an X25519PrivateKey, found {type(self.private_key).__name__}.")

    @classmethod
    def generate(cls, client_id: int, seed: bytes | None = None) -> "ClientKeys":
        """A key pair for ``client_id``: fresh from the OS, or derived from a 32-byte ``seed`` (simulation).

        With a seed: ``sk = HKDF-SHA256(ikm=seed, salt="trustfl/x25519-client-key/v1", info=id as 8 bytes, L=32)``
        (X25519 clamps the scalar itself), so each client's key is a deterministic function of ``(seed, id)``.

        Raises:
          PrivacyError: if ``seed`` is not 32 bytes or ``client_id`` is not an integer in ``[0, 2**63)``.

        Example:
          >>> a = ClientKeys.generate(3, bytes(32)); b = ClientKeys.generate(3, bytes(32))
          >>> a.public_bytes == b.public_bytes, len(a.public_bytes)
          (True, 32)
        """
        _check_id(client_id, "client_id")
        if seed is None:
            return cls(client_id, X25519PrivateKey.generate())
        if not isinstance(seed, bytes) or len(seed) != KEY_BYTES:
            found = f"{len(seed)} bytes" if isinstance(seed, bytes) else type(seed).__name__
            raise PrivacyError(f"`seed` must be None or exactly {KEY_BYTES} bytes, found {found}.")
        raw = _hkdf(seed, _KEY_SALT, struct.pack(">Q", client_id), KEY_BYTES)
        return cls(client_id, X25519PrivateKey.from_private_bytes(raw))

    @property
    def public_bytes(self) -> bytes:
        """The 32-byte raw public key, the only part the server sees."""
        return self.private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


@dataclass(frozen=True)
class PublicKeyDirectory:
    """The server's relay: client id → 32-byte raw X25519 public key. It holds no secret.

    Build it with :meth:`of` from the clients' key pairs (each client contributes only ``public_bytes``) or from
    a ``{id: public bytes}`` mapping.
    """

    entries: tuple[tuple[int, bytes], ...]
    _index: dict[int, bytes] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        index: dict[int, bytes] = {}
        for cid, pub in self.entries:
            _check_id(cid, "client id")
            if cid in index:
                raise PrivacyError(f"client id {cid} appears twice in the public-key directory.")
            if not isinstance(pub, bytes) or len(pub) != KEY_BYTES:
                raise PrivacyError(f"the public key of client {cid} must be {KEY_BYTES} raw bytes, found {pub!r}.")
            index[cid] = pub
        object.__setattr__(self, "_index", index)

    @classmethod
    def of(cls, keys: Iterable[ClientKeys] | Mapping[int, bytes]) -> "PublicKeyDirectory":
        """From key pairs (public halves only are kept) or from an ``{id: public bytes}`` mapping."""
        if isinstance(keys, Mapping):
            items = [(int(k), bytes(v)) for k, v in keys.items()]
        else:
            items = [(k.client_id, k.public_bytes) for k in keys]
        return cls(tuple(sorted(items)))

    def __getitem__(self, client_id: int) -> bytes:
        if client_id in self._index:
            return self._index[client_id]
        raise PrivacyError(f"no public key for client {client_id!r}; the directory holds ids {self.ids}.")

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._index

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def ids(self) -> tuple[int, ...]:
        """The client ids, sorted."""
        return tuple(cid for cid, _ in self.entries)


def shared_secret(my_private: X25519PrivateKey | ClientKeys, their_public: bytes) -> bytes:
    """The 32-byte X25519 shared secret; both ends of a pair compute the same bytes.

    Raises:
      PrivacyError: if ``their_public`` is not a valid 32-byte X25519 public key (e.g. a low-order point).
    """
    sk = my_private.private_key if isinstance(my_private, ClientKeys) else my_private
    try:
        return sk.exchange(X25519PublicKey.from_public_bytes(their_public))
    except ValueError as exc:
        raise PrivacyError(f"key agreement failed with public key {their_public!r}: {exc}") from exc


def seed_from_secret(secret: bytes, my_id: int, their_id: int, purpose: str, round: int) -> int:
    """The 64-bit pair seed ``HKDF-SHA256(ikm=secret, salt="trustfl/pair-seed/v1", info, L=8)`` as an integer.

    ``info = min_id (8 B) ‖ max_id (8 B) ‖ round (8 B) ‖ len(purpose) (4 B) ‖ purpose (UTF-8)``, big-endian, so
    the encoding is unambiguous and both ends (which order the ids the same way) derive the same seed.

    Raises:
      PrivacyError: if the ids are equal or out of range, ``round < 0`` or ``purpose`` is empty.
    """
    lo, hi = sorted((_check_id(my_id, "my_id"), _check_id(their_id, "their_id")))
    if lo == hi:
        raise PrivacyError(f"a pair seed needs two different clients, found my_id = their_id = {lo}.")
    _check_id(round, "round")
    if not isinstance(purpose, str) or not purpose:
        raise PrivacyError(f"`purpose` must be a non-empty string, found {purpose!r}.")
    tag = purpose.encode()
    info = struct.pack(">QQQI", lo, hi, round, len(tag)) + tag
    return int.from_bytes(_hkdf(secret, _SEED_SALT, info, 8), "big")


def pair_seed(my_private: X25519PrivateKey | ClientKeys, their_public: bytes, my_id: int, their_id: int,
              purpose: str, round: int) -> int:
    """The 64-bit seed that clients ``my_id`` and ``their_id`` share for ``(purpose, round)``.

    Client ``i`` calls ``pair_seed(sk_i, pk_j, i, j, p, t)`` and client ``j`` calls ``pair_seed(sk_j, pk_i, j, i,
    p, t)``; both get the same value in ``[0, 2**64)``, and any other pair, round or purpose gives an independent one.

    Example:
      >>> a, b = ClientKeys.generate(0, bytes(32)), ClientKeys.generate(1, bytes(32))
      >>> pair_seed(a, b.public_bytes, 0, 1, "noise", 5) == pair_seed(b, a.public_bytes, 1, 0, "noise", 5)
      True
    """
    return seed_from_secret(shared_secret(my_private, their_public), my_id, their_id, purpose, round)
