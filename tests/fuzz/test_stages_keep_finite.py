"""trustfl's own client and server stages keep finite rows finite, at any finite scale up to the float32 maximum,
and keep their input's shape and dtype. ``Chain`` relies on this: it scans for non-finite rows only after stages
of your own (core/stage.py), so this test must cover every registered stage of trustfl's, and does so from the
registry (a new stage without parameters here fails it)."""
from __future__ import annotations

import pytest
import torch

from trustfl.core.registry import build, lookup, names
from trustfl.core.stage import stage_out_problem
from trustfl.types import ParamLayout, RoundContext

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PARAMS = {
    ("client_stage", "clip_l2"): {"max_norm": 1.0},
    ("client_stage", "correlated_noise"): {"sigma_cor": 2.0, "sigma_ind": 0.5},
    ("client_stage", "gaussian_noise"): {"std": 3.0},
    ("client_stage", "secldp_accounting"): {"step": 0.1},
    ("client_stage", "worker_momentum"): {"beta": 0.9},
    ("server_stage", "central_gaussian_noise"): {"noise_multiplier": 1.0, "clip_norm": 1.0},
}
SCALES = (1e-30, 1.0, 1e30, torch.finfo(torch.float32).max)


def _own_stages() -> list[tuple[str, str]]:
    return [(kind, name) for kind in ("client_stage", "server_stage") for name in names(kind)
            if lookup(kind, name).__module__.startswith("trustfl.")]


def test_every_stage_of_trustfl_is_covered():
    assert set(_own_stages()) == set(PARAMS)


@pytest.mark.parametrize("kind, name", sorted(PARAMS))
@pytest.mark.parametrize("scale", SCALES)
def test_a_stage_keeps_finite_rows_finite(kind, name, scale):
    stage = build(kind, name, **PARAMS[(kind, name)])
    n, d = 5, 12
    gen = torch.Generator().manual_seed(7)
    x = (torch.rand(n, d, generator=gen) * 2 - 1) * scale
    x[0] = scale  # a row at the scale in every coordinate (at the maximum: the largest finite float32)
    x[1, :3] = float("nan")  # a non-finite row may stay non-finite; the others must not become so
    if kind == "server_stage":  # a server stage sees the aggregate, one vector
        x = x[2]
    state = stage.init(ParamLayout(("w",), ((d,),)))
    ctx = RoundContext(round=3, seed=11, client_ids=tuple(range(n)), num_clients=n)
    for _ in range(3):  # stateful stages (momentum) see their own state again
        out = stage.apply(x, state, ctx)
        finite_in = torch.isfinite(x).all(-1).reshape(-1)
        assert stage_out_problem(out, x, finite_in) is None, (name, scale)
        state = out.state
