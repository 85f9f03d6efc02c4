"""More parts of your own held to what the engine takes from them, each refused in one ConfigError naming it:
a gradient transform (its gradients, its client state and extras), a speed model (its step times), a step budget
(its step counts) and a compressor (what it decodes). Before, a transform returning another shape or leaving a
parameter out ended in a traceback, a speed model's negative or NaN step times ran silently on a broken clock, a
step budget of -1 silently dropped the last step (a slice), and a compressor's wrong decode was blamed on the
senders (every message rejected) or crashed the clients.

Each check is skipped for trustfl's own parts, so each test also runs a subclass of a built-in part defined here
(checked like any plugin) and requires the run to equal the built-in's: the checks refuse nothing the built-ins
do."""
from dataclasses import dataclass

import pytest
import torch

from trustfl.client.divergence_aware import FedEMAStart
from trustfl.client.scaffold import Scaffold
from trustfl.client.step_budget import AbstractStepBudget, Stragglers
from trustfl.client.transforms import AbstractGradientTransform, Momentum
from trustfl.compress.lattice import Lattice
from trustfl.compress.qsgd import QSGD
from trustfl.config.load import config_from_dict
from trustfl.core import registry
from trustfl.errors import ConfigError
from trustfl.experiment import run_experiment
from trustfl.simtime.speed import AbstractSpeedModel, ExponentialGroups

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _cfg(kind="sync", **over):
    engine = {"checkpoint_every": 0, **over.pop("engine", {})}
    data = {"name": "contracts", "seed": 0, "rounds": 2, "data": {"dataset": "digits", "num_clients": 4},
            "model": {"name": "mlp", "hidden": [8]}, "client": {"steps": 2, "batch_size": 16}, "engine": engine}
    if kind == "async":
        data.update(algorithm="quafl", cohort={"sampler": "uniform", "size": 2})
        engine.update(kind="async", interaction_time=3.0)
    return config_from_dict({**data, **over})


def _register(monkeypatch, kind, name, factory):
    monkeypatch.setitem(registry._REGISTRY.setdefault(kind, {}), name, factory)


def _run(cfg, path):
    return run_experiment(cfg, path, progress=False, plots=False)


def _same_runs(a, b):
    assert torch.equal(a.params, b.params)
    assert [{k: v for k, v in r.items() if k != "wall_time_s"} for r in a.rows] == \
        [{k: v for k, v in r.items() if k != "wall_time_s"} for r in b.rows]


# -- gradient transforms -------------------------------------------------------------------------------------------

def _transform(apply=None, finish=None):
    apply = apply or (lambda grads, state: (grads, state))
    body = {"apply": lambda self, grads, state, params, active, cohort: apply(grads, state)}
    if finish is not None:
        body["finish"] = lambda self, state, cohort, start, end, steps: finish(start)
        body["client_state_defaults"] = lambda self, params: {"seen": torch.zeros(3, dtype=params.dtype)}
        body["extras_widths"] = lambda self, layout: {"norm": 1}
    return dataclass(frozen=True)(type("Transform", (AbstractGradientTransform,), body))


BROKEN_APPLY = {
    "flattened": (lambda g, s: ({k: v.flatten(1) for k, v in g.items()}, s),
                  r"returned gradient 'net.0.weight' = a float32 tensor of shape \(4, 512\) on cpu for a parameter of "
                  r"\(4, 8, 64\) on cpu"),
    "one left out": (lambda g, s: (dict(list(g.items())[1:]), s), r"returned no gradient for \['net.0.weight'\]"),
    "one too many": (lambda g, s: ({**g, "extra": g["net.0.bias"]}, s), r"returned gradients for unknown \['extra'\]"),
    "integers": (lambda g, s: ({k: v.long() for k, v in g.items()}, s), r"returned gradient 'net.0.weight' = "
                 r"an int64 tensor of shape \(4, 8, 64\)"),
    "no state": (lambda g, s: g, "returned a dict"),
}


def _refused(monkeypatch, tmp_path, transform, pattern):
    _register(monkeypatch, "gradient_transform", "contract_test_transform", transform)
    cfg = _cfg(client={"steps": 2, "batch_size": 16, "transforms": [{"name": "contract_test_transform"}]},
               cohort={"sampler": "all"})
    with pytest.raises(ConfigError, match=f"^gradient_transform 'contract_test_transform' {pattern}"):
        _run(cfg, tmp_path / "run")


@pytest.mark.parametrize("case", BROKEN_APPLY)
def test_a_gradient_transform_of_your_own_returning_other_gradients_is_named(monkeypatch, tmp_path, case):
    apply, fragment = BROKEN_APPLY[case]
    _refused(monkeypatch, tmp_path, _transform(apply=apply),
             f"{fragment}.* from apply\\(\\); it must return \\(gradients, state\\)")


BROKEN_FINISH = {
    "undeclared state": (lambda start: ({"other": start[:, :3]}, {"norm": start[:, :1]}),
                         r"returned an undeclared client-state entry 'other'"),
    "state of another shape": (lambda start: ({"seen": start[:, :2]}, {"norm": start[:, :1]}),
                               r"returned client-state entry 'seen' = a float32 tensor of shape \(4, 2\) on cpu "
                               r"\(expected \(4, 3\)\)"),
    "extra without rows": (lambda start: ({"seen": start[:, :3]}, {"norm": start[0]}),
                           r"returned extra 'norm' = a float32 tensor of shape \(610,\) on cpu for 4 clients"),
    "one dict": (lambda start: {"seen": start[:, :3]}, "returned a dict"),
}


@pytest.mark.parametrize("case", BROKEN_FINISH)
def test_a_gradient_transform_of_your_own_finishing_with_other_state_is_named(monkeypatch, tmp_path, case):
    finish, fragment = BROKEN_FINISH[case]
    _refused(monkeypatch, tmp_path, _transform(finish=finish),
             f"{fragment} from finish\\(\\); it must return \\(client_state, extras\\)")


def _personalizing(personalize):
    body = {"personalizes": True, "personalize": lambda self, start, cohort: personalize(start),
            "apply": lambda self, grads, state, params, active, cohort: (grads, state)}
    return dataclass(frozen=True)(type("Transform", (AbstractGradientTransform,), body))


@pytest.mark.parametrize("personalize, found", [(lambda start: start[0], r"a float32 tensor of shape \(610,\) on cpu"),
                                                (lambda start: start[:, 1:],
                                                 r"a float32 tensor of shape \(4, 609\) on cpu"),
                                                (lambda start: None, "None")], ids=["one row", "short", "none"])
def test_a_personalizing_transform_of_your_own_returning_other_starts_is_named(monkeypatch, tmp_path, personalize,
                                                                               found):
    """A start of another shape ended in an IndexError or a reshape's RuntimeError."""
    _refused(monkeypatch, tmp_path, _personalizing(personalize),
             f"returned {found} from personalize\\(\\); it must return the clients' flat starting models, a "
             f"floating-point tensor of shape \\(4, 610\\) on cpu")


@pytest.mark.parametrize("name, base, params", [("momentum", Momentum, {"momentum": 0.9}),
                                                ("scaffold", Scaffold, {}), ("fedema", FedEMAStart, {"tau": 0.5})],
                         ids=["momentum", "scaffold", "fedema"])
def test_checked_copies_of_the_built_in_transforms_run_as_the_built_ins(monkeypatch, tmp_path, name, base, params):
    """Momentum's gradients, SCAFFOLD's control variates (client state) and extras, and FedEMA's personalized
    starts pass the checks unchanged."""
    assert registry.lookup("gradient_transform", name) is base
    copy = dataclass(frozen=True)(type("Copy", (base,), {}))
    _register(monkeypatch, "gradient_transform", "contract_test_copy", copy)
    runs = [_run(_cfg(client={"steps": 2, "batch_size": 16, "transforms": [{"name": n, **params}]},
                      cohort={"sampler": "uniform", "size": 2}, rounds=3), tmp_path / n)
            for n in (name, "contract_test_copy")]
    _same_runs(*runs)


# -- speed models -------------------------------------------------------------------------------------------------

def _speed(means, draw):
    body = {"_bind_means": lambda self, n, seed: means(n),
            "_draw": lambda self, ids, last, seed, steps: draw(ids, steps)}
    return dataclass(frozen=True)(type("Speed", (AbstractSpeedModel,), body))


TWOS = lambda n: torch.full((n,), 2.0, dtype=torch.float64)  # noqa: E731
BROKEN_SPEED = {
    "negative": (TWOS, lambda ids, k: torch.full((ids.numel(), k), -1.0, dtype=torch.float64),
                 r"gave -1.0 at \(0, 0\) from _draw\(\)"),
    "nan": (TWOS, lambda ids, k: torch.ones(ids.numel(), k, dtype=torch.float64).index_fill_(1, torch.tensor([1]),
                                                                                             float("nan")),
            r"gave nan at \(0, 1\) from _draw\(\)"),
    "one row": (TWOS, lambda ids, k: torch.ones(k, dtype=torch.float64), r"gave a float64 tensor of shape "
                r"\(2,\) on cpu from _draw\(\); its step times must be a float64 tensor of shape \(2, 2\) on cpu"),
    "float32": (TWOS, lambda ids, k: torch.ones(ids.numel(), k), "gave a float32 tensor"),
    "zero mean": (lambda n: torch.zeros(n, dtype=torch.float64), lambda ids, k: torch.ones(ids.numel(), k),
                  r"gave 0.0 at \(0,\) from _bind_means\(\); its step times must be in \(0, 1e\+100\]"),
    # beyond MAX_TIME the clock's sums overflow
    "huge": (TWOS, lambda ids, k: torch.full((ids.numel(), k), 1e308, dtype=torch.float64),
             r"gave 1e\+308 at \(0, 0\) from _draw\(\); its step times must be in \[0, 1e\+100\]"),
}


@pytest.mark.parametrize("case", BROKEN_SPEED)
def test_a_speed_model_of_your_own_giving_impossible_step_times_is_named(monkeypatch, tmp_path, case):
    means, draw, fragment = BROKEN_SPEED[case]
    _register(monkeypatch, "speed_model", "contract_test_speed", _speed(means, draw))
    cfg = _cfg("async", engine={"speed": {"name": "contract_test_speed"}})
    with pytest.raises(ConfigError, match=f"`engine.speed`.*: speed_model 'contract_test_speed' {fragment}"):
        _run(cfg, tmp_path / "run")


def test_a_checked_copy_of_a_built_in_speed_model_runs_as_the_built_in(monkeypatch, tmp_path):
    _register(monkeypatch, "speed_model", "contract_test_copy",
              dataclass(frozen=True)(type("Copy", (ExponentialGroups,), {})))
    runs = [_run(_cfg("async", engine={"speed": {"name": n, "slow_share": 0.25}}, rounds=4), tmp_path / n)
            for n in ("exponential_groups", "contract_test_copy")]
    _same_runs(*runs)
    assert runs[0].rows[-1]["sim_time"] > 0


# -- step budgets -------------------------------------------------------------------------------------------------

def _budget(steps):
    return dataclass(frozen=True)(type("Budget", (AbstractStepBudget,),
                                       {"max_steps": lambda self, cid, planned, seed, r: steps}))


@pytest.mark.parametrize("steps", [-1, 1.0, 2.5, "2", True])
def test_a_step_budget_of_your_own_giving_no_step_count_is_named(monkeypatch, tmp_path, steps):
    _register(monkeypatch, "step_budget", "contract_test_budget", _budget(steps))
    cfg = _cfg(client={"steps": 2, "batch_size": 16, "step_budget": {"name": "contract_test_budget"}})
    with pytest.raises(ConfigError, match=f"^`client.step_budget`: step_budget 'contract_test_budget' gave "
                                          f"{steps!r} steps for client \\d in round 1; it must give None"):
        _run(cfg, tmp_path / "run")


def test_step_budgets_of_your_own_that_keep_the_contract_run(monkeypatch, tmp_path):
    """A numpy integer is a step count; a budget above the plan completes the plan; a checked copy of the
    stragglers runs as the built-in."""
    import numpy as np

    runs = {}
    for name, part in [("one", _budget(np.int64(1))), ("ten", _budget(10)), ("copy", dataclass(frozen=True)(
            type("Copy", (Stragglers,), {})))]:
        _register(monkeypatch, "step_budget", f"contract_test_{name}", part)
        runs[name] = _run(_cfg(client={"steps": 2, "batch_size": 16,
                                       "step_budget": {"name": f"contract_test_{name}"}}), tmp_path / name)
    runs["full"] = _run(_cfg(), tmp_path / "full")
    runs["stragglers"] = _run(_cfg(client={"steps": 2, "batch_size": 16, "step_budget": {"name": "stragglers"}}),
                              tmp_path / "stragglers")
    _same_runs(runs["ten"], runs["full"])
    _same_runs(runs["copy"], runs["stragglers"])
    assert not torch.equal(runs["one"].params, runs["full"].params)


# -- compressors --------------------------------------------------------------------------------------------------

def _compressor(decode):
    return dataclass(frozen=True)(type("Comp", (QSGD,), {"decode": lambda self, enc, key, seed: decode(
        QSGD.decode(self, enc, key, seed))}))


BROKEN_DECODE = {
    "short rows": (lambda out: (out[0][:, :-1], out[1]), r"decoded \(a float32 tensor of shape \(\d+, 609\) on cpu, "
                   r"an int64 tensor of shape \(\d+,\) on cpu\) \(\d+ message\(s\) of 610 coordinates\)"),
    "float counts": (lambda out: (out[0], out[1].float()), r"decoded \(a float32 tensor of shape \(\d+, 610\) on "
                     r"cpu, a float32 tensor of shape \(\d+,\) on cpu\)"),
    "nan": (lambda out: (out[0] * float("nan"), out[1]), r"decoded non-finite values \(NaN or ±inf\) where the "
            r"sent rows were finite"),
    "one tensor": (lambda out: out[0], "decoded a Tensor"),
    "negative counts": (lambda out: (out[0], out[1] - 1), r"decoded negative failure counts \(an int64 tensor"),
}


@pytest.mark.parametrize("direction", ["uplink", "downlink"])
@pytest.mark.parametrize("case", BROKEN_DECODE)
def test_a_compressor_of_your_own_decoding_badly_is_named(monkeypatch, tmp_path, case, direction):
    decode, fragment = BROKEN_DECODE[case]
    _register(monkeypatch, "compressor", "contract_test_compressor", _compressor(decode))
    cfg = _cfg(compress={direction: {"name": "contract_test_compressor", "levels": 16}})
    with pytest.raises(ConfigError, match=f"^`compress.{direction}`: compressor 'contract_test_compressor' "
                                          f"{fragment}.*; decode\\(\\) must return \\(decoded, failures\\)"):
        _run(cfg, tmp_path / "run")


def test_checked_copies_of_the_built_in_compressors_run_as_the_built_ins(monkeypatch, tmp_path):
    """QSGD on the uplink of a synchronous run; the lattice quantizer (with its reference points) both ways in
    QuAFL, whose downlink is decoded by each client against its own model."""
    _register(monkeypatch, "compressor", "contract_test_qsgd", dataclass(frozen=True)(type("Copy", (QSGD,), {})))
    _register(monkeypatch, "compressor", "contract_test_lattice", dataclass(frozen=True)(type("Copy", (Lattice,), {})))
    pairs = [(_cfg(compress={"uplink": {"name": n, "levels": 16}}), n) for n in ("qsgd", "contract_test_qsgd")]
    lattice = {"bits": 14, "step": 1e-4}
    pairs += [(_cfg("async", compress={"uplink": {"name": n, **lattice}, "downlink": {"name": n, **lattice}},
                    engine={"speed": {"name": "exponential_groups"}}), f"async_{n}")
              for n in ("lattice", "contract_test_lattice")]
    runs = [_run(cfg, tmp_path / name) for cfg, name in pairs]
    _same_runs(runs[0], runs[1])
    _same_runs(runs[2], runs[3])
    assert runs[2].rows[-1]["bits_down"] > 0
