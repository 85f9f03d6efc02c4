"""The asynchronous engine on a virtual clock: QuAFL's invariant, its schedule, compressed links, FedAvg/FedBuff/
FedAsync/FedNova schedules, resume, bad input, and every existing stage under the async schedule."""
import math

import pytest
import torch

from trustfl.config.build import build_federation, resolve_engine
from trustfl.config.load import config_from_dict
from trustfl.core.registry import build
from trustfl.engine.asynchronous import BASE
from trustfl.errors import CheckpointError, ConfigError
from trustfl.experiment import run_experiment

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _cfg(**over):
    data = {"name": "async", "seed": 1, "rounds": 4, "algorithm": "quafl",
            "data": {"dataset": "digits", "num_clients": 8, "partition": {"name": "dirichlet", "alpha": 1.0}},
            "model": {"name": "mlp", "hidden": [16]}, "cohort": {"sampler": "uniform", "size": 3},
            "client": {"steps": 4, "batch_size": 16, "lr": 0.1},
            "engine": {"kind": "async", "checkpoint_every": 0, "interaction_time": 3.0,
                       "speed": {"name": "exponential_groups", "slow_share": 0.25}}}
    for key, value in over.items():
        node = data
        *parents, last = key.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    if data["engine"]["kind"] == "sync":  # the clock's settings would be refused as unused
        for key in ("speed", "interaction_time"):
            data["engine"].pop(key, None)
    return config_from_dict(data)


def _engine(cfg):
    fed = build_federation(cfg, quiet=True)
    engine = resolve_engine(cfg)
    return fed, engine, engine.initial_state(fed)


class _Recorder:
    """Wraps the federation's executor to observe what the clients computed (instrumentation, not a model)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def run(self, job, plans, cohort, start=None):
        out = self.inner.run(job, plans, cohort, start)
        self.calls.append((list(plans), start, out))
        return out


def _base(fed, state, cid):
    entry = state.clients.get(cid, {})
    return entry[BASE] if BASE in entry else fed.initial_params


def test_an_async_round_whose_screening_leaves_the_rule_too_few_messages_is_skipped():
    """The async engine shares the sync engine's server half: 7 NaN senders of 8 leave fewer than cwtm's 3 (f = 1)
    in every polled group of 4 that holds one, and such rounds keep the server model instead of stopping the run."""
    fed, engine, state = _engine(_cfg(cohort__size=4, aggregator={"name": "cwtm", "f": 1},
                                      attack={"name": "nan", "num_byzantine": 7}))
    start = state.params.clone()
    rows = []
    for _ in range(3):
        state, metrics = engine.run_round(fed, state)
        rows.append(metrics)
    assert any(m.get("skipped") == 1 for m in rows)
    assert all(m.get("skipped") == 1 or m["rejected"] == m["cohort_size"] for m in rows)
    assert torch.equal(state.params, start) and state.round == 3


# ---------------------------------------------------------------- QuAFL

@pytest.mark.parametrize("compress", [None, "identity"])
def test_quafl_round_preserves_the_sum_of_server_and_client_models(compress):
    """QuAFL Alg. 1 (Sec. 2.2): with identity quantization, X_{t+1} + Σ_{i∈S} X^i_new = X_t + Σ_{i∈S} Y^i."""
    over = {} if compress is None else {"compress": {"uplink": compress, "downlink": compress}}
    fed, engine, state = _engine(_cfg(**over))
    fed.executor = rec = _Recorder(fed.executor)
    steps_total = 0
    for _ in range(4):
        before = state
        state, metrics = engine.run_round(fed, state)
        steps_total += metrics["local_steps"]
        plans, start, out = rec.calls[-1]
        ids = [p.client_id for p in plans]
        y = torch.stack([_base(fed, before, c) for c in ids]) + out.updates
        lhs = state.params + sum(state.clients[c][BASE] for c in ids)
        rhs = before.params + y.sum(0)
        assert torch.allclose(lhs, rhs, atol=1e-6, rtol=0), float((lhs - rhs).abs().max())
        assert sum(out.num_steps) == metrics["local_steps"]
    assert state.round == 4 and metrics["local_steps_total"] == steps_total > 0


def test_quafl_reproduces_a_hand_worked_schedule():
    """3 clients, all polled every step (s = n), K = 2, sit = 4: steps of 1, 3 and (0.5, 2.5, …) time units.

    step 1 (T=0):  nobody has finished a step                                  → 0, 0, 0
    step 2 (T=4):  c0 at 1, 2, 3 (cap K=2); c1 at 3 (6 ≥ 4); c2 at 0.5, 3.0    → 2, 1, 2
    step 3 (T=8):  from t=4: c0 5, 6 (cap); c1 7; c2 4.5, 7.0                    → 2, 1, 2
    """
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.csv"
        trace.write_text("client,duration\n0,1\n1,3\n2,0.5\n2,2.5\n")
        cfg = _cfg(data__num_clients=3, data__partition={"name": "iid"}, cohort__size=3, client__steps=2,
                   engine__interaction_time=4.0, engine__speed={"name": "trace", "path": str(trace)})
        fed, engine, state = _engine(cfg)
        fed.executor = rec = _Recorder(fed.executor)
        seen = []
        for _ in range(3):
            state, m = engine.run_round(fed, state)
            plans, _, out = rec.calls[-1]
            seen.append(([p.client_id for p in plans], out.num_steps, m["sim_time"], m["zero_step_clients"]))
    assert seen == [([0, 1, 2], [0, 0, 0], 4.0, 3), ([0, 1, 2], [2, 1, 2], 8.0, 0), ([0, 1, 2], [2, 1, 2], 12.0, 0)]


def test_zero_step_clients_send_their_own_model_and_only_mix():
    """A client with no completed step reports Y^i = X^i; its new model is the mix of Q(X_t) and X^i."""
    fed, engine, state = _engine(_cfg(engine__speed={"name": "deterministic", "duration": 1e6}))
    state, m = engine.run_round(fed, state)
    assert m["local_steps"] == 0 and m["zero_step_clients"] == 3
    assert torch.equal(state.params, fed.initial_params)  # every Y^i = X^i = X_0


def test_lattice_links_count_the_encoded_bits_and_shorten_the_interaction():
    comp = {"name": "lattice", "bits": 12, "step": 1e-3}
    fed, engine, state = _engine(_cfg(compress={"uplink": comp, "downlink": comp}))
    state, m = engine.run_round(fed, state)
    encoded = build("compressor", "lattice", bits=12, step=1e-3).encode(
        torch.zeros(1, fed.layout.numel), torch.Generator().manual_seed(0), 0)
    per_message = 8 * encoded.nbytes()
    assert m["bits_up"] == 3 * per_message and m["bits_down"] == 3 * per_message
    assert per_message < 32 * fed.layout.numel * 0.5
    assert m["sim_time"] == pytest.approx(3.0 * (12 + 12) / 64)  # sit(b) = sit · b / 32
    assert m["decode_failures"] == 0


def test_a_too_coarse_lattice_is_reported_not_silently_wrong():
    comp = {"name": "lattice", "bits": 2, "step": 1e-4, "mode": "code"}
    fed, engine, state = _engine(_cfg(compress={"uplink": comp, "downlink": comp}, client__lr=0.5))
    failures = 0
    for _ in range(3):
        state, m = engine.run_round(fed, state)
        failures += m["decode_failures"]
    assert failures > 0


def test_quafl_options_change_the_dynamics():
    base = _engine(_cfg())
    outs = {}
    for name, rec in {"paper": {}, "no_client_avg": {"client_averaging": False},
                      "no_server_avg": {"server_averaging": False}, "code_lr": {"lr_scaling": "code"},
                      "weighted": {"speed_weights": True}}.items():
        fed, engine, state = _engine(_cfg(recipe=rec))
        for _ in range(3):
            state, _ = engine.run_round(fed, state)
        outs[name] = state.params
    for name, params in outs.items():
        if name != "paper":
            assert not torch.equal(params, outs["paper"]), name
    del base


# ---------------------------------------------------------------- other schedules

def test_fedavg_in_the_async_engine_equals_the_sync_engine_bitwise():
    common = dict(algorithm="fedavg", client={"epochs": 1, "batch_size": 16, "lr": 0.1, "momentum": 0.5,
                                              "dp": {"mode": "per_example", "clip": 1.0, "noise_multiplier": 1.0}},
                  aggregator={"name": "cwtm", "f": 1})
    sync_cfg = _cfg(engine__kind="sync", **common)
    async_cfg = _cfg(engine__speed={"name": "deterministic", "duration": 0.5}, engine__interaction_time=0.0,
                     **common)
    fed_s, eng_s, st_s = _engine(sync_cfg)
    fed_a, eng_a, st_a = _engine(async_cfg)
    for _ in range(3):
        st_s, m_s = eng_s.run_round(fed_s, st_s)
        st_a, m_a = eng_a.run_round(fed_a, st_a)
        assert m_s["train_loss"] == m_a["train_loss"]
    assert torch.equal(st_s.params, st_a.params)
    assert m_a["sim_time"] > 0 and m_a["bits_up_total"] == 8 * st_s.bytes_up_total


def test_synchronous_round_lasts_until_the_slowest_client():
    fed, engine, state = _engine(_cfg(algorithm="fedavg", client={"steps": 3, "batch_size": 16, "lr": 0.1},
                                      engine__speed={"name": "deterministic", "slow_share": 0.5, "fast": 1.0,
                                                     "slow": 5.0}, engine__interaction_time=2.0))
    times = []
    for _ in range(4):
        state, m = engine.run_round(fed, state)
        times.append(m["sim_time"])
    steps = [b - a for a, b in zip([0.0] + times, times)]
    assert set(steps) <= {3 * 1.0 + 2.0, 3 * 5.0 + 2.0} and 17.0 in steps  # ids 0..3 are slow


def test_fednova_normalises_by_the_steps_each_client_completed():
    fed, engine, state = _engine(_cfg(algorithm="fednova", recipe={"deadline": 6.0},
                                      client={"steps": 5, "batch_size": 16, "lr": 0.1},
                                      engine__speed={"name": "deterministic", "slow_share": 0.5, "fast": 1.0,
                                                     "slow": 4.0}, engine__interaction_time=1.0))
    fed.executor = rec = _Recorder(fed.executor)
    state, m = engine.run_round(fed, state)
    plans, _, out = rec.calls[-1]
    want = [1 if p.client_id < 4 else 5 for p in plans]  # slow: one step (≥ 1) by t = 6; fast: 5 steps by t = 5
    assert out.num_steps == want
    assert m["sim_time"] == pytest.approx(max(4.0 if s == 1 else 5.0 for s in want) + 1.0)


def test_fedbuff_takes_the_clients_that_finish_first_and_weights_staleness():
    fed, engine, state = _engine(_cfg(algorithm="fedbuff", engine__speed={"name": "deterministic", "slow_share": 0.5,
                                                                         "fast": 1.0, "slow": 3.0}))
    fed.executor = rec = _Recorder(fed.executor)
    reporters, stale = [], []
    for _ in range(4):
        state, m = engine.run_round(fed, state)
        reporters.append([p.client_id for p in rec.calls[-1][0]])
        stale.append(m["staleness_mean"])
    assert all(c >= 4 for c in reporters[0])  # fast clients (4..7) finish their K = 4 steps first
    assert stale[0] == 0 and max(stale) > 0
    assert all(state.clock["finish"] >= 0)


def test_fedasync_mixes_one_client_per_step():
    fed, engine, state = _engine(_cfg(algorithm="fedasync", cohort__size=1, recipe={"alpha": 0.5, "a": 0.5}))
    start = state.params.clone()
    state, m = engine.run_round(fed, state)
    assert m["cohort_size"] == 1 and not torch.equal(state.params, start)


def test_a_byzantine_client_reporting_alone_sends_nothing_and_is_counted_idle():
    """FedAsync steps on one client's report: a Byzantine one alone has no honest message to craft from. It
    sends nothing (a NaN row was fabricated and counted as a rejected message, bytes and all), the step leaves
    the model as it was, and ``attack_idle`` says why; honest steps move the model."""
    fed, engine, state = _engine(_cfg(algorithm="fedasync", cohort__size=1, rounds=12,
                                      attack={"name": "sign_flip", "num_byzantine": 3}))
    idle = moved = 0
    for _ in range(12):
        before = state.params.clone()
        state, m = engine.run_round(fed, state)
        if m.get("attack_idle"):
            assert m["attack_idle"] == 1 and m["rejected"] == 1 and m["bytes_up"] == 0
            assert torch.equal(state.params, before)
            idle += 1
        else:
            assert m["rejected"] == 0 and m["bytes_up"] > 0 and not torch.equal(state.params, before)
            moved += 1
    assert idle >= 1 and moved >= 1  # 3 of 8 clients Byzantine: seeded, both kinds of step occur


# ---------------------------------------------------------------- resume, composition, bad input

@pytest.mark.parametrize("algorithm,extra", [
    ("quafl", {"compress": {"uplink": {"name": "lattice", "bits": 14, "step": 1e-4},
                            "downlink": {"name": "lattice", "bits": 14, "step": 1e-4}}}),
    ("fedbuff", {"compress": {"uplink": {"name": "qsgd_minmax", "levels": 16}}})])
def test_resume_mid_run_reproduces_the_uninterrupted_run(tmp_path, algorithm, extra):
    cfg = _cfg(algorithm=algorithm, rounds=6, engine__checkpoint_every=1, **extra)
    whole = run_experiment(cfg, tmp_path / "whole", progress=False)
    run_experiment(cfg, tmp_path / "part", progress=False, stop_after=3)
    resumed = run_experiment(None, resume=tmp_path / "part", progress=False)
    assert torch.equal(whole.params, resumed.params)
    assert whole.rows[-1]["sim_time"] == resumed.rows[-1]["sim_time"]
    assert whole.rows[-1]["bits_up_total"] == resumed.rows[-1]["bits_up_total"]


def test_existing_stages_run_under_the_async_schedule():
    """Sample-level DP with its accountant, a robust aggregator and a Byzantine attack, under QuAFL."""
    cfg = _cfg(client={"steps": 3, "batch_size": 16, "lr": 0.1,
                       "dp": {"mode": "per_example", "clip": 1.0, "noise_multiplier": 1.0}},
               aggregator={"name": "cwmed"}, attack={"name": "sign_flip", "num_byzantine": 1},
               cohort__size=4)
    fed, engine, state = _engine(cfg)
    for _ in range(3):
        state, m = engine.run_round(fed, state)
    assert torch.isfinite(state.params).all()
    assert fed.ledger is not None and max(fed.ledger.epsilons().values()) > 0


@pytest.mark.parametrize("over,needle", [
    ({"engine__speed": {"name": "exponential_groups", "slow_mean": -1}}, "engine.speed"),
    ({"engine__speed": {"name": "deterministic", "duration": float("nan")}}, "engine.speed"),
    ({"compress": {"uplink": {"name": "lattice", "bits": 40, "step": 1e-4}}}, "compress.uplink"),
    ({"compress": {"downlink": {"name": "lattice", "bits": 0, "step": 1e-4}}}, "compress.downlink"),
    ({"cohort__size": 9}, "cohort.size"),
    ({"client": {"epochs": 1, "batch_size": 16, "lr": 0.1}}, "client.steps"),
    ({"engine__interaction_time": -1.0}, "engine.interaction_time"),
    # at 1e308 the clock overflowed after a round, and the error named the internal `dt`
    ({"engine__interaction_time": 1e308}, "engine.interaction_time"),
    ({"engine__interaction_time": 1e308, "compress": {"uplink": {"name": "lattice", "bits": 14, "step": 1e-4}}},
     "engine.interaction_time"),
    ({"engine__wait_time": 1e308}, "engine.wait_time"),
    # a keyed downlink outside polling failed in round 1 naming the compressor's internal `key`
    ({"algorithm": "fedbuff", "compress": {"downlink": {"name": "lattice", "bits": 14, "step": 1e-4}}},
     "compress.downlink"),
    ({"algorithm": "fedavg", "compress": {"downlink": {"name": "lattice", "bits": 14, "step": 1e-4}}},
     "compress.downlink"),
    # no time passes in a polling step: the clock stays at 0 and no client ever completes a step
    ({"engine__interaction_time": 0.0}, "engine.interaction_time` and `engine.wait_time` are both 0"),
    ({"recipe": {"decode_key": "mine"}}, "recipe.decode_key"),
    # deadline 0 ran the synchronous schedule's plain FedAvg, bitwise, under the name FedNova
    ({"algorithm": "fednova", "recipe": {"deadline": 0}}, "recipe.deadline"),
    ({"algorithm": "fednova", "recipe": {"deadline": -1.0}}, "recipe.deadline"),
    # FedAsync's α lies in (0, 1]: 1e300 made every message non-finite, 1.5 was accepted
    ({"algorithm": "fedasync", "cohort__size": 1, "recipe": {"alpha": 1e300}}, "recipe.alpha"),
    ({"algorithm": "fedasync", "cohort__size": 1, "recipe": {"alpha": 1.5}}, "recipe.alpha"),
    ({"algorithm": "fedavg", "engine__schedule": {"name": "buffered", "mixing": "fedasync", "alpha": 1.5}},
     "engine.schedule"),
    # named by the recipe's key, not by the schedule's parameter the recipe fills
    ({"algorithm": "fedasync", "cohort__size": 1, "recipe": {"a": -1.0}}, "recipe.a`"),
    ({"algorithm": "fedbuff", "recipe": {"server_lr": 0}}, "recipe.server_lr"),
])
def test_bad_async_input_is_refused_before_training_naming_the_key(over, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        build_federation(_cfg(**over), quiet=True)


QSGD_LINKS = {"uplink": {"name": "qsgd", "levels": 7}, "downlink": {"name": "qsgd_minmax", "levels": 16}}


@pytest.mark.parametrize("over,key", [
    # the code's lr factor makes up for server averaging: without it, the same bits as lr_scaling = "none"
    ({"recipe": {"lr_scaling": "code", "server_averaging": False}}, "recipe.lr_scaling"),
    # only a keyed (lattice) downlink decodes against the client's model
    ({"recipe": {"decode_key": "current"}}, "recipe.decode_key"),
    ({"recipe": {"decode_key": "current"}, "compress": QSGD_LINKS}, "recipe.decode_key"),
    ({"algorithm": "fedavg", "engine__schedule": {"name": "polling", "decode_key": "current"}},
     "engine.schedule.decode_key"),
    # equal speeds: every η_i = H_min/H_i is 1
    ({"recipe": {"speed_weights": True}, "engine__speed": {"name": "deterministic", "duration": 2.0}},
     "recipe.speed_weights"),
    # one client reporting at every step: its staleness is always 0
    ({"algorithm": "fedasync", "cohort__size": 1, "data__num_clients": 1, "recipe": {"a": 2.0}}, "recipe.a"),
    ({"algorithm": "fedavg", "cohort__size": 8, "engine__schedule": {"name": "buffered", "staleness": "none"}},
     "engine.schedule.staleness"),
    # the other mixing's parameters
    ({"algorithm": "fedavg", "engine__schedule": {"name": "buffered", "alpha": 0.3}}, "engine.schedule.alpha"),
    ({"algorithm": "fedavg", "engine__schedule": {"name": "buffered", "mixing": "fedasync", "server_lr": 0.3}},
     "engine.schedule.server_lr"),
])
def test_a_schedule_setting_that_does_nothing_is_refused_naming_its_key(over, key):
    """Each of these ran bitwise the same as without the key (checked on the code before the refusal)."""
    with pytest.raises(ConfigError, match=f"^`{key}` is set but does nothing: .*; remove it\\.$"):
        build_federation(_cfg(**over), quiet=True)


def test_the_same_schedule_settings_are_taken_where_they_act():
    lattice = {"name": "lattice", "bits": 14, "step": 1e-4}
    for over in [{"recipe": {"decode_key": "current"}, "compress": {"uplink": lattice, "downlink": lattice}},
                 {"recipe": {"speed_weights": True}},  # exponential_groups: slow and fast clients
                 {"recipe": {"lr_scaling": "code"}},
                 {"algorithm": "fedasync", "cohort__size": 1, "recipe": {"a": 2.0}},
                 {"algorithm": "fedavg", "engine__schedule": {"name": "buffered", "staleness": "none"}}]:
        build_federation(_cfg(**over), quiet=True)


def test_a_trace_with_a_negative_duration_names_the_file_and_row(tmp_path):
    trace = tmp_path / "speeds.csv"
    trace.write_text("client,duration\n" + "".join(f"{i},1\n" for i in range(8)) + "3,-2\n")
    with pytest.raises(ConfigError, match=r"speeds\.csv.*row 9"):
        build_federation(_cfg(engine__speed={"name": "trace", "path": str(trace)}), quiet=True)


@pytest.mark.parametrize("algorithm", ["quafl", "fedavg", "fedbuff"])
def test_the_largest_simulated_times_keep_the_clock_finite(algorithm):
    """Every time at MAX_TIME = 1e100: the clock's sums stay finite (near 1e308 they overflowed after a round)."""
    big = 1e100
    fed, engine, state = _engine(_cfg(algorithm=algorithm, engine__interaction_time=big, engine__wait_time=big,
                                      engine__speed={"name": "exponential_groups", "fast_mean": big,
                                                     "slow_mean": big}))
    for _ in range(4):
        state, m = engine.run_round(fed, state)
    assert math.isfinite(m["sim_time"]) and m["sim_time"] >= 4 * big


def test_time_limit_ends_the_run(tmp_path):
    cfg = _cfg(rounds=100, engine__time_limit=10.0)
    result = run_experiment(cfg, tmp_path / "run", progress=False)
    # Polling steps without compression last interaction_time = 3.0 each (sit · 32/32): the first step to reach
    # t >= 10 is step ceil(10 / 3) = 4, at t = 12.
    assert result.rows[-1]["round"] == math.ceil(10.0 / 3.0) == 4 and result.rows[-1]["sim_time"] == 12.0
    assert result.summary["rounds"] == 4 and [r["round"] for r in result.rows] == [1, 2, 3, 4]


# ---------------------------------------------------------------- compressors in the synchronous engine

def test_fedavg_with_qsgd_in_the_sync_engine_counts_the_compressed_bits():
    over = dict(algorithm="fedavg", engine__kind="sync", client={"epochs": 1, "batch_size": 16, "lr": 0.1})
    fed, engine, state = _engine(_cfg(**over))
    fed_q, engine_q, state_q = _engine(_cfg(compress={"uplink": {"name": "qsgd", "levels": 7},
                                                      "downlink": {"name": "qsgd_minmax", "levels": 16}}, **over))
    _, m = engine.run_round(fed, state)
    new_q, m_q = engine_q.run_round(fed_q, state_q)
    assert m["bytes_up"] == 3 * 4 * fed.layout.numel
    assert m_q["bytes_up"] < m["bytes_up"] / 6 and m_q["bytes_down"] < m["bytes_down"] / 6
    assert torch.isfinite(new_q.params).all() and not torch.equal(new_q.params, state_q.params)


def test_settings_of_parts_that_do_not_run_are_refused():
    with pytest.raises(ConfigError, match=r"`compress\.uplink\.bits` is set"):
        build_federation(_cfg(compress={"uplink": {"name": "none", "bits": 8}}), quiet=True)
    with pytest.raises(ConfigError, match=r"`engine\.schedule\.name`, `engine\.schedule\.deadline` set"):
        build_federation(_cfg(engine__schedule={"name": "synchronous", "deadline": 3.0}), quiet=True)


def test_a_lattice_downlink_needs_the_async_engine():
    lattice = {"name": "lattice", "bits": 14, "step": 1e-4}
    with pytest.raises(ConfigError, match=r"compress\.downlink.*reference point"):
        build_federation(_cfg(algorithm="fedavg", engine__kind="sync", compress={"downlink": lattice},
                              client={"epochs": 1, "batch_size": 16, "lr": 0.1}), quiet=True)


def test_resuming_on_an_edited_speed_trace_is_refused_and_on_the_same_trace_equals_the_whole_run(tmp_path):
    # the resumed run replayed the edited trace: its schedule was neither the old run's nor the new one's
    trace = tmp_path / "trace.csv"
    trace.write_text("client,duration\n" + "".join(f"{c},{1 + (c * 7 + k) % 5}\n" for c in range(8) for k in range(3)))
    cfg = _cfg(rounds=6, engine__checkpoint_every=1, engine__speed={"name": "trace", "path": str(trace)})
    whole = run_experiment(cfg, tmp_path / "whole", progress=False, plots=False)
    part = run_experiment(cfg, tmp_path / "part", progress=False, plots=False, stop_after=3).run_dir
    original = trace.read_text()
    trace.write_text(original.replace("client,duration\n0,", "client,duration\n0,9"))
    with pytest.raises(CheckpointError, match="engine.speed.path"):
        run_experiment(None, resume=part, progress=False, plots=False)
    trace.write_text(original)
    resumed = run_experiment(None, resume=part, progress=False, plots=False)
    assert torch.equal(resumed.params, whole.params)
    assert [r["sim_time"] for r in resumed.rows] == [r["sim_time"] for r in whole.rows]
