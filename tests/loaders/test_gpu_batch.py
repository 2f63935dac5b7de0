"""``loaders/gpu_batch.py``: the plan of a GPU batch (which records the GPU decoder takes, their
boxes, flips and labels) and the crop-resize-flip, run here on CPU tensors against the CPU path."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from packload import (
    CenterCrop,
    EncodeOptions,
    PackedImageFolder,
    PackLoader,
    RandomResizedCrop,
    UsageError,
    pack,
)
from packload.loaders.gpu_batch import crop_resize_flip, plan_batch
from packload.loaders.random_crop import Draws, flips
from tests.image_factory import make_image_folder, write_image, write_odd_images


@pytest.fixture(scope="module")
def keep_pack(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    make_image_folder(root, classes=("a", "b"), per_class=8, seed=3)
    write_odd_images(root / "odd")
    for k in range(6):  # JPEGs larger than the crop, of several shapes
        write_image(root / "b" / f"big_{k}.jpg", size=(90 + 14 * k, 70 + 9 * k), seed=40 + k, quality=93)
    out = tmp_path_factory.mktemp("pack") / "keep.shards"
    pack(root, out, options=EncodeOptions(), workers=1, progress=False)
    return out


def _decoded(ds: PackedImageFolder, positions: np.ndarray) -> list[torch.Tensor]:
    """Each record fully decoded (as the GPU decoders do), 3×H×W uint8 CPU tensors."""
    images = []
    for position in positions.tolist():
        pixels = np.asarray(Image.open(io.BytesIO(bytes(ds.reader().payload(position)))).convert("RGB"))
        images.append(torch.from_numpy(pixels.copy()).permute(2, 0, 1))
    return images


def test_the_plan_sends_upright_rgb_and_grey_jpegs_to_the_gpu_and_the_rest_to_the_cpu(keep_pack):
    ds = PackedImageFolder(keep_pack)
    reader = ds.reader()
    positions = np.arange(len(ds))
    plan = plan_batch(reader.entries, positions, RandomResizedCrop(24), 0.5, Draws(1, 2, 0))
    formats = [reader.format_of(i) for i in positions.tolist()]
    modes = [bytes(m).rstrip(b"\0") for m in reader.entries["mode"]]
    want = np.array([f in ("JPEG", "MPO") and m in (b"RGB", b"L") for f, m in zip(formats, modes, strict=True)])
    assert (plan.on_device == want).all()
    names = {ds.path(int(i)).split("/")[-1]: bool(on) for i, on in zip(positions, plan.on_device, strict=True)}
    assert names["gray.jpg"] and names["UPPER.JPG"] and names["exif_rotated.jpg"]
    assert not names["cmyk.jpg"] and not names["palette.png"] and not names["image.webp"]
    assert sorted([*plan.device_rows, *plan.host_rows]) == list(range(len(ds)))
    assert "PNG" in {formats[i] for i in plan.host_rows}
    assert (plan.labels == np.array(ds.targets)).all() and plan.labels.dtype == np.int64
    # under exif_transpose the rotated JPEG is turned by the CPU path
    upright = plan_batch(reader.entries, positions, RandomResizedCrop(24), 0.5, Draws(1, 2, 0), exif_transpose=True)
    rotated = [ds.path(int(i)).split("/")[-1] for i in upright.host_rows]
    assert "exif_rotated.jpg" in rotated and upright.on_device.sum() == plan.on_device.sum() - 1


def test_the_plan_draws_the_boxes_and_flips_of_the_cpu_path(keep_pack):
    ds = PackedImageFolder(keep_pack)
    reader = ds.reader()
    positions = np.array([5, 0, 17, 3, 11, 20])
    draws = Draws(seed=7, epoch=3, rank=1)
    crop = RandomResizedCrop(24, scale=(0.2, 1.0))
    plan = plan_batch(reader.entries, positions, crop, 0.5, draws)
    for row, index in enumerate(positions.tolist()):
        entry = reader.entries[index]
        assert tuple(plan.boxes[row]) == crop.box(int(entry["height"]), int(entry["width"]), index, draws)
    assert (plan.flips == flips(positions, draws, 0.5)).all()
    other = plan_batch(reader.entries, positions, crop, 0.5, Draws(seed=8, epoch=3, rank=1))
    assert (other.boxes != plan.boxes).any(), "another seed draws other boxes"
    centre = plan_batch(reader.entries, positions, CenterCrop(24), 0.0, draws)
    assert not centre.flips.any() and centre.size == (24, 24)
    for row, index in enumerate(positions.tolist()):
        entry = reader.entries[index]
        top, left, side = CenterCrop(24).window(int(entry["height"]), int(entry["width"]))
        assert tuple(centre.boxes[row]) == (top, left, side, side)


def test_the_plan_without_a_crop_needs_one_size(keep_pack, tmp_path):
    ds = PackedImageFolder(keep_pack)
    with pytest.raises(UsageError, match="different sizes.*crop="):
        plan_batch(ds.reader().entries, np.arange(len(ds)), None, 0.0, Draws())
    for k in range(4):
        write_image(tmp_path / "src" / "c" / f"{k}.jpg", size=(30, 20), seed=k)
    pack(tmp_path / "src", tmp_path / "same.lmdb", workers=1, progress=False)
    same = PackedImageFolder(tmp_path / "same.lmdb")
    plan = plan_batch(same.reader().entries, np.arange(4), None, 0.0, Draws())
    assert plan.size == (20, 30) and (plan.boxes == [0, 0, 20, 30]).all() and plan.on_device.all()


@pytest.mark.parametrize("crop", [RandomResizedCrop(24, dct_scale=False), CenterCrop(32)], ids=["random", "centre"])
def test_crop_resize_flip_on_cpu_tensors_matches_the_cpu_fast_path(keep_pack, crop):
    ds = PackedImageFolder(keep_pack)
    sampler = ds.sampler(seed=4)
    loader = PackLoader(ds, 64, sampler=sampler, crop=crop, flip=True, threads=0)
    cpu_images, cpu_labels = next(iter(loader))
    order = sampler.epoch_order(0)[:64]
    reader = ds.reader()
    plan = plan_batch(reader.entries, reader.positions(order), crop, 0.5,
                      Draws(sampler.seed, sampler.epoch, sampler.rank))
    rows = plan.device_rows
    assert len(rows) >= 10 and plan.flips[rows].any() and not plan.flips[rows].all()
    out = torch.empty((len(rows), 3, crop.size, crop.size), dtype=torch.uint8).contiguous(
        memory_format=torch.channels_last)
    crop_resize_flip(_decoded(ds, plan.positions[rows]), [(0, 0)] * len(rows), plan.boxes[rows], plan.flips[rows], out)
    diff = (out.int() - cpu_images[torch.from_numpy(rows)].int()).abs()
    # where the CPU path decoded in full, the same pixels within a level or two (float resize against
    # the uint8 kernel); where CenterCrop let it decode at a reduced DCT scale, a few levels
    entries = reader.entries[plan.positions[rows]]
    full = np.array([not isinstance(crop, CenterCrop) or crop.decode_scale(int(h), int(w)) >= 1
                     for h, w in zip(entries["height"], entries["width"], strict=True)])
    assert full.sum() >= 5
    assert diff[torch.from_numpy(full)].max().item() <= 2 and diff[torch.from_numpy(full)].float().mean().item() < 0.5
    assert diff.float().mean().item() < 3
    assert torch.equal(torch.from_numpy(plan.labels), cpu_labels)
    unflipped = torch.empty_like(out)
    crop_resize_flip(_decoded(ds, plan.positions[rows]), [(0, 0)] * len(rows), plan.boxes[rows],
                     np.zeros(len(rows), dtype=bool), unflipped)
    mirrored = torch.from_numpy(np.flatnonzero(plan.flips[rows]))
    assert torch.equal(unflipped[mirrored].flip(-1), out[mirrored])


def test_a_region_decode_gives_what_the_whole_image_gives(keep_pack):
    ds = PackedImageFolder(keep_pack)
    reader = ds.reader()
    plan = plan_batch(reader.entries, np.arange(len(ds)), RandomResizedCrop(16, scale=(0.3, 0.6)), 0.5, Draws(2))
    rows = plan.device_rows
    whole = _decoded(ds, plan.positions[rows])
    regions = [image[:, t : t + h, x : x + w] for image, (t, x, h, w) in zip(whole, plan.boxes[rows].tolist(),
                                                                              strict=True)]
    origins = [(t, x) for t, x, _, _ in plan.boxes[rows].tolist()]
    a = torch.empty((len(rows), 3, 16, 16), dtype=torch.uint8)
    b = torch.empty_like(a)
    crop_resize_flip(whole, [(0, 0)] * len(rows), plan.boxes[rows], plan.flips[rows], a)
    crop_resize_flip(regions, origins, plan.boxes[rows], plan.flips[rows], b)
    assert torch.equal(a, b)


def test_a_box_the_size_of_the_output_is_copied_exactly_and_bad_boxes_are_refused():
    image = torch.randint(0, 256, (3, 10, 12), dtype=torch.uint8)
    out = torch.empty((1, 3, 4, 5), dtype=torch.uint8)
    crop_resize_flip([image], [(0, 0)], np.array([[2, 3, 4, 5]]), np.array([True]), out)
    assert torch.equal(out[0], image[:, 2:6, 3:8].flip(-1))
    with pytest.raises(ValueError, match="outside image 0"):
        crop_resize_flip([image], [(0, 0)], np.array([[8, 3, 4, 5]]), np.array([False]), out)
    with pytest.raises(ValueError, match="1 images"):
        crop_resize_flip([image], [(0, 0)], np.zeros((2, 4), dtype=np.int64), np.zeros(2, dtype=bool), out)

