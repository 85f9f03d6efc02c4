"""Batched augmentations (trustfl.selfsup.augment): determinism per (seed, round, client), shapes, value ranges,
each operation against a hand-written per-image version, and the cohort variant."""
from __future__ import annotations

import pytest
import torch

from trustfl.errors import ConfigError
from trustfl.selfsup import Augmentation, make_views, make_views_cohort, view_generator

OFF = dict(shift=0, brightness=(1.0, 1.0), contrast=(1.0, 1.0), dropout=0.0, noise_std=0.0, flip=False)


def _images(n: int = 6, c: int = 3, h: int = 8, w: int = 7, dtype=torch.float32) -> torch.Tensor:
    return torch.rand(n, c, h, w, generator=torch.Generator().manual_seed(0), dtype=dtype)


def test_views_are_deterministic_for_a_seed_round_and_client():
    x = _images()
    a = make_views(x, 3, view_generator(5, 2, 1, x.device))
    b = make_views(x, 3, view_generator(5, 2, 1, x.device))
    assert torch.equal(a, b)


@pytest.mark.parametrize("other", [(5, 2, 2), (5, 3, 1), (6, 2, 1)])
def test_views_differ_across_clients_rounds_and_seeds(other):
    x = _images()
    a = make_views(x, 2, view_generator(5, 2, 1, x.device))
    b = make_views(x, 2, view_generator(*other, x.device))
    assert not torch.equal(a, b)


def test_views_of_one_image_differ_and_shapes_dtypes_devices_are_kept():
    for dtype in (torch.float32, torch.float64):
        x = _images(dtype=dtype)
        v = make_views(x, 4, view_generator(0, 0, 0, x.device), Augmentation(flip=True, contrast=(0.8, 1.2)))
        assert v.shape == (6, 4, 3, 8, 7) and v.dtype == dtype and v.device == x.device
        assert torch.isfinite(v).all()
        assert not torch.equal(v[:, 0], v[:, 1])


def test_values_are_sane():
    x = _images(n=64)
    v = make_views(x, 2, view_generator(0, 0, 0, x.device))
    # brightness <= 1.3, noise std 0.1: |v| stays well inside 1.3 + 6 std
    assert float(v.abs().max()) < 1.3 + 0.6
    # E[view] = E[x]·(kept rows)·(kept cols)·(1 − dropout): a shift d ∈ {−2..2} keeps 8 − |d| of 8 rows
    kept = (34 / 40) * (29 / 35) * 0.8
    assert abs(float(v.mean()) - float(x.mean()) * kept) < 0.02
    assert 0.05 < float(v.std()) < 1.0


def test_all_operations_off_is_the_identity():
    x = _images()
    assert torch.equal(make_views(x, 2, torch.Generator(), Augmentation(**OFF)), x.unsqueeze(1).expand(-1, 2, -1,
                                                                                                       -1, -1))


def test_shift_matches_a_per_image_crop_of_the_padded_image():
    x = _images()
    aug = Augmentation(**{**OFF, "shift": 2})
    params = aug.draw(6, x.shape[1:], torch.Generator().manual_seed(3), x.device, x.dtype)
    out = aug.apply(x, params)
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    for n in range(6):
        dy, dx = params["offset"][n].tolist()
        assert torch.equal(out[n], padded[n, :, dy:dy + 8, dx:dx + 7])
    assert int(params["offset"].min()) >= 0 and int(params["offset"].max()) <= 4


def _objects(n: int, side: int, seed: int) -> torch.Tensor:
    """Blank ``side``×``side`` canvases, each with a random 3×2 block of ones somewhere inside (one all blank)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.zeros(n, 1, side, side, dtype=torch.float64)
    for i in range(1, n):
        r = torch.randint(0, side - 2, (1,), generator=g).item()
        c = torch.randint(0, side - 1, (1,), generator=g).item()
        x[i, 0, r:r + 3, c:c + 2] = torch.rand(3, 2, generator=g, dtype=torch.float64) + 0.5
    return x


def test_keeping_shift_never_cuts_content_and_reaches_every_allowed_translation():
    side, s = 7, 2
    x = _objects(400, side, 0)
    aug = Augmentation(**{**OFF, "shift": s, "shift_mode": "keep"})
    out = aug(x, torch.Generator().manual_seed(4))
    assert torch.equal(out[0], x[0])                                     # a blank image stays put
    seen: dict[int, set] = {}
    for n in range(1, 400):
        src, dst = x[n, 0].nonzero(), out[n, 0].nonzero()
        assert len(dst) == len(src) and torch.equal(out[n].flatten().sort().values, x[n].flatten().sort().values)
        dy, dx = (dst[0] - src[0]).tolist()
        assert torch.equal(torch.roll(x[n], (dy, dx), dims=(1, 2)), out[n])       # a pure translation
        top, left = src.min(0).values.tolist()
        bottom, right = src.max(0).values.tolist()
        lo_y, hi_y, lo_x, hi_x = max(-top, -s), min(side - 1 - bottom, s), max(-left, -s), min(side - 1 - right, s)
        assert lo_y <= dy <= hi_y and lo_x <= dx <= hi_x
    # an object with room on every side reaches all (2s+1)² translations, one in a corner only the inward ones
    for corner, expected in (((2, 2), range(-2, 3)), ((0, 0), range(0, 3))):
        block = torch.zeros(500, 1, side, side)
        block[:, 0, corner[0]:corner[0] + 3, corner[1]:corner[1] + 2] = 1.0
        moved = aug(block, torch.Generator().manual_seed(6))[:, 0].nonzero()
        first = moved.view(500, 6, 3)[:, 0]                              # each image's first pixel (row-major)
        got = {(r - corner[0], c - corner[1]) for r, c in first[:, 1:].tolist()}
        assert got == {(a, b) for a in expected for b in expected}


def test_keeping_shift_is_uniform_over_the_allowed_translations():
    x = torch.zeros(6000, 1, 9, 9)
    x[:, 0, 3:6, 3:6] = 1.0                                               # room for ±2 (capped) and more
    out = Augmentation(**{**OFF, "shift": 2, "shift_mode": "keep"})(x, torch.Generator().manual_seed(5))
    rows = out[:, 0].sum(2).argmax(1) - 3                                 # first occupied row − 3 = dy
    counts = torch.bincount(rows + 2, minlength=5).double()
    assert counts.shape == (5,) and float((counts / 6000 - 0.2).abs().max()) < 0.02


def test_brightness_contrast_flip_dropout_noise_match_their_formulas():
    x = _images()
    g = torch.Generator().manual_seed(1)
    aug = Augmentation(shift=0, brightness=(0.5, 1.5), contrast=(0.6, 1.4), dropout=0.3, noise_std=0.2, flip=True)
    p = aug.draw(6, x.shape[1:], g, x.device, x.dtype)
    out = aug.apply(x, p)
    for n in range(6):
        ref = x[n] * p["brightness"][n]
        ref = (ref - ref.mean()) * p["contrast"][n] + ref.mean()
        ref = ref.flip(-1) if bool(p["flip"][n]) else ref
        ref = ref * p["keep"][n].to(ref.dtype) + p["noise"][n]
        torch.testing.assert_close(out[n], ref)
    assert 0.5 <= float(p["brightness"].min()) and float(p["brightness"].max()) <= 1.5
    keep_rate = float(Augmentation(**{**OFF, "dropout": 0.3}).draw(
        2000, (1, 8, 8), g, x.device, x.dtype)["keep"].float().mean())
    assert abs(keep_rate - 0.7) < 0.01


def test_cohort_variant_equals_per_client_calls():
    xs = torch.rand(3, 5, 2, 6, 6, generator=torch.Generator().manual_seed(2))
    gens = [view_generator(1, 4, j, xs.device) for j in range(3)]
    out = make_views_cohort(xs, 2, gens, Augmentation(flip=True))
    assert out.shape == (3, 5, 2, 2, 6, 6)
    for j in range(3):
        ref = make_views(xs[j], 2, view_generator(1, 4, j, xs.device), Augmentation(flip=True))
        assert torch.equal(out[j], ref)


@pytest.mark.parametrize("kwargs, key", [({"shift": -1}, "shift"), ({"dropout": 1.0}, "dropout"),
                                         ({"brightness": (1.2, 0.8)}, "brightness"),
                                         ({"noise_std": -0.1}, "noise_std"), ({"contrast": (1.0,)}, "contrast"),
                                         ({"shift_mode": "wrap"}, "shift_mode")])
def test_bad_parameters_are_config_errors_naming_the_argument(kwargs, key):
    with pytest.raises(ConfigError, match=key):
        Augmentation(**kwargs)


@pytest.mark.parametrize("kwargs, key", [({"noise_std": 1e300}, "noise_std"),
                                         ({"brightness": (1.0, 1e39)}, "brightness"),
                                         ({"contrast": (1e31, 1e31)}, "contrast"),
                                         ({"brightness": (True, True)}, "brightness"),
                                         ({"contrast": ("1", "2")}, "contrast")])
def test_factors_float32_cannot_carry_are_refused(kwargs, key):
    """1e300 was inf in the float32 views: every client's loss NaN, every message rejected; a bool or a string was
    taken through float()."""
    with pytest.raises(ConfigError, match=rf"`{key}` must be a number in \[0, 1e\+30\] \(the views are float32\)"):
        Augmentation(**kwargs)


def test_largest_factors_give_finite_views():
    x = torch.rand(4, 1, 8, 8)
    for kwargs in ({"noise_std": 1e30}, {"brightness": (1e30, 1e30)}, {"contrast": (1e30, 1e30)}):
        aug = Augmentation(**kwargs)
        assert bool(torch.isfinite(make_views(x, 2, view_generator(0, 0, 0), aug)).all()), kwargs


def test_bad_inputs_are_config_errors():
    with pytest.raises(ConfigError, match="`x`"):
        make_views(torch.zeros(2, 8, 8), 2, torch.Generator())
    with pytest.raises(ConfigError, match="`x`"):
        make_views(torch.zeros(2, 1, 8, 8, dtype=torch.long), 2, torch.Generator())
    with pytest.raises(ConfigError, match="num_views"):
        make_views(torch.zeros(2, 1, 8, 8), 0, torch.Generator())
    with pytest.raises(ConfigError, match="generators"):
        make_views_cohort(torch.zeros(2, 3, 1, 4, 4), 2, [torch.Generator()])


@pytest.mark.parametrize("views", [2, 5])
def test_views_argument_reads_each_image_once_and_changes_no_view(views):
    """``apply(..., views=V)`` on V copies of each image in a row (make_views' layout) computes the keeping shift's
    bounds from one copy per image; the views are bitwise those of ``views=1``, whichever copy sits where."""
    x = _objects(7, 9, seed=4).to(torch.float32)
    flat = x.repeat_interleave(views, dim=0)
    aug = Augmentation(shift=3, shift_mode="keep", contrast=(0.5, 1.5), flip=True)
    params = aug.draw(flat.shape[0], x.shape[1:], torch.Generator().manual_seed(5), x.device, x.dtype)
    once = aug.apply(flat, params, views)
    assert once.view(torch.int32).equal(aug.apply(flat, params).view(torch.int32))
    assert not once.equal(aug.apply(x.repeat(views, 1, 1, 1), params, views))  # copies must sit in a row
    with pytest.raises(ConfigError, match="`views`"):
        aug.apply(flat[1:], {k: v[1:] for k, v in params.items()}, views)
