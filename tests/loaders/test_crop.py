"""``CenterCrop`` (``packload.loaders.crop``): the centred square of ``ratio`` times the shorter side,
resized bilinearly with antialiasing to exactly the pixels ``F.interpolate`` gives, the same from a
PIL image, an array, a tensor, or into a slot of a channels-last batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from packload.loaders.crop import CenterCrop, interleaved, mirror_rows, resize, scaled_box, scaled_boxes
from tests.image_factory import textured_rgb


def _reference(pixels: np.ndarray, crop: CenterCrop) -> np.ndarray:
    top, left, side = crop.window(*pixels.shape[:2])
    square = torch.from_numpy(np.ascontiguousarray(pixels[top : top + side, left : left + side]))
    out = torch.nn.functional.interpolate(square.permute(2, 0, 1).unsqueeze(0).float(), size=(crop.size, crop.size),
                                          mode="bilinear", antialias=True, align_corners=False)
    return out[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).numpy()


def test_window_and_decode_size() -> None:
    crop = CenterCrop(56)
    assert crop.window(100, 80) == (15, 5, 70)  # side int(224/256 * 80), centred
    assert CenterCrop(10, ratio=1.0).window(30, 50) == (0, 10, 30)
    assert crop.decode_scale(100, 80) == pytest.approx(56 / 70)
    assert crop.min_decode_size(100, 80) == (80, 64)
    assert CenterCrop(224).min_decode_size(100, 80) == (100, 80)  # enlarging: full size
    for kwargs in ({"size": 0}, {"size": 2.5}, {"size": True}, {"ratio": 0}, {"ratio": 1.5}):
        with pytest.raises(ValueError):
            CenterCrop(**kwargs)


@pytest.mark.parametrize("shape", [(90, 120), (120, 90), (64, 64), (20, 30)])
def test_pixels_are_interpolates_from_every_input(shape: tuple[int, int]) -> None:
    pixels = textured_rgb((shape[1], shape[0]), seed=shape[0])
    crop = CenterCrop(32)
    want = _reference(pixels, crop)
    assert np.abs(crop(pixels).astype(int) - want).max() <= 1
    assert np.array_equal(crop(Image.fromarray(pixels)), crop(pixels))
    assert np.array_equal(crop(torch.from_numpy(pixels).permute(2, 0, 1)), crop(pixels))


def test_a_square_already_at_size_is_copied_and_grey_is_made_rgb() -> None:
    pixels = textured_rgb((40, 40), seed=5)
    assert np.array_equal(CenterCrop(40, ratio=1.0)(pixels), pixels)
    grey = Image.fromarray(pixels).convert("L")
    assert np.array_equal(CenterCrop(16)(grey), CenterCrop(16)(grey.convert("RGB")))


def test_into_a_slot_of_a_channels_last_batch() -> None:
    pixels = [textured_rgb((50 + 10 * k, 40), seed=k) for k in range(3)]
    crop = CenterCrop(24)
    batch = torch.zeros((3, 3, 24, 24), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    for k, image in enumerate(pixels):
        crop.into(image, batch[k])
    for k, image in enumerate(pixels):
        assert np.array_equal(batch[k].permute(1, 2, 0).numpy(), crop(image))


def test_resize_is_the_same_through_every_route() -> None:
    square = torch.from_numpy(textured_rgb((48, 48), seed=6)).permute(2, 0, 1).unsqueeze(0)  # interleaved
    want = torch.nn.functional.interpolate(square, size=(20, 20), mode="bilinear", antialias=True)
    last = torch.empty((1, 3, 20, 20), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    planar = torch.empty((1, 3, 20, 20), dtype=torch.uint8)
    assert interleaved(square) and interleaved(last) and not interleaved(planar)
    resize(square, last)
    resize(square.contiguous(), planar)  # planar in and out: the interpolate fallback
    assert torch.equal(last, want) and torch.equal(planar, want)


def _sizes(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(1, 900, count), rng.integers(1, 900, count)


@pytest.mark.parametrize("crop", [CenterCrop(224), CenterCrop(24), CenterCrop(160, ratio=1.0), CenterCrop(7, 0.3)])
def test_windows_and_decode_sizes_for_many_images_are_those_of_each(crop: CenterCrop) -> None:
    heights, widths = _sizes(500, crop.size)
    tops, lefts, sides = crop.windows(heights, widths)
    min_h, min_w = crop.min_decode_sizes(heights, widths)
    for k, (height, width) in enumerate(zip(heights.tolist(), widths.tolist(), strict=True)):
        assert (tops[k], lefts[k], sides[k]) == crop.window(height, width)
        want = crop.min_decode_size(height, width) if crop.decode_scale(height, width) < 1.0 else (0, 0)
        assert (min_h[k], min_w[k]) == want


def test_scaled_boxes_are_scaled_box_row_by_row() -> None:
    rng = np.random.default_rng(4)
    heights, widths = _sizes(500, 5)
    box_h, box_w = rng.integers(1, heights + 1), rng.integers(1, widths + 1)
    boxes = np.stack([rng.integers(0, heights - box_h + 1), rng.integers(0, widths - box_w + 1), box_h, box_w], 1)
    n = rng.integers(1, 9, 500)
    n[:50] = 8  # some decoded in full: the box as it is
    got_h, got_w = -(-heights * n // 8), -(-widths * n // 8)
    moved = scaled_boxes(boxes, heights, widths, got_h, got_w)
    for k in range(500):
        want = scaled_box(tuple(boxes[k].tolist()), int(heights[k]), int(widths[k]), int(got_h[k]), int(got_w[k]))
        assert tuple(moved[k].tolist()) == want


def test_mirror_rows_mirrors_only_the_marked_images() -> None:
    images = torch.from_numpy(np.stack([textured_rgb((9, 6), seed) for seed in range(3)])).permute(0, 3, 1, 2)
    before = images.clone()
    mirror_rows(images, np.array([True, False, True]))
    assert torch.equal(images[0], before[0].flip(2)) and torch.equal(images[1], before[1])
    assert torch.equal(images[2], before[2].flip(2))
    mirror_rows(images, np.zeros(3, dtype=bool))
    assert torch.equal(images[1], before[1])
