"""Key agreement: X25519 key pairs, the public directory and 64-bit HKDF pair seeds."""
from __future__ import annotations

import dataclasses
import pickle

import pytest
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from trustfl.errors import PrivacyError
from trustfl.privacy.keys import ClientKeys, PublicKeyDirectory, pair_seed, seed_from_secret, shared_secret

SEED = bytes(range(32))


def _private_bytes(k: ClientKeys) -> bytes:
    return k.private_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


@pytest.fixture(scope="module")
def keys() -> list[ClientKeys]:
    return [ClientKeys.generate(i, SEED) for i in range(5)]


def test_both_ends_derive_the_same_seed(keys: list[ClientKeys]) -> None:
    directory = PublicKeyDirectory.of(keys)
    for i in range(5):
        for j in range(5):
            if i != j:
                a = pair_seed(keys[i], directory[j], i, j, "noise", 3)
                b = pair_seed(keys[j], directory[i], j, i, "noise", 3)
                assert a == b
    assert shared_secret(keys[0], directory[1]) == shared_secret(keys[1], directory[0])


def test_pairs_rounds_purposes_differ(keys: list[ClientKeys]) -> None:
    d = PublicKeyDirectory.of(keys)
    seeds = {pair_seed(keys[i], d[j], i, j, p, t)
             for i in range(5) for j in range(i + 1, 5) for p in ("noise", "mask") for t in range(4)}
    assert len(seeds) == 10 * 2 * 4
    # a third client using its own key (the server never has one) cannot reproduce the pair's seed
    assert pair_seed(keys[2], d[1], 0, 1, "noise", 0) != pair_seed(keys[0], d[1], 0, 1, "noise", 0)
    # the info encoding is unambiguous: ids are length-prefixed fixed-width fields
    secret = shared_secret(keys[0], d[1])
    assert seed_from_secret(secret, 1, 23, "x", 4) != seed_from_secret(secret, 12, 3, "x", 4)


def test_seed_is_64_bits_not_folded(keys: list[ClientKeys]) -> None:
    d = PublicKeyDirectory.of(keys)
    seeds = [pair_seed(keys[0], d[1], 0, 1, "noise", t) for t in range(64)]
    assert all(isinstance(s, int) and 0 <= s < 2**64 for s in seeds)
    # a 32-bit fold would keep every seed < 2**32; a uniform 64-bit seed is below that with probability 2**-32
    assert sum(s >= 2**32 for s in seeds) >= 63 and max(seeds) >= 2**62
    assert len(set(seeds)) == 64


def test_directory_holds_only_public_bytes(keys: list[ClientKeys]) -> None:
    d = PublicKeyDirectory.of(keys)
    assert [f.name for f in dataclasses.fields(d) if f.init] == ["entries"]
    assert d.ids == tuple(range(5)) and len(d) == 5 and 3 in d and 7 not in d
    blob = pickle.dumps(d.entries) + repr(d).encode()
    for k in keys:
        assert d[k.client_id] == k.public_bytes and len(d[k.client_id]) == 32
        assert _private_bytes(k) not in blob
        assert _private_bytes(k).hex().encode() not in blob
    assert all(isinstance(cid, int) and isinstance(pub, bytes) for cid, pub in d.entries)
    assert "private" not in repr(keys[0])
    assert PublicKeyDirectory.of({k.client_id: k.public_bytes for k in keys}) == d
    with pytest.raises(PrivacyError, match="no public key for client 9"):
        d[9]


def test_generate_is_deterministic_with_seed_and_random_without() -> None:
    assert ClientKeys.generate(4, SEED).public_bytes == ClientKeys.generate(4, SEED).public_bytes
    assert ClientKeys.generate(4, SEED).public_bytes != ClientKeys.generate(5, SEED).public_bytes
    assert ClientKeys.generate(4, SEED).public_bytes != ClientKeys.generate(4, bytes(32)).public_bytes
    assert ClientKeys.generate(4).public_bytes != ClientKeys.generate(4).public_bytes


def test_errors(keys: list[ClientKeys]) -> None:
    with pytest.raises(PrivacyError, match="32 bytes"):
        ClientKeys.generate(0, b"short")
    with pytest.raises(PrivacyError, match="client_id"):
        ClientKeys.generate(-1, SEED)
    with pytest.raises(PrivacyError, match="two different clients"):
        pair_seed(keys[0], keys[1].public_bytes, 2, 2, "noise", 0)
    with pytest.raises(PrivacyError, match="purpose"):
        pair_seed(keys[0], keys[1].public_bytes, 0, 1, "", 0)
    with pytest.raises(PrivacyError, match="round"):
        pair_seed(keys[0], keys[1].public_bytes, 0, 1, "noise", -1)
    with pytest.raises(PrivacyError, match="twice"):
        PublicKeyDirectory(((0, keys[0].public_bytes), (0, keys[1].public_bytes)))
    with pytest.raises(PrivacyError, match="32 raw bytes"):
        PublicKeyDirectory(((0, b"x"),))
    with pytest.raises(PrivacyError, match="key agreement failed"):
        shared_secret(keys[0], bytes(32))  # the all-zero point has low order
