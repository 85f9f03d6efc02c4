"""The round engine: executors agree, resume equals uninterrupted, bytes, determinism, rejection."""
import json
import math

import pytest
import torch

from trustfl.experiment import run_experiment
from tests.engine.rounds import train
from trustfl.engine.local import TrainData
from trustfl.engine.sync import run_round




@pytest.mark.parametrize("dp, rounds", [("off", 5), ("per_example", 2), ("batch_clip", 2)])
def test_vectorized_equals_sequential(small_config, dp, rounds):
    extra = {} if dp == "off" else {"client__dp": {"mode": dp, "clip": 1.0, "noise_multiplier": 0.8}}
    _, vec, _ = train(small_config(engine__executor="vectorized", **extra), rounds)
    _, seq, _ = train(small_config(engine__executor="sequential", **extra), rounds)
    assert float((vec.params - seq.params).abs().max()) <= 1e-5


@pytest.mark.parametrize("partition", ["iid", "dirichlet"])
def test_plain_sgd_steps_of_an_mlp_cohort_are_fused_and_agree_with_the_unfused_chain(small_config, monkeypatch,
                                                                                     partition):
    """Plain local SGD on an MLP: every step runs fused (linear_stack.FusedSGD), each round's first included (it
    copies the clients' starts into the fused layout), also the steps some clients sit out (unequal data sizes);
    the model agrees with the unfused chain and with the sequential executor to float rounding."""
    from trustfl.client.gradients import PlainGradient
    from trustfl.client.linear_stack import FusedSGD
    from trustfl.client.transforms import LocalChain

    part = {"name": "iid"} if partition == "iid" else {"name": "dirichlet", "alpha": 0.5}
    cfg = dict(client__momentum=0.0, client__weight_decay=0.0, client__batch_size=8, rounds=3, data__partition=part)
    calls = {"fused": 0, "unfused": 0, "steps": 0}
    fused, compute, gather = FusedSGD.step, PlainGradient.compute, TrainData.gather

    def count(kind, f):
        def counted(*a, **k):
            calls[kind] += 1
            return f(*a, **k)
        return counted

    monkeypatch.setattr(FusedSGD, "step", count("fused", fused))
    monkeypatch.setattr(PlainGradient, "compute", count("unfused", compute))
    monkeypatch.setattr(TrainData, "gather", count("steps", gather))  # one gather per executor step
    fed, vec, hist = train(small_config(**cfg), 3)
    steps = {-(-n // 8) for n in fed.client_rows.sizes()}
    assert (len(steps) == 1) == (partition == "iid")
    assert calls["unfused"] == 0 and calls["fused"] == calls["steps"] >= 3 * min(steps), calls
    monkeypatch.setattr(LocalChain, "fused_sgd", lambda *a, **k: None)
    _, unfused, hist_unfused = train(small_config(**cfg), 3)
    assert calls["unfused"] > 0
    _, seq, _ = train(small_config(engine__executor="sequential", **cfg), 3)
    assert not torch.equal(vec.params, unfused.params)  # rounded differently, ...
    torch.testing.assert_close(vec.params, unfused.params, rtol=1e-5, atol=1e-6)  # ... the same to rounding
    torch.testing.assert_close(vec.params, seq.params, rtol=1e-5, atol=1e-5)
    for a, b in zip(hist, hist_unfused):
        assert math.isclose(a["train_loss"], b["train_loss"], rel_tol=1e-5)


@pytest.mark.parametrize("executor, chunk", [("vectorized", 0), ("vectorized", 2), ("sequential", 0)])
@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_local_training_never_writes_into_the_round_s_starting_state(small_config, executor, chunk, momentum):
    """Clients start from views of the received model (no copy until their first update): the state a round
    started from, its server model included, is unchanged after the round."""
    cfg = small_config(engine__executor=executor, engine__max_clients_per_batch=chunk, client__momentum=momentum,
                       client__weight_decay=0.0)
    fed, state, _ = train(cfg, 1)
    before = state.params.clone()
    after, _ = run_round(fed, state)
    assert torch.equal(state.params, before)
    assert not torch.equal(after.params, before)


def test_vectorized_handles_unequal_sizes_and_batch_sizes(small_config):
    # client.batch_size back at its default: client.batch_sizes replaces it (one beside the other is refused)
    sizes = {"client__batch_sizes": [8, 16, 32], "client__batch_size": 32}
    cfg = small_config(data__partition={"name": "quantity_skew", "alpha": 0.5}, cohort={"sampler": "all"}, **sizes)
    _, vec, _ = train(cfg, 2)
    _, seq, _ = train(small_config(data__partition={"name": "quantity_skew", "alpha": 0.5}, cohort={"sampler": "all"},
                                   engine__executor="sequential", **sizes), 2)
    assert float((vec.params - seq.params).abs().max()) <= 1e-5


def test_same_seed_gives_identical_model_and_other_seed_differs(small_config):
    _, a, ha = train(small_config(), 3)
    _, b, hb = train(small_config(), 3)
    _, c, _ = train(small_config(seed=4), 3)
    assert torch.equal(a.params, b.params)
    assert [m["train_loss"] for m in ha] == [m["train_loss"] for m in hb]
    assert not torch.equal(a.params, c.params)


def test_bytes_are_parameters_times_four_times_clients(small_config):
    fed, state, history = train(small_config(), 2)
    per_client = fed.layout.numel * 4
    for m in history:
        assert m["bytes_up"] == per_client * 5
        assert m["bytes_down"] == per_client * 5
    assert state.bytes_up_total == per_client * 5 * 2


def test_resume_equals_uninterrupted(small_config, tmp_path, device):
    cfg = small_config(rounds=6, engine={"checkpoint_every": 2, "device": device})
    full = run_experiment(cfg, tmp_path / "full", progress=False)
    part = run_experiment(cfg, tmp_path / "part", progress=False, stop_after=3)
    assert part.summary["rounds"] == 3
    resumed = run_experiment(None, resume=tmp_path / "part", progress=False)
    assert torch.equal(full.params, resumed.params)
    rows = [json.loads(x) for x in (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == list(range(1, 7))
    assert [r["accuracy"] for r in rows] == [r["accuracy"] for r in full.rows]


def test_run_directory_contents(small_config, tmp_path, device):
    result = run_experiment(small_config(rounds=2, engine__device=device), tmp_path / "run", progress=False)
    assert result.params.device.type == device
    for name in ("config.toml", "metrics.jsonl", "summary.json", "accuracy.png", "loss.png", "run_info.json"):
        assert (tmp_path / "run" / name).is_file(), name
    row = result.rows[-1]
    for key in ("round", "accuracy", "loss", "bytes_up", "bytes_down", "wall_time_s"):
        assert key in row
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    for key in ("final_accuracy", "best_accuracy", "rounds", "wall_time_s", "seed"):
        assert key in summary
    info = json.loads((tmp_path / "run" / "run_info.json").read_text())
    # digits train split: 1797 images − round(0.2 · 1797) = 359 held out = 1438, all of them given to the 8 clients
    assert info["partition"]["num_samples"] == 1438 and info["partition"]["num_clients"] == 8
    assert sum(info["partition"]["sizes"]) == 1438 and len(info["partition"]["sizes"]) == 8
    assert info["device"].split(":")[0] == device and info["dtype"] == "float32"


@pytest.mark.parametrize("attack", ["nan", "inf"])
def test_nonfinite_messages_are_rejected_and_training_goes_on(small_config, attack):
    cfg = small_config(rounds=4, cohort={"sampler": "all"}, attack={"name": attack, "num_byzantine": 2})
    fed, state, history = train(cfg, 4)
    assert all(m["rejected"] == 2 for m in history)
    assert bool(torch.isfinite(state.params).all())
    assert history[-1]["train_loss"] < history[0]["train_loss"]


@pytest.mark.parametrize("senders", [6, 2])
def test_a_round_whose_screening_leaves_the_rule_too_few_messages_is_skipped_not_stopped(small_config, senders):
    """6 NaN senders of 8 leave 2 messages, under cwtm's 2f + 1 = 5 for f = 2: each round keeps the model and is
    marked ``skipped`` (the run used to stop in round 1 with the rule's error). 2 senders leave 6: aggregated."""
    cfg = small_config(rounds=3, cohort={"sampler": "all"}, aggregator={"name": "cwtm", "f": 2},
                       attack={"name": "nan", "num_byzantine": senders})
    fed, state, history = train(cfg, 3)
    assert [m["rejected"] for m in history] == [senders] * 3 and state.round == 3
    if senders == 6:
        assert all(m["skipped"] == 1 for m in history)
        assert torch.equal(state.params, fed.initial_params)
    else:
        assert not any("skipped" in m for m in history)
        assert bool(torch.isfinite(state.params).all()) and not torch.equal(state.params, fed.initial_params)


def test_fedavg_end_to_end_on_digits(small_config, tmp_path):
    cfg = small_config(rounds=15, data__num_clients=10, cohort={"sampler": "all"},
                       client={"epochs": 2, "batch_size": 16, "lr": 0.1, "momentum": 0.5})
    result = run_experiment(cfg, tmp_path / "fedavg", progress=False)
    assert result.summary["final_accuracy"] >= 0.9
    assert math.isfinite(result.summary["final_loss"])


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_round_from_params_on_the_meta_device_is_refused_in_one_line(small_config, kind):
    """Torch said only "Tensor on device meta is not on the expected device cpu!" (a RuntimeError)."""
    import dataclasses

    from trustfl.config.build import build_federation, resolve_engine
    from trustfl.errors import MessageError

    cfg = small_config(rounds=1, engine__kind=kind)
    fed = build_federation(cfg, quiet=True)
    engine = resolve_engine(cfg, fed.info["engine"])
    state = engine.initial_state(fed)
    with pytest.raises(MessageError, match=r"^round 1: the engine state's `params` are on the meta device \(a shape "
                                           r"without values\), so no client can train from them; start from"):
        engine.run_round(fed, dataclasses.replace(state, params=state.params.to("meta")))
