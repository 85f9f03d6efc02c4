"""Every registered compressor through the same checks, the identity, and the doctests."""
from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest
import torch

import trustfl
import trustfl.compress
from trustfl.compress import AbstractCompressor, Encoded, Identity
from trustfl.errors import MessageError

NAMES = ("identity", "lattice", "qsgd", "qsgd_minmax")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_the_registry_lists_every_compressor():
    assert set(NAMES) <= set(trustfl.names("compressor"))


@pytest.mark.parametrize("name", NAMES)
def test_conformance(name):
    comp = trustfl.build("compressor", name)
    assert isinstance(comp, AbstractCompressor)
    m, d = 3, 333
    x = torch.randn(m, d, generator=_gen(0)) * 0.1
    x64 = x.double()
    enc = comp.encode(x64, _gen(1), 17)
    assert isinstance(enc, Encoded) and enc.rows == m and enc.dim == d
    assert all(t.shape[0] == m for t in enc.payload.values())
    assert enc.bits_per_row() == 8 * enc.nbytes() // m
    assert enc.bits_per_row() >= comp.bits_per_coordinate * d
    key = x + 1e-3 if comp.needs_key else None
    dec, failures = comp.decode(enc, key, 17)
    assert dec.shape == (m, d) and dec.dtype == torch.float32
    assert failures.shape == (m,) and failures.dtype == torch.int64 and int(failures.sum()) == 0
    bound = {  # the per-coordinate error each quantizer guarantees at its defaults
        "identity": 0.0,
        "lattice": 16 * 1e-4,  # |error| < step per rotated coordinate, <= sqrt(block)·step after rotating back
        "qsgd": x.norm(dim=1, keepdim=True) / 7,  # one level, norm/s
        "qsgd_minmax": (x.amax(dim=1, keepdim=True) - x.amin(dim=1, keepdim=True)) / 15,  # one level
    }[name]
    assert ((dec - x).abs() <= bound * (1 + 1e-5) + 1e-7).all()
    again = comp.encode(x64, _gen(1), 17)  # deterministic given the generator
    assert all(torch.equal(again.payload[k], v) for k, v in enc.payload.items())
    assert not x64.equal(torch.zeros_like(x64))  # the input was not modified in place
    torch.testing.assert_close(x64.float(), x)
    assert comp.with_segments((300, 33)).bits_per_coordinate == comp.bits_per_coordinate
    with pytest.raises(MessageError, match=r"floating \(m, d\) tensor"):
        comp.encode(x[0], _gen(1), 17)  # rows are required


def test_identity_is_exact_at_32_bits():
    x = torch.randn(4, 100, generator=_gen(2)) * 1e3
    comp = Identity()
    enc = comp.encode(x, None, 0)
    dec, failures = comp.decode(enc, None, 0)
    assert torch.equal(dec, x) and failures.tolist() == [0] * 4
    assert comp.bits_per_coordinate == 32 and enc.bits_per_row() == 32 * 100
    x.add_(1.0)  # the payload is a copy, not a view of the sender's tensor
    assert not torch.equal(enc.payload["values"], x)


def test_encoded_checks_the_row_dimension():
    with pytest.raises(MessageError, match="leading dimension"):
        Encoded({"codes": torch.zeros(2, 4, dtype=torch.uint8)}, rows=3, dim=4)


def test_docstring_examples_run():
    failed = attempted = 0
    modules = [trustfl.compress] + [importlib.import_module(info.name)
                                    for info in pkgutil.iter_modules(trustfl.compress.__path__, "trustfl.compress.")]
    for module in modules:
        result = doctest.testmod(module, extraglobs={"torch": torch})
        failed, attempted = failed + result.failed, attempted + result.attempted
    assert failed == 0 and attempted >= 30


def _encoded(name: str, x: torch.Tensor) -> Encoded:
    return trustfl.build("compressor", name).encode(x, _gen(1), 17)


@pytest.mark.parametrize("sender,receiver", [(s, r) for s in NAMES for r in NAMES if s != r])
def test_a_payload_of_another_compressor_is_refused_naming_the_receiver(sender, receiver):
    """Decoding another compressor's payload raised KeyError 'codes' / 'fmax' / 'values'."""
    x = torch.randn(2, 40, generator=_gen(3))
    comp = trustfl.build("compressor", receiver)
    with pytest.raises(MessageError, match=f"compressor '{receiver}' cannot decode"):
        comp.decode(_encoded(sender, x), x if comp.needs_key else None, 17)


@pytest.mark.parametrize("name", NAMES)
def test_malformed_payloads_and_arguments_are_message_errors(name):
    """A header of the wrong shape raised RuntimeError; a list of ints for `gen` and shared_seed=None TypeError."""
    comp = trustfl.build("compressor", name)
    x = torch.randn(2, 40, generator=_gen(4))
    key = x if comp.needs_key else None
    enc = comp.encode(x, _gen(1), 17)
    for k, t in enc.payload.items():
        wider = Encoded({**enc.payload, k: torch.cat([t, t[:, :1]], dim=1)}, enc.rows, enc.dim)
        with pytest.raises(MessageError, match=f"compressor '{name}' cannot decode payload tensor '{k}'"):
            comp.decode(wider, key, 17)
        other = Encoded({**enc.payload, k: t.to(torch.float64 if t.dtype == torch.uint8 else torch.int32)},
                        enc.rows, enc.dim)
        with pytest.raises(MessageError, match=f"'{k}'"):
            comp.decode(other, key, 17)
    with pytest.raises(MessageError, match=f"compressor '{name}' decodes an Encoded"):
        comp.decode(dict(enc.payload), key, 17)
    with pytest.raises(MessageError, match="`gen` must be None, a torch.Generator or a list of 2"):
        comp.encode(x, [1, 2], 0)
    with pytest.raises(MessageError, match="`gen`"):
        comp.encode(x, [_gen(1)], 0)  # one generator for two rows
    with pytest.raises(MessageError, match=f"compressor '{name}': `shared_seed` must be an integer"):
        comp.encode(x, _gen(1), None)
    with pytest.raises(MessageError, match="`shared_seed`"):
        comp.decode(enc, key, None)
    with pytest.raises(MessageError, match="`key`"):
        comp.decode(enc, [0.0] * 40, 17)
    with pytest.raises(MessageError, match=r"floating \(m, d\) tensor"):
        comp.encode([[1.0, 2.0]], _gen(1), 17)
    # lattice (paper mode) and qsgd_minmax crashed in autograd (in-place steps on a graph), qsgd sent it along
    with pytest.raises(MessageError, match=f"^compressor '{name}': the messages require grad; encode `x.detach\\(\\)`"):
        comp.encode(x.clone().requires_grad_(), _gen(1), 17)
    for other in ("code",) if name == "lattice" else ():
        with pytest.raises(MessageError, match="require grad"):
            trustfl.build("compressor", name, mode=other).encode(x.clone().requires_grad_(), _gen(1), 17)


@pytest.mark.parametrize("name", NAMES)
def test_float64_values_beyond_float32_are_refused_not_sent_as_inf(name):
    comp = trustfl.build("compressor", name)
    x = torch.zeros(2, 8, dtype=torch.float64)
    x[1, 3] = 1e300
    with pytest.raises(MessageError, match="beyond float32's range"):
        comp.encode(x, _gen(1), 17)
    x[1, 3] = float("inf")  # non-finite rows still go through, for screening to reject
    comp.encode(x, _gen(1), 17)
