"""``engine.device`` and ``engine.dtype``: refusals, ``auto``, the run's tensors on its device, checkpoints that
move between devices, and bfloat16 local training."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trustfl.cli import main
from trustfl.config.build import build_federation
from trustfl.config.load import load_config
from trustfl.engine.federation import EngineState
from trustfl.engine.checkpoint import load_checkpoint, save_checkpoint
from trustfl.errors import ConfigError
from trustfl.experiment import config_hash, run_experiment, with_device
from trustfl.objectives.builtin import CrossEntropy
from trustfl.objectives.precision import Autocast

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.toml"


@pytest.fixture
def no_cuda(monkeypatch):
    """This machine as one without CUDA, whatever it has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


# ---------------------------------------------------------------- refusals

@pytest.mark.parametrize("value", ["tpu", "gpu", "cuda:", "cuda:-1", "cuda:01", "CPU", ""])
def test_unknown_device_names_the_key(small_config, value):
    with pytest.raises(ConfigError, match=r"`engine\.device`.*\"auto\""):
        small_config(engine__device=value)


@pytest.mark.parametrize("value", ["cuda", "cuda:0", "cuda:1"])
def test_cuda_without_a_cuda_device_is_refused_not_replaced(small_config, no_cuda, value):
    with pytest.raises(ConfigError, match=r"`engine\.device`.*no CUDA device is present"):
        build_federation(small_config(engine__device=value), quiet=True)


def test_cuda_index_out_of_range_is_refused(small_config, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.raises(ConfigError, match=r"`engine\.device` is 'cuda:3'.*no CUDA device 3.*it has 1"):
        build_federation(small_config(engine__device="cuda:3"), quiet=True)


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("args", [["--device", "cuda"], ["--device", "tpu"], ["--set", 'engine.device="cuda:0"']])
def test_cli_refuses_an_absent_or_unknown_device_in_one_line(tmp_path, capsys, no_cuda, command, args):
    out = ["--out", str(tmp_path / "run"), "--quiet"] if command == "run" else []
    assert main([command, str(QUICKSTART), *args, *out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trustfl: error: `engine.device`"), err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # refused before anything ran


def test_cli_device_wins_over_set(capsys, no_cuda):
    assert main(["validate", str(QUICKSTART), "--set", 'engine.device="cuda"', "--device", "cpu"]) == 0
    assert "valid" in capsys.readouterr().out


# ---------------------------------------------------------------- auto, and where the run's tensors live

def test_auto_on_a_machine_without_cuda_runs_on_the_cpu_and_says_so(small_config, tmp_path, capsys, no_cuda):
    result = run_experiment(small_config(rounds=1, engine__device="auto"), tmp_path / "run", progress=True,
                            plots=False)
    assert result.params.device.type == "cpu"
    info = json.loads((tmp_path / "run" / "run_info.json").read_text())
    assert info["device"] == "cpu"
    notices = [line for line in capsys.readouterr().err.splitlines() if "engine.device" in line]
    assert notices == ['NOTICE: `engine.device` = "auto" chose \'cpu\' (no CUDA device is present).']
    build_federation(small_config(engine__device="auto"), quiet=True)
    assert "engine.device" not in capsys.readouterr().err  # quiet: no notice


def test_built_federation_lives_on_its_device(small_config, device):
    fed = build_federation(small_config(engine__device=device), quiet=True)
    tensors = [fed.initial_params, *fed.train_data.tensors.values(), *fed.test_data.values(),
               *fed.reports.values(), *(p for p in fed.model.parameters())]
    assert {t.device.type for t in tensors} == {device}
    assert fed.info["device"].split(":")[0] == device


# ---------------------------------------------------------------- checkpoints across devices

def _state(device: str) -> EngineState:
    params = torch.arange(6, dtype=torch.float32, device=device)
    return EngineState(round=3, params=params, server_optimizer={"m": params * 2}, client_stages={},
                       aggregator=None, server_stages={}, clients={4: {"c": params[:2].clone()}},
                       clock={"clock": {"last_contact": torch.zeros(3, dtype=torch.float64)}})


@pytest.mark.parametrize("saved_on", ["cpu", "cuda"])
def test_checkpoint_loads_on_the_resuming_device(tmp_path, device, saved_on):
    if saved_on == "cuda" and not torch.cuda.is_available():
        pytest.skip("saving on CUDA needs a CUDA device")
    save_checkpoint(tmp_path, _state(saved_on), "h")
    state = load_checkpoint(tmp_path, "h", map_location=device)
    assert state.params.device.type == device and state.server_optimizer["m"].device.type == device
    assert state.clients[4]["c"].device.type == device
    assert state.clock["clock"]["last_contact"].device.type == "cpu"  # the virtual clock is host-side
    assert torch.equal(state.params.cpu(), torch.arange(6, dtype=torch.float32))


def test_resume_with_another_device_setting_continues_the_run(small_config, tmp_path, device):
    cfg = small_config(rounds=4, engine={"checkpoint_every": 1, "device": "cpu"})
    full = run_experiment(cfg, tmp_path / "full", progress=False, plots=False)
    run_experiment(cfg, tmp_path / "part", progress=False, plots=False, stop_after=2)
    resumed = run_experiment(None, resume=tmp_path / "part", progress=False, plots=False, device=device)
    assert resumed.params.device.type == device and resumed.summary["rounds"] == 4
    if device == "cpu":
        assert torch.equal(full.params, resumed.params)
    else:  # two rounds on another device's kernels and noise streams: close, not bitwise
        assert torch.allclose(full.params, resumed.params.cpu(), atol=0.05)


def test_resume_refuses_an_unknown_device(small_config, tmp_path):
    run_experiment(small_config(rounds=2, engine={"checkpoint_every": 1}), tmp_path / "part", progress=False,
                   plots=False, stop_after=1)
    with pytest.raises(ConfigError, match=r"`engine\.device`"):
        run_experiment(None, resume=tmp_path / "part", progress=False, device="tpu")


def test_config_hash_ignores_the_device_but_not_a_non_default_dtype(small_config):
    cfg = small_config()
    assert config_hash(with_device(cfg, "cuda:1")) == config_hash(cfg)
    assert config_hash(small_config(engine__dtype="bfloat16")) != config_hash(cfg)


# ---------------------------------------------------------------- bfloat16 local training

def test_autocast_objective_computes_the_forward_in_bfloat16_and_returns_float32(device):
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 3).to(device)
    params = {k: v.detach().requires_grad_() for k, v in model.named_parameters()}
    batch = {"x": torch.randn(8, 64, device=device), "y": torch.randint(0, 3, (8,), device=device)}
    plain, mixed = CrossEntropy(), Autocast(CrossEntropy(), torch.bfloat16)
    out32, out16 = plain.forward(model, params, batch), mixed.forward(model, params, batch)
    assert out16.dtype == torch.float32 and out16.device == out32.device
    reference = torch.nn.functional.linear(*(t.bfloat16() for t in (batch["x"], params["weight"], params["bias"])))
    reference = reference.float()
    assert torch.equal(out16, reference) and not torch.equal(out16, out32)
    assert torch.allclose(out16, out32, atol=0.05)
    loss = mixed.losses(out16, batch).sum()
    grads = torch.autograd.grad(loss, list(params.values()))
    assert all(g.dtype == torch.float32 for g in grads)  # the parameters' gradients stay float32
    assert (mixed.task, mixed.input_key, mixed.batch_coupled) == (plain.task, plain.input_key, plain.batch_coupled)


def test_bfloat16_quickstart_trains_and_stays_close_to_float32(tmp_path, one_torch_thread):
    over = ["rounds=5", "engine.checkpoint_every=0"]
    f32 = run_experiment(load_config(QUICKSTART, over), tmp_path / "f32", progress=False, plots=False)
    bf16 = run_experiment(load_config(QUICKSTART, [*over, 'engine.dtype="bfloat16"']), tmp_path / "bf16",
                          progress=False, plots=False)
    assert bf16.params.dtype == torch.float32  # the server model stays float32
    assert bf16.summary["final_accuracy"] > 0.6  # 10 classes: chance is 0.1
    assert not torch.equal(bf16.params, f32.params)
    assert float((bf16.params - f32.params).norm() / f32.params.norm()) < 0.05
    assert abs(bf16.summary["final_accuracy"] - f32.summary["final_accuracy"]) < 0.05
    assert json.loads((tmp_path / "bf16" / "run_info.json").read_text())["dtype"] == "bfloat16"


def test_the_vertical_engine_refuses_a_cuda_device_naming_the_key(monkeypatch):
    """The vertical engine's parties are not device-aware: a CUDA device is refused, never half-used."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    cfg = load_config("configs/dpzv/breast_cancer_dpzv.toml", ["engine.device=\"cuda\""])
    with pytest.raises(ConfigError, match="`engine.device`: the vertical engine runs on the CPU only"):
        build_federation(cfg, quiet=True)
