"""Shared by the shipped-config regression test and its fixture generator.

Every TOML file under ``configs/`` runs for 2 rounds with small overrides so that the whole set runs in CI:
MNIST and Fashion-MNIST configs read a small seeded *fake* data set written as IDX files (the checksum check is off),
so the convolutional model, ghost clipping and every recipe path stay covered without the real data (which ``make
data`` fetches, and which neither CI nor a fresh machine has).
"""
from __future__ import annotations

import json
import math
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


def fixture_path(config: str, cpu: str | None = None) -> Path:
    """The reference fixture of ``config``, or with ``cpu`` (a :func:`cpu_tag`) that CPU's variant of it."""
    name = config.removeprefix("configs/").removesuffix(".toml").replace("/", "__") + ".jsonl"
    return FIXTURES / name if cpu is None else FIXTURES / "cpu" / cpu / name


def fixture_variants(config: str) -> list[Path]:
    """Every fixture ``config`` may match: the reference one first, then the variants of other CPUs."""
    return [fixture_path(config), *sorted((FIXTURES / "cpu").glob(f"*/{fixture_path(config).name}"))]


def known_cpu(tag: str) -> bool:
    """Whether CPUs of ``tag`` have fixture variants: then every config must match a fixture at its tolerance."""
    return any((FIXTURES / "cpu" / tag).glob("*.jsonl"))


def skips_unmatched(config: str, tag: str) -> bool:
    """Whether a run of ``config`` that matches none of its fixtures is skipped rather than failed: ``config`` has
    CPU variants (its results depend on the CPU) and CPUs of ``tag`` have none."""
    return len(fixture_variants(config)) > 1 and not known_cpu(tag)


UNKNOWN_CPU_SLACK = 100
"""On a CPU without variants (:func:`known_cpu` false), a run that misses every fixture at its tolerance but matches
one at this many times the tolerance is skipped, not failed. A CPU not seen before rounds differently, and that is
not a regression: a 2-core Intel Xeon with AVX-512 missed two configs by 1.4e-6 relative (tolerance 1e-6) before it
had variants. A CPU with variants (CI's) gets no slack."""


def cpu_tag() -> str:
    """This CPU as its floating-point results depend on it: the vendor (MKL picks its kernels by it) and torch's
    vector instruction set, e.g. ``AuthenticAMD-AVX2``."""
    import torch
    vendor = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            vendor = next((line.split(":", 1)[1].strip() for line in f if line.startswith("vendor_id")), vendor)
    except OSError:
        pass
    return f"{vendor}-{torch.backends.cpu.get_cpu_capability()}"


def same(a, b, rel: float) -> bool:
    """Equal values; floats to ``rel`` relative (NaN equals NaN)."""
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)
    return a == b


def differences(expected: list[dict], evaluated: dict[int, dict], rel: float) -> list[str]:
    """What differs between a fixture's rows and the run's evaluated rows (empty: they match)."""
    if len(expected) != 2 or sorted(evaluated) != [w["round"] for w in expected]:
        return [f"rounds {sorted(evaluated)} vs the fixture's {[w['round'] for w in expected]}"]
    out = []
    for want in expected:
        row = evaluated[want["round"]]
        missing = set(want) - set(row)
        if missing:
            out.append(f"keys lost: {sorted(missing)}")
        changed = {k: (want[k], row[k]) for k in want if k in row and k not in VOLATILE
                   and not same(want[k], row[k], rel)}
        if changed:
            out.append(f"round {want['round']}: {changed}")
    return out


def fixture_differences(config: str, evaluated: dict[int, dict], rel: float) -> dict[str, list[str]]:
    """The run's :func:`differences` from each of ``config``'s fixtures in :func:`fixture_variants` order, up to
    the first one it matches (whose list is empty), by path under the fixtures folder."""
    tried: dict[str, list[str]] = {}
    for path in fixture_variants(config):
        tried[path.relative_to(FIXTURES).as_posix()] = found = differences(read_rows(path), evaluated, rel)
        if not found:
            break
    return tried


def tolerance(cfg) -> float:
    """Relative float tolerance of a fixture comparison: 1e-4 where a quantized link (``compress.*``) can turn a
    last-bit difference into a neighbouring level, else 1e-6."""
    quantized = any(link.name != "none" for link in (cfg.compress.uplink, cfg.compress.downlink))
    return 1e-4 if quantized else 1e-6


def read_rows(path: Path) -> list[dict]:
    """The rows of a ``metrics.jsonl`` file (a run's or a fixture)."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def evaluated_rows(rows: list[dict], metrics: list[str]) -> dict[int, dict]:
    """The rows of a run's ``metrics.jsonl`` that carry its evaluation ``metrics``, by round (what fixtures hold)."""
    return {r["round"]: r for r in rows if all(m in r for m in metrics)}
