"""The ``image_folder`` data set (your own images, one sub-folder per class, read from ``data.path``); see
:mod:`trustfl.data.own` for the shared rules on the test split and standardisation."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trustfl.core.registry import register
from trustfl.data.datasets import Dataset
from trustfl.data.own import _Arrays, _build, _check_options, _exists, _where, resolve_path
from trustfl.data.own_targets import _list
from trustfl.errors import ConfigError, DataError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
"""File endings read by ``image_folder`` (any case); other files are ignored."""
MAX_SIZE = 4096
"""The largest image side ``image_folder`` resizes to."""


def _image_files(folder: Path) -> list[Path]:
    return sorted(f for f in folder.iterdir() if f.is_file() and not f.name.startswith(".")
                  and f.suffix.lower() in IMAGE_SUFFIXES)


def _class_folders(root: Path, skip: str | None) -> list[Path]:
    return sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".") and d.name != skip)


def _read_images(files: list[Path], size: tuple[int, int], channels: int) -> np.ndarray:
    try:
        from PIL import Image
    except ImportError:
        raise DataError("data set 'image_folder' needs the package `Pillow` to read images, and it is not "
                        "installed; run `pip install pillow`.") from None
    mode = "L" if channels == 1 else "RGB"
    h, w = size
    out = np.empty((len(files), h, w, channels), dtype=np.uint8)
    for i, f in enumerate(files):
        try:
            with Image.open(f) as im:
                im = im.convert(mode)
                if im.size != (w, h):
                    im = im.resize((w, h), Image.Resampling.BILINEAR)
                out[i] = np.asarray(im, dtype=np.uint8).reshape(h, w, channels)
        except Exception as err:  # Pillow raises UnidentifiedImageError, OSError, DecompressionBombError, ...
            raise DataError(f"cannot read image {str(f)!r}: {err}; image_folder reads PNG and JPEG files.") from None
    return out


@register("dataset", "image_folder")
def image_folder(data_dir: str | None = None, seed: int = 0, *, path: str | None = None,
                 size: int | Sequence[int] = (28, 28), channels: int = 1, test_folder: str | None = None,
                 test_fraction: float | None = None, standardize: bool = True) -> Dataset:
    """A folder of images, one sub-folder per class (the sub-folder names, sorted, are the classes).

    Layout: ``path/<class>/*.png|jpg|jpeg`` and optionally ``path/<test_folder>/<class>/...`` (or
    ``path/train/<class>/...`` beside ``path/<test_folder>/<class>/...``) for the test split; without a test
    folder a seeded stratified ``test_fraction`` (default 0.2) is held out. ``test_folder`` defaults to ``test``
    (used when it is there); a ``test_folder`` you set must exist, and must not be ``path`` itself or a folder
    holding it (that would test on the training images). Files with other endings and hidden
    files are ignored. Every image is converted to grey (``channels = 1``) or RGB (``channels = 3``), resized to
    ``size`` (``[height, width]`` or one int; default 28×28) and scaled to [0, 1]; ``standardize`` then scales
    each channel with the training images' mean and std. Tensors are (N, channels, height, width).
    ``data_dir`` is unused.
    """
    p = resolve_path("image_folder", path)
    fraction = _check_options("image_folder", test_fraction=test_fraction, standardize=standardize)
    if isinstance(size, int) and not isinstance(size, bool):
        size = (size, size)
    if not (isinstance(size, (list, tuple)) and len(size) == 2
            and all(isinstance(s, int) and not isinstance(s, bool) and 1 <= s <= MAX_SIZE for s in size)):
        raise ConfigError(f"`size` of data set 'image_folder' must be an int or [height, width], each in "
                          f"[1, {MAX_SIZE}], found {size!r}.")
    size = (int(size[0]), int(size[1]))
    if channels not in (1, 3) or isinstance(channels, bool):
        raise ConfigError(f"`channels` of data set 'image_folder' must be 1 (grey) or 3 (RGB), found {channels!r}.")
    explicit = test_folder is not None
    if test_folder is None:
        test_folder = "test"
    if not isinstance(test_folder, str):
        raise ConfigError(f"`test_folder` of data set 'image_folder' must be a folder name (\"\": none), found "
                          f"{test_folder!r}.")
    where = _where(p, path)
    _exists(p, where, "image folder")
    if not p.is_dir():
        raise DataError(f"image folder {where} is not a directory; expected one sub-folder of images per class.")
    test_root = p / test_folder if test_folder and (p / test_folder).is_dir() else None
    if explicit and test_folder and test_root is None:
        raise ConfigError(f"`data.options.test_folder` = {test_folder!r}: {str(p / test_folder)!r} is not a folder "
                          f"(the test folder is read inside `data.path`); fix it, or drop the key for a seeded "
                          f"`test_fraction` split.")
    train_root = p / "train" if test_root is not None and (p / "train").is_dir() else p
    if test_root is not None:
        tested, trained = test_root.resolve(), train_root.resolve()
        if tested == trained or tested in trained.parents:
            raise ConfigError(f"`data.options.test_folder` = {test_folder!r} is the training image folder "
                              f"{str(trained)!r} or holds it: the test set would be the training images; name a "
                              f"sub-folder of separate test images, or drop the key for a seeded `test_fraction` "
                              f"split.")
    class_dirs = _class_folders(train_root, test_folder if train_root == p else None)
    if not class_dirs:
        raise DataError(f"image folder {where} has no class sub-folders; expected {train_root}/<class>/<image>.png "
                        f"(one sub-folder per class).")
    classes = [d.name for d in class_dirs]

    def gather(dirs: list[Path]) -> tuple[list[Path], list[int]]:
        files, labels = [], []
        for d in dirs:
            found = _image_files(d)
            if not found:
                raise DataError(f"class folder {str(d)!r} holds no images (files ending in "
                                f"{', '.join(IMAGE_SUFFIXES)}); every class needs at least one.")
            files += found
            labels += [classes.index(d.name)] * len(found)
        return files, labels

    files, labels = gather(class_dirs)
    metadata: dict[str, Any] = {"size": list(size), "channels": channels}
    if test_root is not None:
        test_dirs = _class_folders(test_root, None)
        unknown = [d.name for d in test_dirs if d.name not in classes]
        if unknown:
            raise DataError(f"test folder {str(test_root)!r} has class folder(s) {_list([repr(u) for u in unknown])} "
                            f"that the training images do not have (classes: {_list([repr(c) for c in classes], 20)}).")
        if not test_dirs:
            raise DataError(f"test folder {str(test_root)!r} has no class sub-folders; expected "
                            f"{test_root}/<class>/<image>.png.")
        test_files, test_labels = gather(test_dirs)
    x = _read_images(files, size, channels).transpose(0, 3, 1, 2).astype(np.float32) / np.float32(255)
    a = _Arrays(x=x, y_raw=np.array(labels, dtype=np.int64), row=lambda i: str(files[i]), y_name="labels",
                standardize_axes=(0, 2, 3), class_names=classes)
    if test_root is not None:
        a.x_test = _read_images(test_files, size, channels).transpose(0, 3, 1, 2).astype(np.float32) / np.float32(255)
        a.y_test_raw, a.test_row = np.array(test_labels, dtype=np.int64), (lambda i: str(test_files[i]))
    return _build("image_folder", "image folder", p, where, a, seed, task="classification", test_fraction=fraction,
                  standardize=standardize, standardize_target=False, metadata=metadata)
