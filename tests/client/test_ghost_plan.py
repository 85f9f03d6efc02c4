"""The ghost plan is found once per model and what it depends on, and found again when any of that changes."""
import gc

import torch
from torch import nn

from trustfl.client import ghost_plan as plans
from trustfl.client.ghost_plan import ghost_plan
from trustfl.objectives.builtin import CrossEntropy


class Counting(nn.Module):
    def __init__(self, reuse: bool = False) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 4), nn.Linear(4, 4 if reuse else 3)
        self.reuse, self.forwards = reuse, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.forwards += 1
        h = self.fc2(torch.relu(self.fc1(x)))
        return self.fc2(h) if self.reuse else h


def _stacked(net: nn.Module, m: int = 2, dtype=torch.float32) -> dict[str, torch.Tensor]:
    return {k: v.detach().to(dtype).expand(m, *v.shape).clone() for k, v in net.named_parameters()}


def _batch(m: int, b: int, features: int = 6, dtype=torch.float32) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(m, b, features, dtype=dtype), "y": torch.zeros(m, b, dtype=torch.long)}


def test_the_plan_is_traced_once_per_model_and_signature():
    net, ce = Counting(), CrossEntropy()
    plan = ghost_plan(net, _stacked(net), _batch(2, 5), ce)
    assert [(layer.name, shape) for layer, shape in plan] == [("fc1", (4,)), ("fc2", (3,))]
    assert net.forwards == 1
    # other batch sizes, cohort sizes and values: the same per-example signature, no new trace
    again = ghost_plan(net, _stacked(net, m=3), _batch(3, 9), ce)
    assert again == plan and again is not plan and net.forwards == 1
    # a new per-example input shape, parameter dtype, objective or trained subset: traced again
    wide = Counting()
    wide.fc1 = nn.Linear(8, 4)
    ghost_plan(wide, _stacked(wide), _batch(2, 5, features=8), ce)
    ghost_plan(net, _stacked(net, dtype=torch.float64), _batch(2, 5, dtype=torch.float64), ce)
    assert net.forwards == 2
    ghost_plan(net, _stacked(net), _batch(2, 5), CrossEntropy())
    assert net.forwards == 3
    only_fc2 = {k: v for k, v in _stacked(net).items() if k.startswith("fc2")}
    assert [layer.name for layer, _ in ghost_plan(net, only_fc2, _batch(2, 5), ce)] == ["fc2"]
    assert net.forwards == 4


def test_a_model_without_a_plan_is_remembered_as_such():
    net, ce = Counting(reuse=True), CrossEntropy()  # fc2 runs twice per forward
    assert ghost_plan(net, _stacked(net), _batch(2, 5), ce) is None
    assert ghost_plan(net, _stacked(net), _batch(2, 5), ce) is None
    assert net.forwards == 1


def test_plans_die_with_their_model():
    net = Counting()
    ghost_plan(net, _stacked(net), _batch(2, 5), CrossEntropy())
    before = len(plans._PLANS)
    del net
    gc.collect()
    assert len(plans._PLANS) == before - 1


def test_a_layer_replaced_or_reconfigured_in_place_is_planned_again():
    """Same parameter names and shapes, another geometry: the cached plan is not used (its norms would be wrong)."""
    from trustfl.client.per_example import clipped_grad_sum

    class Strided(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc = nn.Conv1d(2, 3, 3), nn.LazyLinear(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.tanh(self.conv(x)).flatten(1)[:, :6])  # the first 6 features, whatever the stride

    torch.manual_seed(0)
    net = Strided().double()
    net(torch.zeros(1, 2, 9, dtype=torch.float64))
    params = _stacked(net, dtype=torch.float64)
    batch = {"x": torch.randn(2, 3, 2, 9, dtype=torch.float64), "y": torch.zeros(2, 3, dtype=torch.long)}
    mask = torch.ones(2, 3)
    ghost_sums, _ = clipped_grad_sum(net, params, batch, mask, 0.5, method="ghost")
    for change in ("stride", "replace"):
        if change == "stride":
            net.conv.stride = (2,)
        else:
            old = net.conv
            net.conv = nn.Conv1d(2, 3, 3, padding=1).double()
            net.conv.load_state_dict(old.state_dict())
        ghost_sums, _ = clipped_grad_sum(net, params, batch, mask, 0.5, method="ghost")
        vmap_sums, _ = clipped_grad_sum(net, params, batch, mask, 0.5, method="vmap")
        for k in vmap_sums:
            torch.testing.assert_close(ghost_sums[k], vmap_sums[k], rtol=1e-10, atol=1e-12)
