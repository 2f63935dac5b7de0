"""Nonsense crop and decode parameters are refused where they are given, in one line that names the
parameter, the value and the valid range; sensible ones (the edges of each range included) work."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from packload import PackedImageFolder, PackLoader, pack
from packload.core.errors import UsageError
from packload.loaders.crop import MIN_CENTER_RATIO, CenterCrop
from packload.loaders.params import MAX_CROP_SIDE, check_batch_memory
from packload.loaders.random_crop import MIN_RATIO, RandomResizedCrop
from tests.image_factory import make_image_folder

NAN, INF = math.nan, math.inf
BAD_SIDES = [0, -1, -224, 2**31, 10**6, 2**63, MAX_CROP_SIDE + 1, True, False, 224.0, 224.5, NAN, INF, "224",
             None, (224, 224), np.float64(224.0)]


def _one_line(error: pytest.ExceptionInfo[BaseException], *words: str) -> None:
    text = str(error.value)
    assert "\n" not in text and isinstance(error.value, UsageError) and isinstance(error.value, ValueError)
    for word in words:
        assert word in text, (word, text)


@pytest.mark.parametrize("size", BAD_SIDES, ids=repr)
def test_sizes(size: Any) -> None:
    for kind in (CenterCrop, RandomResizedCrop):
        with pytest.raises(UsageError) as error:
            kind(size)
        _one_line(error, f"{kind.__name__} size", "1..65535", repr(size))


@pytest.mark.parametrize("scale", [(2, 3), (0.1, INF), (0, 1), (-0.5, 1), (0.5, 0.4), (0.5, 1.01), (NAN, 1),
                                   (0.5, NAN), (INF, INF), (-INF, 1), 0.5, "0.5,1", (0.1,), (0.1, 0.5, 1),
                                   (True, 1), ("a", 1), None], ids=repr)
def test_random_scale(scale: Any) -> None:
    with pytest.raises(UsageError) as error:
        RandomResizedCrop(32, scale=scale)
    _one_line(error, "RandomResizedCrop scale", "0 < low <= high <= 1")


@pytest.mark.parametrize("ratio", [(INF, INF), (0, 1), (-1, 1), (1, 0.5), (NAN, 1), (1, NAN), (1e-9, 1),
                                   (1, 1e9), (0.5, INF), 2.0, (False, 1), (1, "2"), None], ids=repr)
def test_random_ratio(ratio: Any) -> None:
    with pytest.raises(UsageError) as error:
        RandomResizedCrop(32, ratio=ratio)
    _one_line(error, "RandomResizedCrop ratio", "1e-6 <= low <= high <= 1e6")


@pytest.mark.parametrize("flip", [NAN, INF, -0.1, 1.5, "yes", None], ids=repr)
def test_random_flip(flip: Any) -> None:
    with pytest.raises(UsageError) as error:
        RandomResizedCrop(32, flip=flip)
    _one_line(error, "flip", "[0, 1]")


def test_random_dct_scale_is_a_bool() -> None:
    with pytest.raises(UsageError) as error:
        RandomResizedCrop(32, dct_scale="no")
    _one_line(error, "dct_scale", "True or False")


@pytest.mark.parametrize("ratio", [1e-9, 0, -0.5, 1.0001, 2, NAN, INF, -INF, True, "0.875", None,
                                   MIN_CENTER_RATIO * 0.99], ids=repr)
def test_center_ratio(ratio: Any) -> None:
    with pytest.raises(UsageError) as error:
        CenterCrop(32, ratio=ratio)
    _one_line(error, "CenterCrop ratio", "[1/64, 1]")


def test_edges_of_each_range_work() -> None:
    """The bounds themselves are accepted, and numbers of NumPy's types are taken as numbers."""
    image = np.arange(40 * 50 * 3, dtype=np.uint8).reshape(40, 50, 3)
    for crop in (CenterCrop(1), CenterCrop(np.int64(16), ratio=MIN_CENTER_RATIO), CenterCrop(16, ratio=1),
                 CenterCrop(16, ratio=np.float32(0.5))):
        assert crop(image).shape == (crop.size, crop.size, 3)
        assert type(crop.size) is int and type(crop.ratio) is float
    for crop in (RandomResizedCrop(8, scale=(1, 1)), RandomResizedCrop(8, scale=(1e-9, 1e-9)),
                 RandomResizedCrop(8, ratio=(MIN_RATIO, MIN_RATIO)), RandomResizedCrop(8, ratio=(1 / MIN_RATIO,) * 2),
                 RandomResizedCrop(8, scale=[0.5, 1], ratio=[1, 1]), RandomResizedCrop(np.int32(8))):
        with np.errstate(all="raise"):  # no overflow, no invalid cast at the extremes
            out = crop(image, index=3)
        assert out.shape == (8, 8, 3)
        top, left, height, width = crop.box(40, 50, 3)
        assert 0 <= top and 0 <= left and 1 <= height <= 40 - top and 1 <= width <= 50 - left
    assert CenterCrop(MAX_CROP_SIDE).size == RandomResizedCrop(MAX_CROP_SIDE).size == MAX_CROP_SIDE


@pytest.fixture(scope="module")
def small_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("crop_params")
    make_image_folder(root / "src", classes=("a", "b"), per_class=3)
    pack(root / "src", root / "p.shards", workers=1, progress=False)
    return root / "p.shards"


@pytest.mark.parametrize("size", [(-1, -1), (NAN, NAN), (2**63, 1), (0, 32), (32, 0), (1 << 25, 32), (32.0, 32),
                                  (True, 32), 224, "224", (224,), (1, 2, 3), (224, None)], ids=repr)
def test_decode_size(small_pack: Path, size: Any) -> None:
    with pytest.raises(UsageError) as error:
        PackedImageFolder(small_pack, decode_size=size)
    _one_line(error, "decode_size", "1..16777216")


def test_decode_size_in_range_works(small_pack: Path) -> None:
    for size in ((1, 1), [16, 24], (np.int64(32), 32), (1 << 24, 1 << 24), None):
        ds = PackedImageFolder(small_pack, output="numpy", decode_size=size)
        assert ds[0][0].ndim == 3
        assert ds.decode_size is None or all(type(side) is int for side in ds.decode_size)


@pytest.mark.parametrize("crop", ["str", 224.0, True, object(), (224, 224), torch.nn.Identity(), 0, -5, 10**6],
                         ids=repr)
def test_crop_arguments(small_pack: Path, crop: Any) -> None:
    ds = PackedImageFolder(small_pack)
    with pytest.raises(UsageError) as error:
        PackLoader(ds, 2, crop=crop)
    _one_line(error, "crop")
    if not isinstance(crop, int) or isinstance(crop, bool):  # get_batch takes crop objects only
        with pytest.raises(UsageError) as error:
            ds.get_batch([0, 1], crop=crop)
        _one_line(error, "crop must be a packload CenterCrop or RandomResizedCrop", repr(crop)[:20])


def test_crop_arguments_that_work(small_pack: Path) -> None:
    ds = PackedImageFolder(small_pack)
    for crop in (16, CenterCrop(16), RandomResizedCrop(16), None):
        loader = PackLoader(ds, 2, crop=crop, threads=0)
        if crop is None:
            continue
        batch, labels = next(iter(loader))
        assert batch.shape == (2, 3, 16, 16) and labels.shape == (2,)


def test_a_batch_larger_than_memory_is_one_line(small_pack: Path) -> None:
    """Within the side's bound, a batch too large for the machine is refused before torch allocates it."""
    ds = PackedImageFolder(small_pack)
    with pytest.raises(UsageError) as error:
        PackLoader(ds, 4096, crop=CenterCrop(MAX_CROP_SIDE))
    _one_line(error, "crop size 65535", "batch of 4096", "GiB")
    with pytest.raises(UsageError) as error:
        ds.get_batch(list(range(6)) * 1000, crop=RandomResizedCrop(MAX_CROP_SIDE))
    _one_line(error, "crop size 65535", "batch of 6000")
    check_batch_memory(256, 224, "crop size")  # an ordinary batch is not even measured
