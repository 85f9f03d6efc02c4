"""Each sender's own randomness: a batch of messages from several clients encodes row ``i`` exactly as client ``i``
encoding its message alone, with its own generator (what a deployed node does), whoever else sends in the round.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import trustfl
from trustfl.compress.base import AbstractCompressor, Encoded, add_dither_
from trustfl.core.rng import make_generator
from trustfl.engine.links import Links
from trustfl.errors import ConfigError

D = 300
COMPRESSORS = {
    "qsgd": {"name": "qsgd", "levels": 7},
    "qsgd_minmax": {"name": "qsgd_minmax", "levels": 16},
    "lattice_paper": {"name": "lattice", "bits": 12, "step": 1e-3, "mode": "paper"},
    "lattice_code": {"name": "lattice", "bits": 12, "step": 1e-3, "mode": "code"},
}


def _x(rows: int) -> torch.Tensor:
    return torch.randn(rows, D, generator=torch.Generator().manual_seed(rows))


@pytest.mark.parametrize("width", [D, 1 << 17], ids=["small", "drawn_on_threads"])  # rng.PARALLEL_DRAW_MIN
@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_a_batch_encodes_each_row_as_its_sender_alone(name, width, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # run_draws' thread pool, even on one core
    params = dict(COMPRESSORS[name])
    comp = trustfl.build("compressor", params.pop("name"), **params)
    assert comp.rowwise_generators
    x = torch.randn(4, width, generator=torch.Generator().manual_seed(width))
    together = comp.encode(x, [make_generator(9, 1, i) for i in range(4)], 77)
    for i in range(4):
        alone = comp.encode(x[i:i + 1], make_generator(9, 1, i), 77)
        for key, t in alone.payload.items():
            assert torch.equal(together.payload[key][i:i + 1], t), (name, key, i)


def test_a_dithered_row_does_not_depend_on_the_other_senders():
    links = Links(trustfl.build("compressor", "qsgd", levels=3), None, seed=5)
    x = _x(3)
    three = links.up(x, None, 2, [4, 7, 9]).decoded
    alone = links.up(x[1:2], None, 2, [7]).decoded
    assert torch.equal(three[1], alone[0])
    other = links.up(x[1:2], None, 2, [8]).decoded  # another sender's stream: another rounding
    assert not torch.equal(other[0], alone[0])


@dataclass(frozen=True)
class RowAtATime(AbstractCompressor):
    """A compressor of your own that draws from one generator directly (no per-row support)."""

    @property
    def bits_per_coordinate(self) -> float:
        return 32.0

    def encode(self, x, gen, shared_seed):
        assert isinstance(gen, torch.Generator)  # never handed a list
        noise = torch.rand(x.shape, generator=gen)
        return Encoded({"values": x.float() + noise}, x.shape[0], x.shape[1])

    def decode(self, enc, key, shared_seed):
        return enc.payload["values"], torch.zeros(enc.rows, dtype=torch.long)


def test_a_compressor_of_your_own_without_rowwise_support_is_encoded_row_by_row():
    links = Links(RowAtATime(), None, seed=5)
    x = _x(3)
    three = links.up(x, None, 2, [4, 7, 9]).decoded
    for i, sender in enumerate([4, 7, 9]):
        assert torch.equal(three[i], links.up(x[i:i + 1], None, 2, [sender]).decoded[0])


def test_add_dither_wants_one_generator_per_row():
    with pytest.raises(ConfigError, match="one generator per row: 2 for a \\(3, 4\\) tensor"):
        add_dither_(torch.zeros(3, 4), [torch.Generator(), torch.Generator()])


@pytest.mark.parametrize("name, params", [("lattice", {"bits": 8, "step": 0.01}),
                                          ("lattice", {"bits": 8, "step": 0.01, "mode": "code"}),
                                          ("qsgd", {}), ("qsgd_minmax", {})])
def test_a_non_finite_message_arrives_non_finite_for_screening_to_reject(name, params):
    """The lattice's integer cast turned NaN and ±inf into the lattice point nearest the key: the server decoded a
    diverged client's NaN update as a finite one and accepted it. Every compressor now delivers such a row as NaN."""
    from trustfl.engine.round_parts import screen
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0)) * 0.1
    x[1, 2], x[2, 0], x[3, 5] = float("nan"), float("inf"), -float("inf")
    sent = Links(trustfl.build("compressor", name, **params), None, seed=0).up(x, None, 0, [0, 1, 2, 3])
    assert torch.isfinite(sent.decoded[0]).all() and not torch.isfinite(sent.decoded[1:]).all(dim=1).any()
    assert screen(sent.decoded, 6).tolist() == [True, False, False, False]


@pytest.mark.parametrize("mode", ["paper", "code"])
@pytest.mark.parametrize("value", [1e30, 4e34, 3e38])
def test_a_finite_message_whose_coding_overflows_counts_every_coordinate_as_failed(mode, value):
    """Past about 3e34 at step 1e-4, the rotated row times 1/step overflows float32: the oracle's exact decode came
    out NaN, and `|decoded − exact| > s/2` is False for NaN, so none of the wrongly decoded coordinates was counted."""
    d = 256
    x = torch.stack([torch.full((d,), value), torch.randn(d, generator=torch.Generator().manual_seed(1)) * 0.01])
    links = Links(trustfl.build("compressor", "lattice", bits=14, step=1e-4, mode=mode), None, seed=0)
    sent = links.up(x, None, 0, [0, 1])
    assert not bool(torch.isclose(sent.decoded[0], x[0], rtol=1e-3).any())  # decoded wrong, every coordinate
    assert sent.decode_failures == d
    assert torch.allclose(sent.decoded[1], x[1], atol=5e-4)  # the honest row, decoded to within a few steps
