"""trustfl.core.finite agrees with torch.isfinite on every floating dtype, layout and placement of NaN/±inf."""
import pytest
import torch

from trustfl.core.finite import all_finite, finite_rows

SPECIAL = (float("nan"), float("inf"), -float("inf"), 3.4e38, -3.4e38, -0.0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_rows_and_whole_agree_with_isfinite(dtype, device):
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        n, d = (int(torch.randint(1, 7, (1,), generator=g)), int(torch.randint(1, 90, (1,), generator=g)))
        x = torch.randn(n, d, generator=g) * 10.0 ** float(torch.randint(0, 38, (1,), generator=g))
        for _ in range(int(torch.randint(0, 4, (1,), generator=g))):
            i, j = int(torch.randint(0, n, (1,), generator=g)), int(torch.randint(0, d, (1,), generator=g))
            x[i, j] = SPECIAL[int(torch.randint(0, len(SPECIAL), (1,), generator=g))]
        x = x.to(device=device, dtype=dtype)
        for y in (x, x.t().contiguous().t()):  # row-major and column-major storage
            expected = torch.isfinite(y).all(dim=1)
            assert torch.equal(finite_rows(y), expected)
            assert all_finite(y) == bool(expected.all())


def test_every_row_kind_is_classified():
    x = torch.zeros(5, 3)
    x[1, 2], x[2, 0], x[3, 1], x[4, 0] = float("nan"), float("inf"), -float("inf"), torch.finfo(torch.float32).max
    assert finite_rows(x).tolist() == [True, False, False, False, True]
    assert not all_finite(x) and all_finite(x[[0, 4]])


def test_empty_and_non_floating_tensors():
    assert finite_rows(torch.zeros(3, 0)).tolist() == [True, True, True]
    assert finite_rows(torch.zeros(0, 4)).tolist() == []
    assert finite_rows(torch.ones(2, 3, dtype=torch.long)).tolist() == [True, True]
    assert all_finite(torch.zeros(0)) and all_finite(torch.arange(4))
