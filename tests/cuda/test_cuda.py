"""Runs on a CUDA device (``engine.device = "cuda"``): end to end, DP-SGD, CafCor's correlated noise, robust
aggregators against their CPU results, a checkpoint written on the GPU resumed on the CPU, and two rounds of every
shipped config (every algorithm and engine; the vertical one refuses the device by name).

Each check is a ``check_*(device)`` function the tests call with ``"cuda"``; the same functions run on the CPU in
``tests/engine/test_device.py``'s spirit (``python -c "from tests.cuda.test_cuda import *; check_...('cpu')"``).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import trustfl
from tests.engine.shipped_configs import CONFIGS, overrides
from trustfl.config.load import config_from_dict, load_config
from trustfl.errors import ConfigError
from trustfl.experiment import run_experiment
from trustfl.privacy.correlated import correlated_noise
from trustfl.types import ParamLayout, RoundContext

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device on this machine (torch.cuda.is_available() is False)")

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.toml"


def _small(device: str, **tables) -> dict:
    data = {"name": "cuda", "seed": 3, "rounds": 3,
            "data": {"dataset": "digits", "num_clients": 8, "partition": {"name": "dirichlet", "alpha": 1.0}},
            "model": {"name": "mlp", "hidden": [32]}, "cohort": {"sampler": "uniform", "size": 5},
            "client": {"epochs": 1, "batch_size": 16, "lr": 0.1},
            "engine": {"checkpoint_every": 0, "device": device}}
    data.update(tables)
    return data


def check_quickstart(device: str, tmp_path: Path) -> None:
    cfg = load_config(QUICKSTART, ["rounds=3", "engine.checkpoint_every=0", f'engine.device="{device}"'])
    result = run_experiment(cfg, tmp_path / "quickstart", progress=False, plots=False)
    assert result.params.device.type == device
    assert result.summary["final_accuracy"] > 0.6  # 10 classes: chance is 0.1


def check_dp_sgd(device: str, tmp_path: Path) -> None:
    """Per-example DP-SGD with both gradient methods: same noise streams, clipped sums equal to rounding."""
    params = {}
    for method in ("ghost", "vmap"):
        dp = {"mode": "per_example", "clip": 1.0, "noise_multiplier": 0.8, "method": method}
        data = _small(device)
        data["client"] = {**data["client"], "dp": dp}
        result = run_experiment(config_from_dict(data), tmp_path / method, progress=False, plots=False)
        assert result.params.device.type == device and bool(torch.isfinite(result.params).all())
        params[method] = result.params
    assert torch.allclose(params["ghost"], params["vmap"], atol=1e-4)


def check_cafcor(device: str, tmp_path: Path) -> None:
    """CafCor end to end (exact pairwise noise, worker momentum, ALIE, CAF) on ``device``."""
    data = _small(device, algorithm="cafcor", rounds=2, cohort={"sampler": "all"},
                  attack={"name": "alie", "num_byzantine": 2},
                  recipe={"threat_model": "secldp", "epsilon": 30.0, "delta": 1e-4, "noise_path": "exact"})
    data["model"] = {"name": "logreg"}
    data["data"] = {"dataset": "digits", "num_clients": 10}
    data["client"] = {"batch_size": 32, "lr": 0.5, "dp": {"clip": 1.0}}
    result = run_experiment(config_from_dict(data), tmp_path / "cafcor", progress=False, plots=False)
    assert result.params.device.type == device and bool(torch.isfinite(result.params).all())


def check_correlated_noise(device: str) -> None:
    """The pair terms cancel in the sum on ``device``, and the exact path's noise equals the CPU's (it is drawn
    on the CPU, as the two ends of a pair must agree)."""
    n, d = 6, 1000
    ctx = RoundContext(round=1, seed=5, client_ids=tuple(range(n)), num_clients=n)
    for path in ("exact", "fast"):
        stage = correlated_noise(0.7, path=path)
        out = stage.apply(torch.zeros(n, d, device=device), stage.init(ParamLayout(("x",), ((d,),))), ctx).x
        assert out.device.type == device
        assert float(out.sum(0).abs().max()) < 1e-3 and float(out.std()) > 1.0
        if path == "exact":
            cpu = stage.apply(torch.zeros(n, d), None, ctx).x
            assert torch.equal(out.cpu(), cpu)


ROBUST = [("krum", {"f": 2}), ("caf", {"f": 2}), ("caf", {"f": 2, "method": "power"}), ("geometric_median", {}),
          ("cwtm", {"f": 2}), ("mda", {"f": 2}), ("centered_clipping", {"tau": 3.0})]


def check_robust_aggregator(device: str, name: str, params: dict) -> None:
    """The rule on ``device`` returns a tensor there, equal to its CPU result to float32 tolerance."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(11, 300, generator=gen)
    x[-2:] += 50.0  # two outliers
    ctx = RoundContext(round=0, seed=1, client_ids=tuple(range(11)), num_clients=11, num_byzantine=2)
    agg = trustfl.build("aggregator", name, **params)
    state = agg.init(ParamLayout(("x",), ((300,),)))
    on_device = agg.apply(x.to(device), state, ctx).x
    on_cpu = agg.apply(x, state, ctx).x
    assert on_device.device.type == device
    assert torch.allclose(on_device.cpu(), on_cpu, rtol=1e-4, atol=1e-5)


def check_checkpoint_moves_to_cpu(device: str, tmp_path: Path) -> None:
    """A run checkpointed on ``device`` resumes on the CPU (``--device cpu``) and finishes."""
    data = _small(device, rounds=4)
    data["engine"] = {**data["engine"], "checkpoint_every": 1}
    cfg = config_from_dict(data)
    part = run_experiment(cfg, tmp_path / "part", progress=False, plots=False, stop_after=2)
    assert part.params.device.type == device
    resumed = run_experiment(None, resume=tmp_path / "part", progress=False, plots=False, device="cpu")
    assert resumed.params.device.type == "cpu" and resumed.summary["rounds"] == 4
    full = run_experiment(cfg, tmp_path / "full", progress=False, plots=False)
    assert torch.allclose(full.params.cpu(), resumed.params, atol=0.05)  # other kernels, other noise: close


def check_shipped_config(device: str, config: str, tmp_path: Path, data_dir: Path) -> None:
    """A shipped config's 2-round run (the fixture test's overrides, fake IDX images) on ``device``: parameters
    there and finite, one row per round, every metric a finite number. The vertical engine refuses a non-CPU device
    by name instead."""
    cfg = load_config(config, overrides(config, data_dir) + [f'engine.device="{device}"'])
    if cfg.engine.kind == "vertical" and device != "cpu":
        with pytest.raises(ConfigError, match="engine.device"):
            run_experiment(cfg, tmp_path / "run", progress=False, plots=False)
        return
    result = run_experiment(cfg, tmp_path / "run", progress=False, plots=False)
    assert result.params.device.type == device and bool(torch.isfinite(result.params).all()), config
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2], config
    bad = {k: v for r in rows for k, v in r.items() if isinstance(v, float) and not math.isfinite(v)}
    assert not bad, f"{config}: non-finite metrics {bad}"


def test_quickstart_on_cuda(tmp_path):
    check_quickstart("cuda", tmp_path)


def test_dp_sgd_ghost_and_vmap_on_cuda(tmp_path):
    check_dp_sgd("cuda", tmp_path)


def test_cafcor_on_cuda(tmp_path):
    check_cafcor("cuda", tmp_path)


def test_correlated_noise_on_cuda():
    check_correlated_noise("cuda")


@pytest.mark.parametrize("name,params", ROBUST, ids=[f"{n}-{i}" for i, (n, _) in enumerate(ROBUST)])
def test_robust_aggregator_on_cuda_equals_cpu(name, params):
    check_robust_aggregator("cuda", name, params)


def test_checkpoint_written_on_cuda_resumes_on_cpu(tmp_path):
    check_checkpoint_moves_to_cpu("cuda", tmp_path)


@pytest.mark.parametrize("config", CONFIGS)
def test_shipped_config_runs_on_cuda(config, tmp_path, fake_idx):
    check_shipped_config("cuda", config, tmp_path, fake_idx)
