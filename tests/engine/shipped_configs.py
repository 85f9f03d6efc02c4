"""Shared by the shipped-config regression test and its fixture generator.

Every TOML file under ``configs/`` runs for 2 rounds with small overrides so that the whole set runs in CI:
MNIST and Fashion-MNIST configs read a small seeded *fake* data set written as IDX files (the checksum check is off),
so the convolutional model, ghost clipping and every recipe path stay covered without the real data (which ``make
data`` fetches, and which neither CI nor a fresh machine has).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from trustfl.data.datasets import IDX_FILES
from trustfl.data.idx import write_idx

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "configs").rglob("*.toml"))
FIXTURES = Path(__file__).resolve().parent / "fixtures"
IDX_SETS = ("mnist", "fashion_mnist")
"""The downloaded data sets that the shipped configs' tests replace by the fake one."""
VOLATILE = {"wall_time_s"}
"""Row keys that measure time, not computation: left out of the comparison."""


def write_fake_idx(data_dir: Path, train: int = 6000, test: int = 500) -> None:
    """Seeded uint8 images whose mean brightness depends on the label (learnable, not real MNIST), written as each
    of :data:`IDX_SETS` under ``data_dir``."""
    for name in IDX_SETS:
        rng = np.random.default_rng(1234)
        folder = data_dir / name
        folder.mkdir(parents=True, exist_ok=True)
        for split, n in (("train", train), ("test", test)):
            labels = rng.integers(0, 10, size=n).astype(np.uint8)
            images = rng.integers(0, 128, size=(n, 28, 28)) + 12 * labels[:, None, None]
            write_idx(folder / IDX_FILES[f"{split}_images"], images.astype(np.uint8))
            write_idx(folder / IDX_FILES[f"{split}_labels"], labels)


def overrides(config: str, data_dir: Path) -> list[str]:
    """The ``--set`` overrides of the 2-round run of ``config``."""
    out = ["rounds=2", "engine.checkpoint_every=0", "engine.eval_every=1"]
    if any(f'dataset = "{name}"' in (ROOT / config).read_text() for name in IDX_SETS):
        out += [f'data.data_dir="{data_dir}"', "data.options={ verify = false }"]
    return out


def fixture_path(config: str) -> Path:
    return FIXTURES / (config.removeprefix("configs/").removesuffix(".toml").replace("/", "__") + ".jsonl")
