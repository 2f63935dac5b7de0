"""``RandomResizedCrop`` and flips: torchvision's sampling, reproducible per sample, the same
pixels on the fast path (``PackLoader``) and the drop-in path (the crop as a transform)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from packload import EncodeOptions, PackedImageFolder, PackLoader, RandomResizedCrop, pack
from packload.loaders.random_crop import Draws, flips
from tests.image_factory import write_image

DRAWS = 10_000
SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)


def torchvision_get_params(height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float],
                           generator: torch.Generator) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params``, written out as it is (an independent reference)."""
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1], generator=generator).item()
        aspect_ratio = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1], generator=generator)).item()
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = int(torch.randint(0, height - h + 1, size=(1,), generator=generator).item())
            j = int(torch.randint(0, width - w + 1, size=(1,), generator=generator).item())
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w = width
        h = height
    return (height - h) // 2, (width - w) // 2, h, w


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    values = np.union1d(a, b)
    cdf_a = np.searchsorted(np.sort(a), values, side="right") / len(a)
    cdf_b = np.searchsorted(np.sort(b), values, side="right") / len(b)
    return float(np.abs(cdf_a - cdf_b).max())


# Critical value of the two-sample KS test at alpha = 0.001 for two samples of DRAWS each.
KS_LIMIT = 1.95 * math.sqrt(2 / DRAWS)


@pytest.mark.parametrize("size", [(256, 256), (192, 256), (500, 200), (40, 30)])
def test_boxes_follow_torchvision_distributions(size):
    height, width = size
    crop = RandomResizedCrop(224, scale=SCALE, ratio=RATIO)
    ours = crop.boxes(np.full(DRAWS, height), np.full(DRAWS, width), np.arange(DRAWS), Draws(seed=7))
    generator = torch.Generator().manual_seed(7)
    ref = np.array([torchvision_get_params(height, width, SCALE, RATIO, generator) for _ in range(DRAWS)])
    for boxes in (ours, ref):  # every box lies inside the image
        top, left, h, w = boxes.T
        assert (h >= 1).all() and (w >= 1).all() and (top >= 0).all() and (left >= 0).all()
        assert (top + h <= height).all() and (left + w <= width).all()
    for name, statistic in {
        "area fraction": lambda b: b[:, 2] * b[:, 3] / (height * width),
        "log aspect": lambda b: np.log(b[:, 3] / b[:, 2]),
        "relative top": lambda b: (b[:, 0] + 0.5) / (height - b[:, 2] + 1),
        "relative left": lambda b: (b[:, 1] + 0.5) / (width - b[:, 3] + 1),
    }.items():
        distance = ks_statistic(statistic(ours), statistic(ref))
        assert distance < KS_LIMIT, f"{name}: KS distance {distance:.4f} against torchvision's algorithm"
    fraction = ours[:, 2] * ours[:, 3] / (height * width)
    assert fraction.max() <= 1.0
    if min(size) >= 192:  # large enough that rounding keeps boxes near the drawn area and aspect
        assert fraction.min() >= 0.08 * 0.9
        aspect = ours[:, 3] / ours[:, 2]
        assert aspect.min() >= 0.75 * 0.98 and aspect.max() <= 4 / 3 * 1.02


@pytest.mark.parametrize("size", [(3, 1000), (1000, 3), (1, 1), (2, 1)])
def test_extreme_shapes_match_torchvision_exactly_where_no_try_fits(size):
    """Where no try can fit, the box is the centred fallback, drawn by no random number: equal box
    for box; elsewhere (1x1, 2x1) both agree on the set of boxes possible."""
    height, width = size
    crop = RandomResizedCrop(224)
    ours = crop.boxes(np.full(2000, height), np.full(2000, width), np.arange(2000), Draws())
    generator = torch.Generator().manual_seed(1)
    ref = np.array([torchvision_get_params(height, width, SCALE, RATIO, generator) for _ in range(2000)])
    assert {tuple(b) for b in ours.tolist()} == {tuple(b) for b in ref.tolist()}
    if size == (3, 1000):
        assert (ours == [0, 498, 3, 4]).all()  # the whole height, aspect clamped to 4/3
    if size == (1000, 3):
        assert (ours == [498, 0, 4, 3]).all()


def test_fallback_never_gives_an_empty_box():
    crop = RandomResizedCrop(8, scale=(0.9, 1.0), ratio=(20.0, 30.0))  # torchvision would give h = 0 here
    boxes = crop.boxes(np.full(50, 1), np.full(50, 1), np.arange(50), Draws())
    assert (boxes == [0, 0, 1, 1]).all()


def test_draws_are_a_function_of_seed_epoch_rank_and_index():
    crop = RandomResizedCrop(224)
    heights, widths, indices = np.full(500, 256), np.full(500, 320), np.arange(1000, 1500)
    base = crop.boxes(heights, widths, indices, Draws(3, 1, 0))
    assert (crop.boxes(heights, widths, indices, Draws(3, 1, 0)) == base).all()
    # one sample at a time, or in another batch order: the same boxes
    singles = np.array([crop.box(256, 320, int(i), Draws(3, 1, 0)) for i in indices[::-1]])[::-1]
    assert (singles == base).all()
    for other in (Draws(3, 2, 0), Draws(4, 1, 0), Draws(3, 1, 1)):
        changed = (crop.boxes(heights, widths, indices, other) != base).any(axis=1).mean()
        assert changed > 0.95, other
    assert (flips(indices, Draws(3, 1, 0), 0.5) == flips(indices, Draws(3, 1, 0), 0.5)).all()
    assert (flips(indices, Draws(3, 1, 0), 0.5) != flips(indices, Draws(3, 2, 0), 0.5)).mean() > 0.3


@pytest.mark.parametrize("probability", [0.5, 0.2])
def test_flip_rate_is_the_probability(probability):
    mirrored = flips(np.arange(DRAWS), Draws(seed=11), probability)
    expected = DRAWS * probability
    spread = math.sqrt(DRAWS * probability * (1 - probability))
    assert abs(mirrored.sum() - expected) < 5 * spread
    assert not flips(np.arange(100), Draws(), 0.0).any() and flips(np.arange(100), Draws(), 1.0).all()


def test_arguments_are_checked():
    with pytest.raises(ValueError):
        RandomResizedCrop(0)
    with pytest.raises(ValueError):
        RandomResizedCrop(224, scale=(0.5, 0.1))
    with pytest.raises(ValueError):
        RandomResizedCrop(224, ratio=(0.0, 1.0))
    with pytest.raises(ValueError):
        RandomResizedCrop(224, flip=1.5)
    assert RandomResizedCrop(224, flip=True).flip == 0.5
    with pytest.raises(TypeError, match="index"):
        RandomResizedCrop(224)(np.zeros((8, 8, 3), np.uint8))


# -- pixels ---------------------------------------------------------------------------------------

SIDE = 32


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("rrc-src")
    sizes = [(48, 40), (64, 50), (50, 64), (33, 21), (120, 90)]
    for k, size in enumerate(sizes):
        write_image(root / "a" / f"rgb_{k}.jpg", size=size, seed=k, quality=90)
        write_image(root / "b" / f"rgb_{k}.png", size=size, seed=20 + k)
    for name, size in {"one": (1, 1), "tall": (3, 1000), "wide": (1000, 3), "two": (2, 1)}.items():
        write_image(root / "c" / f"{name}.png", size=size, seed=40)
        write_image(root / "c" / f"{name}.jpg", size=size, seed=41, quality=90)
    write_image(root / "c" / "gray.jpg", mode="L", size=(70, 50), seed=42)
    write_image(root / "c" / "cmyk.jpg", mode="CMYK", size=(60, 44), seed=43)
    write_image(root / "c" / "palette.png", mode="P", size=(40, 52), seed=44)
    exif = Image.Exif()
    exif[0x0112] = 6  # stored sideways: rotate 90 degrees to show
    write_image(root / "c" / "rotated.jpg", size=(56, 36), seed=45, exif=exif.tobytes())
    return root


@pytest.fixture(scope="module")
def packs(source, tmp_path_factory):
    out = tmp_path_factory.mktemp("rrc-packs")
    made = {}
    for name, options, backend in [("keep", EncodeOptions(), "shards"), ("keep-lmdb", EncodeOptions(), "lmdb"),
                                   ("raw", EncodeOptions(encoding="raw"), "shards")]:
        made[name] = out / (f"{name}.lmdb" if backend == "lmdb" else f"{name}.shards")
        pack(source, made[name], options=options, workers=1, progress=False, shard_size=1 << 16, backend=backend)
    return made


def drop_in(path, crop: RandomResizedCrop, flip: float, seed: int, epoch: int, order, exif: bool = False):
    """The drop-in path's images for ``order``: the crop (with the flip) as the dataset's transform."""
    ds = PackedImageFolder(path, transform=RandomResizedCrop(crop.size, crop.scale, crop.ratio, flip=flip,
                                                             dct_scale=crop.dct_scale), exif_transpose=exif)
    ds.set_epoch(epoch, seed=seed)
    return np.stack([ds[int(i)][0] for i in order])


@pytest.mark.parametrize("name", ["keep", "keep-lmdb", "raw"])
@pytest.mark.parametrize("threads", [0, 2])
def test_fast_path_gives_the_drop_in_pixels(packs, name, threads):
    crop = RandomResizedCrop(SIDE, dct_scale=False)
    ds = PackedImageFolder(packs[name])
    loader = PackLoader(ds, 5, crop=crop, flip=True, sampler=ds.sampler(seed=9), threads=threads)
    for epoch in (0, 3):
        loader.set_epoch(epoch)
        got = torch.cat([images for images, _ in loader]).permute(0, 2, 3, 1).numpy()
        want = drop_in(packs[name], crop, 0.5, 9, epoch, loader.sampler.epoch_order(epoch))
        assert got.shape == (len(ds), SIDE, SIDE, 3)
        assert np.array_equal(got, want)  # bit-exact: the same boxes, flips and resampling


def test_fast_path_gives_the_drop_in_pixels_upright(packs):
    crop = RandomResizedCrop(SIDE, dct_scale=False)
    ds = PackedImageFolder(packs["keep"], exif_transpose=True)
    loader = PackLoader(ds, 8, crop=crop, flip=0.5, sampler=ds.sampler(seed=2), threads=0)
    got = torch.cat([images for images, _ in loader]).permute(0, 2, 3, 1).numpy()
    assert np.array_equal(got, drop_in(packs["keep"], crop, 0.5, 2, 0, loader.sampler.epoch_order(0), exif=True))


def test_default_dct_scale_changes_nothing_when_boxes_are_small(packs):
    """No box of these images (at most 120x90) covers a 96-pixel output at a reduced DCT scale:
    each is decoded in full, so the default gives the drop-in pixels too."""
    ds = PackedImageFolder(packs["keep"])
    loader = PackLoader(ds, 8, crop=RandomResizedCrop(96), flip=True, sampler=ds.sampler(seed=1), threads=0)
    got = torch.cat([images for images, _ in loader]).permute(0, 2, 3, 1).numpy()
    order = loader.sampler.epoch_order(0)
    assert np.array_equal(got, drop_in(packs["keep"], RandomResizedCrop(96), 0.5, 1, 0, order))


def test_flips_mirror_exactly(packs):
    ds = PackedImageFolder(packs["raw"])
    crop = RandomResizedCrop(SIDE)
    plain = torch.cat([b for b, _ in PackLoader(ds, 6, crop=crop, sampler=ds.sampler(seed=4), threads=0)])
    mirrored = torch.cat([b for b, _ in PackLoader(ds, 6, crop=crop, flip=1.0, sampler=ds.sampler(seed=4),
                                                   threads=0)])
    assert torch.equal(mirrored, plain.flip(3))
    half = torch.cat([b for b, _ in PackLoader(ds, 6, crop=crop, flip=True, sampler=ds.sampler(seed=4), threads=0)])
    order = ds.sampler(seed=4).epoch_order(0)
    expect = flips(order, Draws(4, 0, 0), 0.5)
    for k in range(len(order)):
        assert torch.equal(half[k], plain[k].flip(2) if expect[k] else plain[k])


def test_flip_without_a_crop_mirrors_raw_batches(tmp_path):
    for k in range(6):
        write_image(tmp_path / "src" / "a" / f"{k}.png", size=(12, 10), seed=k)
    pack(tmp_path / "src", tmp_path / "p.shards", options=EncodeOptions(encoding="raw"), workers=1, progress=False)
    ds = PackedImageFolder(tmp_path / "p.shards")
    plain, _ = next(iter(PackLoader(ds, 6, sampler=ds.sampler(shuffle=False))))
    mirrored, _ = next(iter(PackLoader(ds, 6, flip=1.0, sampler=ds.sampler(shuffle=False))))
    assert torch.equal(mirrored, plain.flip(3))


def test_resumed_epoch_continues_with_the_same_crops(packs):
    ds = PackedImageFolder(packs["keep"])
    crop = RandomResizedCrop(SIDE)

    def loader():
        made = PackLoader(ds, 4, crop=crop, flip=True, sampler=ds.sampler(seed=6), threads=0)
        made.set_epoch(2)
        return made

    full = [images.clone() for images, _ in loader()]
    first = loader()
    iterator = iter(first)
    for _ in range(2):
        next(iterator)
    state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    rest = [images for images, _ in resumed]
    assert len(rest) == len(full) - 2
    assert all(torch.equal(a, b) for a, b in zip(rest, full[2:], strict=True))
    other_epoch = loader()
    other_epoch.set_epoch(3)
    assert not torch.equal(next(iter(other_epoch))[0], full[0])


def test_dct_scaled_decoding_stays_close_to_a_full_decode(tmp_path):
    """Large JPEGs, large boxes: decoded at a reduced DCT scale (dct_scale=True), the crops stay
    within a few levels of a full decode's."""
    for k in range(6):
        write_image(tmp_path / "src" / "a" / f"{k}.jpg", size=(900 + 40 * k, 700), seed=k, quality=90)
    pack(tmp_path / "src", tmp_path / "p.shards", workers=1, progress=False)
    ds = PackedImageFolder(tmp_path / "p.shards")
    scaled, full = RandomResizedCrop(96, scale=(0.3, 1.0)), RandomResizedCrop(96, scale=(0.3, 1.0), dct_scale=False)
    boxes = scaled.boxes(np.full(6, 700), 900 + 40 * np.arange(6), np.arange(6), Draws())
    assert any(scaled.decode_size(box, 700, 900) != (0, 0) for box in boxes)  # the reduced scales are used
    a, _ = ds.get_batch(range(6), True, crop=scaled)
    b, _ = ds.get_batch(range(6), True, crop=full)
    diff = (a.int() - b.int()).abs().float()
    assert diff.mean() < 3.0, diff.mean()
    assert diff.mean() > 0  # it did decode differently
    assert full.decode_size(boxes[0], 700, 900) == (0, 0)


def test_loader_arguments(packs):
    ds = PackedImageFolder(packs["raw"])
    with pytest.raises(ValueError, match="flip"):
        PackLoader(ds, 4, crop=RandomResizedCrop(SIDE, flip=0.5), flip=0.2)
    assert PackLoader(ds, 4, crop=RandomResizedCrop(SIDE, flip=0.5)).flip == 0.5
    assert PackLoader(ds, 4, crop=RandomResizedCrop(SIDE, flip=0.5), flip=True).flip == 0.5
    with pytest.raises(ValueError, match="encoded"):
        PackLoader(ds, 4, flip=True, encoded=True)
    with pytest.raises(ValueError, match="flip"):
        PackLoader(ds, 4, flip=2)


def test_benchmark_runs_and_its_pil_crop_follows_the_algorithm(packs, capsys):
    from benchmarks import bench_random_crop

    pil = bench_random_crop.PilRandomResizedCrop(224)
    boxes = np.array([pil.box(192, 256) for _ in range(DRAWS)])
    generator = torch.Generator().manual_seed(3)
    ref = np.array([torchvision_get_params(192, 256, SCALE, RATIO, generator) for _ in range(DRAWS)])
    fraction = lambda b: b[:, 2] * b[:, 3] / (192 * 256)  # noqa: E731
    assert ks_statistic(fraction(boxes), fraction(ref)) < KS_LIMIT
    assert pil(Image.new("RGB", (30, 20))).shape == (224, 224, 3)
    assert bench_random_crop.main([str(packs["raw"]), "--rounds", "1", "--batch-size", "8", "--cores", "1",
                                   "--json"]) == 0
    result = json.loads(capsys.readouterr().out)["results"][0]
    assert set(result["contenders"]) == {"packloader", "packloader-per-image", "dataloader-pil", "dataloader-packload"}


@pytest.mark.parametrize("crop", [RandomResizedCrop(224), RandomResizedCrop(32, dct_scale=False),
                                  RandomResizedCrop(64, scale=(0.5, 1.0))])
def test_decode_sizes_for_many_boxes_are_decode_size_of_each(crop: RandomResizedCrop) -> None:
    rng = np.random.default_rng(crop.size)
    heights, widths = rng.integers(1, 1200, 400), rng.integers(1, 1200, 400)
    boxes = crop.boxes(heights, widths, np.arange(400), Draws(seed=1))
    min_h, min_w = crop.decode_sizes(boxes, heights, widths)
    for k in range(400):
        assert (min_h[k], min_w[k]) == crop.decode_size(boxes[k], int(heights[k]), int(widths[k]))
