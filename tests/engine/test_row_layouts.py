"""A crafted message of another memory layout (sparse COO, mkldnn) is a malformed row: screened
out and counted in `rejected` on every engine, as a wrong shape or dtype is. It passed the shape, dtype and device
checks and crashed the server in torch.stack (``aten::_values``)."""
import pytest
import torch

from trustfl.attacks.update import GaussianAttack
from trustfl.engine.round_parts import stack_rows
from trustfl.experiment import run_experiment

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LAYOUTS = {"sparse_coo": torch.Tensor.to_sparse, "mkldnn": torch.Tensor.to_mkldnn}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_row_of_another_layout_becomes_a_nan_row(layout):
    like = torch.zeros(4)
    rows = [torch.ones(4), LAYOUTS[layout](torch.ones(4)), torch.full((4,), 2.0)]
    stacked, shaped = stack_rows(rows, 4, like)
    assert shaped == [True, False, True]
    assert stacked[0].tolist() == [1.0] * 4 and stacked[1].isnan().all() and stacked[2].tolist() == [2.0] * 4


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("engine", ["sync", "async"])
def test_byzantine_rows_of_another_layout_are_rejected_and_counted_not_a_crash(engine, layout, small_config,
                                                                               monkeypatch, tmp_path):
    def sparse(self, honest, num_byzantine, ctx, aggregator=None):
        return [LAYOUTS[layout](honest.new_ones(honest.shape[1])) for _ in range(num_byzantine)]

    monkeypatch.setattr(GaussianAttack, "craft", sparse)
    extra = {"algorithm": "fedbuff", "engine": {"kind": "async", "checkpoint_every": 0, "interaction_time": 3.0,
                                               "speed": {"name": "deterministic"}},
             "client": {"steps": 3, "batch_size": 16, "lr": 0.1}} if engine == "async" else {}
    cfg = small_config(rounds=3, cohort={"sampler": "uniform", "size": 6}, aggregator={"name": "cwtm", "f": 2},
                       attack={"name": "gaussian", "num_byzantine": 2}, **extra)
    result = run_experiment(cfg, tmp_path / "layout", progress=False, plots=False)
    assert len(result.rows) == 3 and bool(torch.isfinite(result.params).all())
    assert sum(r["rejected"] for r in result.rows) >= 2

    def nan_rows(self, honest, num_byzantine, ctx, aggregator=None):
        return honest.new_full((num_byzantine, honest.shape[1]), float("nan"))

    monkeypatch.setattr(GaussianAttack, "craft", nan_rows)  # the same run with rows known to be screened out
    reference = run_experiment(cfg, tmp_path / "nan", progress=False, plots=False)
    assert torch.equal(result.params, reference.params)
    assert [r["rejected"] for r in result.rows] == [r["rejected"] for r in reference.rows]
