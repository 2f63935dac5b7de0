"""One route for cropped batches (``loaders/crop_fill.py``): ``CenterCrop`` and ``RandomResizedCrop``
batches decoded only over each crop are the batches of whole-image decoding; a JPEG whose header
disagrees with the index is refused the same way on every route; and where no libjpeg-turbo can be
bound, raw records still take the batch call and JPEGs come out one by one, the same pixels."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from packload import CenterCrop, EncodeOptions, PackedImageFolder, PackLoader, RandomResizedCrop, pack
from packload.core import jpeg_kernel
from packload.core.errors import PackFormatError
from packload.loaders.decode import fast_jpeg_available
from packload.loaders.random_crop import Draws
from tests.image_factory import textured_rgb
from tests.reliability.crafted import index_with, rewrite

needs_decoder = pytest.mark.skipif(not jpeg_kernel.available() or not fast_jpeg_available(),
                                   reason=f"compiled batch decoder not in use: {jpeg_kernel.unavailable_reason()}")
CROPS = [CenterCrop(48), CenterCrop(200, ratio=1.0), RandomResizedCrop(40, flip=0.5),
         RandomResizedCrop(64, scale=(0.5, 1.0), flip=1.0), RandomResizedCrop(32, dct_scale=False)]


def _jpeg(size: tuple[int, int], seed: int, **options: object) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(textured_rgb(size, seed)).save(buffer, "JPEG", quality=88, **options)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A keep pack of JPEGs of many kinds and sizes (large ones decode at reduced scales), a PNG, and
    a raw pack of the same images."""
    root = tmp_path_factory.mktemp("crop-fill")
    kinds = [((640, 480), {"subsampling": 2}), ((333, 517), {"subsampling": 1}), ((256, 256), {"subsampling": 0}),
             ((401, 299), {"progressive": True}), ((300, 220), {"restart_marker_blocks": 3}), ((61, 47), {}),
             ((7, 5), {})]
    for k, (size, options) in enumerate(kinds * 2):
        folder = root / "images" / ("a" if k % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{k:02d}.jpg").write_bytes(_jpeg(size, k, **options))
    Image.fromarray(textured_rgb((90, 70), 99)).convert("L").save(root / "images" / "a" / "grey.jpg", quality=90)
    Image.fromarray(textured_rgb((120, 80), 98)).save(root / "images" / "b" / "plain.png")
    pack(root / "images", root / "p.shards", options=EncodeOptions(encoding="keep"), workers=1, progress=False)
    return root


def _batch(ds: PackedImageFolder, crop: object, epoch: int = 0) -> torch.Tensor:
    return ds.get_batch(np.arange(len(ds)), True, crop=crop, flip=getattr(crop, "flip", 0.0),
                        draws=Draws(seed=1, epoch=epoch))[0]


@needs_decoder
@pytest.mark.parametrize("crop", CROPS, ids=repr)
def test_decoding_only_the_crop_gives_the_whole_decodes_batch(photos: Path, crop: object) -> None:
    ds = PackedImageFolder(photos / "p.shards")
    for epoch in (0, 1):
        first = _batch(ds, crop, epoch)
        jpeg_kernel.set_crop_first(False)
        try:
            whole = _batch(ds, crop, epoch)
        finally:
            jpeg_kernel.set_crop_first(True)
        jpeg_kernel.set_enabled(False)
        try:
            one_by_one = _batch(ds, crop, epoch)
        finally:
            jpeg_kernel.set_enabled(True)
        assert torch.equal(first, whole) and torch.equal(first, one_by_one), crop


@needs_decoder
def test_without_a_libjpeg_raw_records_still_take_the_batch_call(photos: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    raw = tmp_path / "raw.shards"
    pack(photos / "images", raw, options=EncodeOptions(encoding="raw"), workers=1, progress=False)
    keep, raw_ds = PackedImageFolder(photos / "p.shards"), PackedImageFolder(raw)
    crop = RandomResizedCrop(48, flip=0.5)
    done: list[int] = []
    real = jpeg_kernel.decode_boxes

    def counting(*args: object, **kwargs: object) -> np.ndarray:
        result = real(*args, **kwargs)
        done.append(int(result.sum()))
        return result

    monkeypatch.setattr(jpeg_kernel, "decode_boxes", counting)
    want_keep, want_raw = _batch(keep, crop), _batch(raw_ds, crop)
    raw_done = done[-1]
    assert raw_done > 0
    monkeypatch.setattr(jpeg_kernel, "_state", {})
    monkeypatch.setattr(jpeg_kernel, "_candidates", lambda: [])  # no libjpeg-turbo anywhere
    done.clear()
    assert not jpeg_kernel.available() and jpeg_kernel.raw_available()
    assert torch.equal(_batch(keep, crop), want_keep)
    assert done == [], "no JPEG goes to the batch call without a library"
    assert torch.equal(_batch(raw_ds, crop), want_raw)
    assert done == [raw_done], "the same raw boxes resized in the batch call"


def _mismatched(photos: Path, tmp_path: Path, stored: tuple[int, int]) -> tuple[PackedImageFolder, int]:
    """A copy of the pack whose index gives one JPEG the size ``stored`` (width, height), not its own."""
    import shutil

    copy = tmp_path / "p.shards"
    shutil.copytree(photos / "p.shards", copy)
    ds = PackedImageFolder(copy)
    record = next(k for k in range(len(ds)) if ds.path(k).endswith("00.jpg"))  # 640x480, 4:2:0
    rewrite(copy, index=index_with(copy, width=(record, stored[0]), height=(record, stored[1])))
    return PackedImageFolder(copy), record


@pytest.mark.parametrize("stored", [(320, 240), (1280, 960), (640, 479)], ids=str)
@pytest.mark.parametrize("crop", [CenterCrop(64), RandomResizedCrop(64, flip=0.5)], ids=repr)
def test_a_header_that_is_not_the_indexs_size_is_refused_on_every_route(photos: Path, tmp_path: Path,
                                                                       stored: tuple[int, int],
                                                                       crop: object) -> None:
    ds, record = _mismatched(photos, tmp_path, stored)
    indices = np.arange(len(ds))
    routes = {"batch decoder": (True, True), "one by one": (False, True), "PIL": (False, False)}
    said = rf"{ds.path(record)}.*the index says {stored[0]}x{stored[1]}"
    for route, (compiled, fast) in routes.items():
        jpeg_kernel.set_enabled(compiled)
        ds.fast_jpeg = fast
        try:
            with pytest.raises(PackFormatError, match=said):
                ds.get_batch(indices, True, crop=crop)
                pytest.fail(f"the {route} route took it")
        finally:
            jpeg_kernel.set_enabled(True)
            ds.fast_jpeg = True
    with pytest.raises(PackFormatError, match=said):
        with PackLoader(ds, 4, crop=crop, threads=2) as loader:
            list(loader)
    with pytest.raises(PackFormatError, match=said):
        PackedImageFolder(tmp_path / "p.shards", transform=crop)[record]


def test_skipping_damaged_records_skips_a_mismatched_one_alike_on_every_route(photos: Path, tmp_path: Path) -> None:
    ds, record = _mismatched(photos, tmp_path, (320, 240))
    skipping = PackedImageFolder(tmp_path / "p.shards", on_error="skip")
    crop = CenterCrop(40)
    batches = []
    for compiled in (True, False):
        jpeg_kernel.set_enabled(compiled)
        try:
            with pytest.warns(UserWarning, match="skipping damaged"):
                batches.append(skipping.get_batch(np.arange(len(ds)), True, crop=crop))
        finally:
            jpeg_kernel.set_enabled(True)
    (first, first_labels), (second, second_labels) = batches
    assert torch.equal(first, second) and torch.equal(first_labels, second_labels)
    assert torch.equal(first[record], first[(record + 1) % len(ds)]), "the next intact record took its place"


@pytest.mark.parametrize("crop", CROPS[:1] + CROPS[3:4], ids=repr)
@pytest.mark.parametrize("decoder", ["batch", "one by one"])
def test_rows_put_a_batch_into_chosen_rows_of_a_larger_one(photos: Path, crop: object, decoder: str) -> None:
    """``get_batch(..., out=, rows=)`` (a mix's pack writing its part of a mixed batch): each image,
    mirrored or not, lands in its row, exactly as in the batch of those records alone, and the other
    rows are left as they were; a PNG among them takes the general route into its row too."""
    ds = PackedImageFolder(photos / "p.shards")
    picked = np.array([3, 0, len(ds) - 1, 7, 10])  # the PNG is among the last records
    draws = Draws(seed=4, epoch=2)
    want, labels = ds.get_batch(picked, True, crop=crop, flip=getattr(crop, "flip", 0.0), draws=draws)
    out = torch.full((9, 3, crop.size, crop.size), 77, dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    rows = np.array([8, 1, 4, 0, 6])
    jpeg_kernel.set_enabled(decoder == "batch")
    try:
        got, got_labels = ds.get_batch(picked, True, crop=crop, flip=getattr(crop, "flip", 0.0), draws=draws, out=out,
                                       rows=rows)
    finally:
        jpeg_kernel.set_enabled(True)
    assert got is out
    assert torch.equal(out[torch.from_numpy(rows)], want) and torch.equal(got_labels, labels)
    untouched = np.setdiff1d(np.arange(9), rows)
    assert bool((out[torch.from_numpy(untouched)] == 77).all())


def test_rows_need_a_batch_that_holds_them(photos: Path) -> None:
    ds = PackedImageFolder(photos / "p.shards")
    out = torch.empty((2, 3, 48, 48), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    for kwargs in ({"crop": CenterCrop(48), "out": out, "rows": np.array([0, 2])},  # row 2 is not there
                   {"crop": None, "out": out, "rows": np.array([0, 1])},  # no crop
                   {"crop": CenterCrop(32), "out": out, "rows": np.array([0, 1])},  # not the crop's size
                   {"crop": CenterCrop(48), "out": None, "rows": np.array([0, 1])}):
        with pytest.raises(ValueError, match="rows="):
            ds.get_batch([0, 1], True, **kwargs)
