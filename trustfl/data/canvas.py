"""``digits_canvas``: scikit-learn's 8×8 digits pasted at a random position into a larger blank canvas.

A small image data set on which self-supervised learning has something to learn (the FedSC paper's validated small
setting): on plain 8×8 digits a linear probe on a *random* network already reaches ≈ 96 %, while a random
translation inside a 10×10 canvas breaks pixel alignment, so learned, translation-robust features pay off.

Each image x/16 ∈ [0, 1] is pasted at an offset drawn uniformly from {0..S−8}² (S the canvas side) into zeros; the
offsets and the stratified train/test split (``test_fraction``, 30 % by default) are drawn from ``seed`` alone.
Inputs are ``(1, S, S)`` float32 images; labels are the digits (10 classes).
"""
from __future__ import annotations

import numpy as np
import torch

from trustfl.core.checks import check_number
from trustfl.core.registry import register
from trustfl.core.rng import numpy_rng
from trustfl.data.datasets import Dataset, _limit, _stratified_choice, digits_arrays


def paste(images: np.ndarray, side: int, rng: np.random.Generator) -> np.ndarray:
    """``images`` ``(N, h, w)`` pasted at uniformly random offsets into zero canvases ``(N, side, side)``."""
    n, h, w = images.shape
    out = np.zeros((n, side, side), dtype=np.float32)
    rows = rng.integers(0, side - h + 1, size=n)
    cols = rng.integers(0, side - w + 1, size=n)
    for i in range(n):
        out[i, rows[i]:rows[i] + h, cols[i]:cols[i] + w] = images[i]
    return out


@register("dataset", "digits_canvas")
def digits_canvas(data_dir: str | None = None, seed: int = 0, *, canvas: int = 10, test_fraction: float = 0.3,
                  max_train: int | None = None, max_test: int | None = None) -> Dataset:
    """1,797 digits in ``canvas``×``canvas`` images (``canvas`` >= 8), stratified split; ``data_dir`` is unused."""
    check_number("canvas", canvas, integer=True, low=8)
    check_number("test_fraction", test_fraction, low=0, high=1, low_open=True, high_open=True)
    pixels, labels = digits_arrays()
    y = labels.astype(np.int64)
    images = pixels.reshape(-1, 8, 8)  # load_digits' ``images``
    x = paste(images.astype(np.float32) / 16.0, canvas, numpy_rng(seed, "dataset", "digits_canvas", "paste"))
    test = _stratified_choice(y, round(test_fraction * len(y)), numpy_rng(seed, "dataset", "digits_canvas", "split"))
    train = np.setdiff1d(np.arange(len(y)), test)
    x_tr, y_tr, x_te, y_te = x[train], y[train], x[test], y[test]
    if (sub := _limit("digits_canvas", "max_train", max_train, y_tr, seed)) is not None:
        x_tr, y_tr = x_tr[sub], y_tr[sub]
    if (sub := _limit("digits_canvas", "max_test", max_test, y_te, seed)) is not None:
        x_te, y_te = x_te[sub], y_te[sub]
    return Dataset(name="digits_canvas", train_x=torch.from_numpy(x_tr[:, None].copy()),
                   train_y=torch.from_numpy(y_tr), test_x=torch.from_numpy(x_te[:, None].copy()),
                   test_y=torch.from_numpy(y_te), input_shape=(1, canvas, canvas), num_classes=10,
                   source=f"scikit-learn load_digits (bundled) pasted into {canvas}x{canvas} canvases")
