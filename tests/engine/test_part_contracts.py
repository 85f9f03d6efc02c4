"""Parts of your own are checked where the engine takes their output: a model whose outputs the objective cannot
use, or with nothing to train, is refused when the run is built; an aggregator or server stage that returns a
wrong shape, dtype, type, non-finite values or a metric that is not one number is refused in the round it does,
naming the part, before the model takes the step (they crashed a later round, or left a NaN model)."""
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn

from trustfl.aggregate.base import AbstractAggregator
from trustfl.config.build import build_federation
from trustfl.config.load import config_from_dict
from trustfl.core import registry
from trustfl.errors import ConfigError
from trustfl.experiment import run_experiment
from trustfl.core.stage import AbstractStage
from trustfl.types import StageOut

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _cfg(**over):
    data = {"name": "contracts", "seed": 0, "rounds": 2, "data": {"dataset": "digits", "num_clients": 4},
            "model": {"name": "mlp", "hidden": [8]}, "client": {"steps": 1, "batch_size": 16},
            "engine": {"checkpoint_every": 0}, **over}
    return config_from_dict(data)


def _register(monkeypatch, kind, name, factory):
    monkeypatch.setitem(registry._REGISTRY.setdefault(kind, {}), name, factory)


def _part(base, result):
    """A frozen dataclass subclass of ``base`` whose ``apply(x, state, ctx)`` returns ``result(x, state)``."""
    return dataclass(frozen=True)(type("Part", (base,), {"apply": lambda self, x, state, ctx: result(x, state)}))


BROKEN_RULES = {
    "short": (lambda x, s: StageOut(x.mean(0)[:-1], s), r"returned `x` = a float32 tensor of shape \(609,\) on cpu"),
    "float64": (lambda x, s: StageOut(x.mean(0).double(), s), r"returned `x` = a float64 tensor of shape \(610,\)"),
    "bare tensor": (lambda x, s: x.mean(0), "returned a Tensor, not a StageOut"),
    "nan": (lambda x, s: StageOut(x.mean(0) * float("nan"), s), r"returned non-finite values \(NaN or ±inf\)"),
    "inf": (lambda x, s: StageOut(x.mean(0) + float("inf"), s), "returned non-finite values"),
    "requires grad": (lambda x, s: StageOut(x.mean(0).requires_grad_(), s), r"returned `x` that requires grad"),
    "vector metric": (lambda x, s: StageOut(x.mean(0), s, {"norms": x.norm(dim=1)}),
                      r"returned metric 'norms' as a tensor of shape \(4,\), not one number"),
}


@pytest.mark.parametrize("case", BROKEN_RULES)
def test_an_aggregator_of_your_own_that_breaks_its_contract_is_named(monkeypatch, tmp_path, case):
    result, fragment = BROKEN_RULES[case]
    _register(monkeypatch, "aggregator", "contract_test_rule", _part(AbstractAggregator, result))
    cfg = _cfg(aggregator={"name": "contract_test_rule"}, cohort={"sampler": "all"})
    with pytest.raises(ConfigError, match=f"^aggregator 'contract_test_rule' {fragment}.* in round 1 \\(from 4 "
                                          f"finite messages\\); it must return a StageOut whose `x` is finite and, as "
                                          f"the model, a float32 tensor of shape \\(610,\\) on cpu"):
        run_experiment(cfg, tmp_path / "run", progress=False, plots=False)


def test_a_rule_that_meets_the_contract_runs_and_keeps_its_scalar_metrics(monkeypatch, tmp_path):
    fine = _part(AbstractAggregator, lambda x, s: StageOut(x.mean(0), s, {"spread": x.std(0).mean(), "n": x.shape[0]}))
    _register(monkeypatch, "aggregator", "contract_test_rule", fine)
    cfg = _cfg(aggregator={"name": "contract_test_rule"}, cohort={"sampler": "all"})
    rows = run_experiment(cfg, tmp_path / "run", progress=False, plots=False).rows
    plain = run_experiment(_cfg(cohort={"sampler": "all"}), tmp_path / "mean", progress=False, plots=False).rows
    assert [r["accuracy"] for r in rows if "accuracy" in r] == [r["accuracy"] for r in plain if "accuracy" in r]
    assert [r["aggregator/n"] for r in rows] == [4.0, 4.0] and all(r["aggregator/spread"] > 0 for r in rows)


def test_a_server_stage_of_your_own_that_returns_another_shape_is_named(monkeypatch, tmp_path):
    @dataclass(frozen=True)
    class Doubling(AbstractStage):
        def apply(self, x, state, ctx):
            return StageOut(torch.cat([x, x]), state)

    _register(monkeypatch, "server_stage", "contract_test_stage", Doubling)
    cfg = _cfg(server_stages=[{"name": "contract_test_stage"}])
    with pytest.raises(ConfigError, match=r"^stage .contract_test_stage. returned `x` = a float32 tensor of shape "
                                          r"\(1220,\) on cpu; a stage must return a StageOut"):
        run_experiment(cfg, tmp_path / "run", progress=False, plots=False)


# ---------------------------------------------------------------------------------------------------------- models
class ThreeOutputs(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.linear = nn.Linear(input_shape[-1], 3)

    def forward(self, x):
        return self.linear(x.flatten(1))


class Frozen(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.linear = nn.Linear(input_shape[-1], num_classes).requires_grad_(False)

    def forward(self, x):
        return self.linear(x.flatten(1))


class Pooled(nn.Module):
    """Averages over the batch: one output row for any number of examples."""

    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.linear = nn.Linear(input_shape[-1], num_classes)

    def forward(self, x):
        return self.linear(x.flatten(1)).mean(0, keepdim=True)


class Normed(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.norm = nn.BatchNorm1d(input_shape[-1])
        self.linear = nn.Linear(input_shape[-1], num_classes)

    def forward(self, x):
        return self.linear(self.norm(x.flatten(1)))


@pytest.mark.parametrize("model, over, fragment", [
    (ThreeOutputs, {}, r"gives outputs of shape \(2, 3\) for 2 examples; objective 'cross_entropy' on this data needs "
                       r"10 output\(s\) per example"),
    (Pooled, {}, r"gives outputs of shape \(1, 10\) for 2 examples"),
    (Frozen, {}, "has no trainable parameters"),
    (ThreeOutputs, {"data": {"dataset": "diabetes", "num_clients": 4}},
     r"gives outputs of shape \(2, 3\) for 2 examples; objective 'mse' on this data needs 1 output"),
])
def test_a_model_the_objective_cannot_use_is_refused_when_the_run_is_built(monkeypatch, model, over, fragment):
    _register(monkeypatch, "model", "contract_test_model", model)
    cfg = _cfg(model={"name": "contract_test_model"}, **over)
    with pytest.raises(ConfigError, match=f"^`model` \\('contract_test_model'\\) {fragment}"):
        build_federation(cfg)


class FrozenNorm(Normed):
    """BatchNorm in eval mode (its running statistics read, never written): trainable, unlike Normed in training."""

    def __init__(self, input_shape, num_classes):
        super().__init__(input_shape, num_classes)
        self.norm.eval()


def test_the_probe_changes_no_buffer_and_leaves_the_training_mode(monkeypatch):
    _register(monkeypatch, "model", "contract_test_model", FrozenNorm)
    fed = build_federation(_cfg(model={"name": "contract_test_model"}))
    assert fed.model.training and not fed.model.norm.training  # each module's own mode, as the user set it
    assert int(fed.model.norm.num_batches_tracked) == 0
    assert torch.equal(fed.model.norm.running_mean, torch.zeros(64))


def test_a_pre_aggregator_of_your_own_is_named_beside_the_rule(monkeypatch, tmp_path):
    from trustfl.aggregate.base import AbstractPreAggregator

    @dataclass(frozen=True)
    class Poisoning(AbstractPreAggregator):
        def apply(self, x, state, ctx):
            return StageOut(x * float("nan"), state)

    _register(monkeypatch, "pre_aggregator", "contract_test_pre", Poisoning)
    cfg = _cfg(aggregator={"name": "cwmed"}, pre_aggregators=[{"name": "contract_test_pre"}])
    with pytest.raises(ConfigError, match="^aggregator 'cwmed' after pre_aggregator 'contract_test_pre' returned "
                                          "non-finite values"):
        run_experiment(cfg, tmp_path / "run", progress=False, plots=False)


BROKEN_STAGES = {
    "drops rows": (lambda x, s: StageOut(x[:1], s), r"returned `x` = a float32 tensor of shape \(1, 610\) on cpu"),
    "drops a column": (lambda x, s: StageOut(x[:, 1:], s), r"returned `x` = a float32 tensor of shape \(4, 609\)"),
    "poisons a row": (lambda x, s: StageOut(torch.cat([x[:1] * float("nan"), x[1:]]), s),
                      r"returned non-finite values \(NaN or ±inf\) in row\(s\) \[0\]"),
    "bare tensor": (lambda x, s: x, "returned a Tensor, not a StageOut"),
    "requires grad": (lambda x, s: StageOut(x.clone().requires_grad_(), s), r"returned `x` that requires grad"),
}


@pytest.mark.parametrize("case", BROKEN_STAGES)
def test_a_client_stage_of_your_own_that_drops_or_poisons_messages_is_named(monkeypatch, tmp_path, case):
    result, fragment = BROKEN_STAGES[case]
    _register(monkeypatch, "client_stage", "contract_test_stage", _part(AbstractStage, result))
    cfg = _cfg(client_stages=[{"name": "contract_test_stage"}], cohort={"sampler": "all"})
    with pytest.raises(ConfigError, match=f"^stage 'contract_test_stage' {fragment}.*; a stage must return a StageOut "
                                          f"whose `x` has its input's shape \\(4, 610\\)"):
        run_experiment(cfg, tmp_path / "run", progress=False, plots=False)


def test_a_stage_may_pass_on_rows_that_were_already_non_finite(monkeypatch):
    from trustfl.core.stage import chain

    scale = _part(AbstractStage, lambda x, s: StageOut(2 * x, s))()
    x = torch.tensor([[1.0, float("nan")], [3.0, 4.0]])
    out = chain(("scale", scale)).apply(x, {"scale": None}, None)
    assert torch.equal(out.x[1], torch.tensor([6.0, 8.0])) and torch.isnan(out.x[0, 1])


# ------------------------------------------------------------------------------------------------------ evaluators
def _evaluator(result):
    from trustfl.evaluate.base import AbstractEvaluator

    @dataclass(frozen=True)
    class Counting(AbstractEvaluator):
        metrics = {"seen": True}

        def init(self):
            return 0

        def update(self, acc, outputs, batch, objective):
            return acc + outputs.shape[0]

        def result(self, acc):
            return result(acc)
    return Counting


@pytest.mark.parametrize("result, fragment", [
    (lambda n: {"seen": "many"}, "gave 'seen' = 'many'; a metric is one number"),
    (lambda n: {"seen": torch.ones(3)}, "gave 'seen' = tensor"),
    (lambda n: {"seen": True}, "gave 'seen' = True"),
    (lambda n: {"other": 1.0}, r"must return \{name: number\} for its declared metrics \['seen'\].*found \['other'\]"),
    (lambda n: {"seen": 1.0, "extra": 2.0}, r"found \['extra', 'seen'\]"),
    (lambda n: n, r"found int"),
])
def test_an_evaluator_of_your_own_must_give_one_number_per_declared_metric(monkeypatch, tmp_path, result, fragment):
    _register(monkeypatch, "evaluator", "contract_test_eval", _evaluator(result))
    cfg = _cfg(evaluators=[{"name": "contract_test_eval"}])
    with pytest.raises(ConfigError, match=f"^evaluator Counting: result\\(\\) .*{fragment}"):
        run_experiment(cfg, tmp_path / "run", progress=False, plots=False)


UNPRINTABLE = "must be printable text of 1 to 100 characters"
ROW_COLUMN = "is a column the engine writes in metrics.jsonl rows; name it otherwise"


@pytest.mark.parametrize("name, fragment", [
    # a NUL ran every round, then failed the run's plot: ValueError: embedded null byte
    ("acc\x00uracy", UNPRINTABLE), ("", UNPRINTABLE), ("two\nlines", UNPRINTABLE), ("x" * 101, UNPRINTABLE),
    # "round" replaced the row's round number in metrics.jsonl; "rejected" was overwritten by the engine's count
    ("round", ROW_COLUMN), ("rejected", ROW_COLUMN), ("wall_time_s", ROW_COLUMN), ("epsilon_max", ROW_COLUMN),
])
def test_an_evaluators_metric_name_that_cannot_name_a_file_or_a_column_is_refused_when_built(monkeypatch, name,
                                                                                            fragment):
    base = _evaluator(lambda n: {name: float(n)})
    _register(monkeypatch, "evaluator", "contract_test_eval", type("Named", (base,), {"metrics": {name: True}}))
    with pytest.raises(ConfigError, match=rf"^evaluators\[0\] \(Named\): metric name .* {fragment}"):
        build_federation(_cfg(evaluators=[{"name": "contract_test_eval"}]))


def test_an_evaluators_metric_named_like_another_round_metric_is_refused_with_the_row(monkeypatch, tmp_path):
    """A round metric outside the fixed columns (a stage's) is checked as the first evaluated row is made."""
    base = _evaluator(lambda n: {"gaussian_noise/std": float(n)})
    named = type("Named", (base,), {"metrics": {"gaussian_noise/std": True}})
    _register(monkeypatch, "evaluator", "contract_test_eval", named)
    stages = [{"name": "clip_l2", "max_norm": 1.0}, {"name": "gaussian_noise", "noise_multiplier": 0.1,
                                                     "sensitivity": 1.0}]
    cfg = _cfg(evaluators=[{"name": "contract_test_eval"}], client_stages=stages)
    with pytest.raises(ConfigError, match=r"^`evaluators`: metric 'gaussian_noise/std' is also a column the engine "
                                          r"writes in the round's row"):
        run_experiment(cfg, tmp_path / "run", progress=False, plots=False)


def test_an_evaluators_one_number_tensor_is_written_as_a_number(monkeypatch, tmp_path):
    _register(monkeypatch, "evaluator", "contract_test_eval", _evaluator(lambda n: {"seen": torch.tensor(n)}))
    cfg = _cfg(evaluators=[{"name": "contract_test_eval"}])
    res = run_experiment(cfg, tmp_path / "run", progress=False, plots=False)
    test_rows = build_federation(cfg).dataset.test_x.shape[0]
    seen = [r["seen"] for r in res.rows if "seen" in r]
    assert seen == [float(test_rows)] * 2 and all(type(v) is float for v in seen)


# ---------------------------------------------------------------------------------------------------- partitioners
def _partitioner(split):
    import numpy as np

    from trustfl.data.partition import AbstractPartitioner

    @dataclass(frozen=True)
    class Mine(AbstractPartitioner):
        name = "mine"

        def _split(self, labels, num_clients, rng):
            return split(np.arange(labels.size), num_clients)
    return Mine


@pytest.mark.parametrize("split, fragment", [
    (lambda idx, n: [idx[: len(idx) // 2], idx[len(idx) // 2:] + 1] + [idx[:0]] * (n - 2),
     r"partitioner 'mine' gave index 1438, outside the 1438 examples"),
    (lambda idx, n: [idx, idx[:3]] + [idx[:0]] * (n - 2), r"gave example 0 to 2 clients \(or twice to one\)"),
    (lambda idx, n: [idx[5:]] + [idx[:0]] * (n - 1), r"gave 5 of the 1438 examples to no client \(first: 0\)"),
    (lambda idx, n: [idx], r"must return a Partition of 4 clients' index arrays, found 1"),
])
def test_a_partitioner_of_your_own_must_give_each_example_to_one_client(monkeypatch, split, fragment):
    _register(monkeypatch, "partitioner", "contract_test_split", _partitioner(split))
    with pytest.raises(ConfigError, match=f"^`data.partition`.*{fragment}"):
        build_federation(_cfg(data={"dataset": "digits", "num_clients": 4, "partition": "contract_test_split"}))


@pytest.mark.parametrize("parts, fragment", [
    (lambda n, m: [np.arange(n)] * m, r"partitioner 'contract_test_call' gave example 0 to 4 clients"),
    (lambda n, m: np.array_split(np.arange(n) + 5, m), r"gave index 1438, outside the 1438 examples"),
    (lambda n, m: [np.arange(n, dtype=np.float64)] + [np.zeros(0, np.int64)] * (m - 1),
     r"index array of client 0 is not a 1-D integer numpy array"),
])
def test_a_partitioner_overriding_call_is_checked_where_its_partition_is_taken(monkeypatch, parts, fragment):
    """The cover check ran inside AbstractPartitioner's own __call__ only: an override giving every client the
    whole data set trained as if nothing were wrong, one with indices past the data raised torch's IndexError."""
    from trustfl.data.partition import AbstractPartitioner, Partition

    @dataclass(frozen=True)
    class Mine(AbstractPartitioner):
        name = "contract_test_call"

        def __call__(self, labels, num_clients, rng, groups=None):
            return Partition(indices=list(parts(labels.size, num_clients)), summary={"partitioner": self.name})

    _register(monkeypatch, "partitioner", "contract_test_call", Mine)
    with pytest.raises(ConfigError, match=f"^`data.partition`: .*{fragment}"):
        build_federation(_cfg(data={"dataset": "digits", "num_clients": 4, "partition": "contract_test_call"}))


def test_a_partitioner_of_your_own_that_partitions_is_used_as_given(monkeypatch):
    import numpy as np

    _register(monkeypatch, "partitioner", "contract_test_split",
              _partitioner(lambda idx, n: np.array_split(idx[::-1], n)))
    fed = build_federation(_cfg(data={"dataset": "digits", "num_clients": 4, "partition": "contract_test_split"}))
    assert [int(r.min()) for r in fed.client_rows] == [1078, 718, 359, 0] and fed.client_rows.sizes() == [360] * 2 \
        + [359] * 2


# -------------------------------------------------------------------------------------------------------- samplers
def _sampler(draw):
    from trustfl.data.sampling import AbstractBatchSampler

    @dataclass(frozen=True)
    class Mine(AbstractBatchSampler):
        accounting = "shuffle"

        def _draw_matrix(self, n, b, total, generator):
            return draw(n, b, total)

        def _draw(self, n, b, total, generator):
            return list(draw(n, b, total))
    return Mine


@pytest.mark.parametrize("draw, fragment", [
    (lambda n, b, t: torch.full((t, b), n, dtype=torch.int64), r"values in \[\d+, \d+\] over \d+ step\(s\)"),
    (lambda n, b, t: torch.full((t, b), -2, dtype=torch.int64), r"values in \[-2, -2\]"),
    (lambda n, b, t: torch.zeros((t, b), dtype=torch.int32), r"an int32 tensor of shape \(2, 16\) on cpu with "),
    (lambda n, b, t: torch.zeros((t + 1, b), dtype=torch.int64), r"over (\d+) step\(s\); it must draw (?!\1)\d+ step"),
    (lambda n, b, t: torch.zeros((0, b), dtype=torch.int64), r"over 0 step\(s\); it must draw [1-9]\d* step"),
])
@pytest.mark.parametrize("executor", ["vectorized", "sequential"])
def test_a_batch_sampler_of_your_own_must_draw_the_clients_own_indices(monkeypatch, tmp_path, draw, fragment,
                                                                       executor):
    _register(monkeypatch, "batch_sampler", "contract_test_sampler", _sampler(draw))
    cfg = _cfg(client={"steps": 2, "batch_size": 16, "batch_sampler": "contract_test_sampler"},
               engine={"checkpoint_every": 0, "executor": executor})
    named = "^`client.batch_sampler`: batch_sampler 'contract_test_sampler' drew "
    with pytest.raises(ConfigError, match=f"{named}.*{fragment}"):
        run_experiment(cfg, tmp_path / "run", progress=False, plots=False)


@pytest.mark.parametrize("draw", [
    lambda n, b, t: torch.zeros((0, b), dtype=torch.int64),  # no batch at all: the accountant would charge t steps
    lambda n, b, t: torch.full((t, b), n, dtype=torch.int64),
    lambda n, b, t: torch.zeros((t + 1, b), dtype=torch.int64),
])
def test_the_list_of_batches_is_checked_as_the_matrix_is(draw):
    sampler = _sampler(draw)()
    with pytest.raises(ConfigError, match="^`client.batch_sampler`: batch_sampler 'Mine' drew .* it must draw 3 step"):
        sampler.steps(100, 10, torch.Generator().manual_seed(0), num_steps=3)
    assert [b.tolist() for b in _sampler(lambda n, b, t: torch.arange(t * b).reshape(t, b))().steps(
        100, 10, torch.Generator(), num_steps=3)] == [list(range(s * 10, s * 10 + 10)) for s in range(3)]
