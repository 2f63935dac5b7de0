"""Tests for packload.loaders.collate.collate_uint8: uint8 batches from numpy, tensor and PIL samples."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from packload.loaders.collate import collate_uint8  # noqa: E402


def hwc(seed: int, height: int = 6, width: int = 5) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def as_kind(array: np.ndarray, kind: str) -> object:
    if kind == "numpy":
        return array
    if kind == "tensor":
        return torch.from_numpy(array.copy()).permute(2, 0, 1)  # a non-contiguous CHW view, as to_output gives
    return Image.fromarray(array, "RGB")


@pytest.mark.parametrize("kind", ["numpy", "tensor", "pil"])
def test_collate_each_input_kind(kind: str) -> None:
    arrays = [hwc(seed) for seed in range(4)]
    labels = [3, 0, 7, 1]
    images, targets = collate_uint8([(as_kind(a, kind), y) for a, y in zip(arrays, labels, strict=True)])
    assert images.dtype == torch.uint8 and images.shape == (4, 3, 6, 5)
    assert images.is_contiguous()
    assert targets.dtype == torch.int64 and targets.tolist() == labels
    for i, a in enumerate(arrays):
        assert torch.equal(images[i], torch.from_numpy(a).permute(2, 0, 1))


def test_collate_mixed_kinds_and_label_types() -> None:
    arrays = [hwc(seed, 4, 9) for seed in range(3)]
    batch = [(arrays[0], np.int64(2)), (as_kind(arrays[1], "tensor"), torch.tensor(5)),
             (as_kind(arrays[2], "pil"), True)]
    images, targets = collate_uint8(batch)
    assert images.shape == (3, 3, 4, 9)
    assert targets.dtype == torch.int64 and targets.tolist() == [2, 5, 1]
    assert np.array_equal(images.permute(0, 2, 3, 1).numpy(), np.stack(arrays))


def test_collate_does_not_alias_the_inputs() -> None:
    array = hwc(0)
    original = array.copy()
    images, _ = collate_uint8([(array, 0)])
    array[:] = 0
    assert original.any() and np.array_equal(images[0].permute(1, 2, 0).numpy(), original)


def test_collate_batch_of_one_and_unlabelled() -> None:
    images, targets = collate_uint8([(hwc(1, 2, 3), -1)])
    assert images.shape == (1, 3, 2, 3) and targets.tolist() == [-1]


@pytest.mark.parametrize("kind", ["numpy", "tensor", "pil"])
def test_collate_mismatched_sizes_raise_clear_error(kind: str) -> None:
    batch = [(as_kind(hwc(0, 6, 5), kind), 0), (as_kind(hwc(1, 6, 5), kind), 0), (as_kind(hwc(2, 5, 6), kind), 1)]
    with pytest.raises(ValueError, match=r"sample 2 is \(3, 5, 6\), sample 0 is \(3, 6, 5\); resize or crop"):
        collate_uint8(batch)


def test_collate_empty_batch_raises() -> None:
    with pytest.raises(ValueError, match="empty batch"):
        collate_uint8([])


@pytest.mark.parametrize(
    "image",
    [
        np.zeros((4, 4, 3), dtype=np.float32),  # wrong dtype
        np.zeros((4, 4), dtype=np.uint8),  # greyscale array
        np.zeros((4, 4, 4), dtype=np.uint8),  # RGBA array
        Image.new("L", (4, 4)),
        Image.new("RGBA", (4, 4)),
        torch.zeros(3, 4, 4, dtype=torch.float32),
        torch.zeros(4, 4, dtype=torch.uint8),
    ],
    ids=["float32", "hw", "hwc4", "pil-L", "pil-RGBA", "tensor-float", "tensor-2d"],
)
def test_collate_rejects_non_rgb_uint8(image: object) -> None:
    with pytest.raises(ValueError, match="expected a"):
        collate_uint8([(image, 0)])


def test_collate_rejects_tensor_without_three_channels() -> None:
    with pytest.raises(ValueError):
        collate_uint8([(torch.zeros(4, 6, 5, dtype=torch.uint8), 0), (torch.zeros(4, 6, 5, dtype=torch.uint8), 1)])


def test_collate_pin_memory_falls_back_without_cuda() -> None:
    arrays = [hwc(seed) for seed in range(3)]
    batch = [(a, i) for i, a in enumerate(arrays)]
    plain_images, plain_targets = collate_uint8(batch)
    images, targets = collate_uint8(batch, pin_memory=True)
    assert torch.equal(images, plain_images) and torch.equal(targets, plain_targets)
    assert images.dtype == torch.uint8 and targets.dtype == torch.int64
    if not torch.cuda.is_available():
        assert not images.is_pinned() and not targets.is_pinned()
    else:  # pragma: no cover - only on a CUDA machine
        assert images.is_pinned() and targets.is_pinned()


def test_collate_encoded_round_trips_every_payload():
    from packload.loaders.collate import collate_encoded

    batch = [(b"\xff\xd8abc", 1), (b"", 0), (bytes(range(256)) * 3, 7)]
    data, offsets, labels = collate_encoded(batch)
    assert data.dtype == torch.uint8 and offsets.tolist() == [0, 5, 5, 5 + 768]
    assert [bytes(data[offsets[i]:offsets[i + 1]].numpy()) for i in range(3)] == [p for p, _ in batch]
    assert labels.tolist() == [1, 0, 7]
    with pytest.raises(ValueError, match="empty"):
        collate_encoded([])
