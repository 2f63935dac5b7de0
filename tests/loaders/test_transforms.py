"""``ResizeCenterCrop`` (``packload.loaders.transforms``): torchvision's ``Resize(short) +
CenterCrop(size)`` on PIL images, as the same PIL operations give it."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from PIL import Image

from packload.loaders.transforms import ResizeCenterCrop
from tests.image_factory import textured_rgb


def _reference(image: Image.Image, size: int, resize: int) -> np.ndarray:
    """Resize(resize) then CenterCrop(size), written out with PIL calls."""
    w, h = image.size
    if w <= h:
        new = (resize, int(resize * h / w + 0.5))
    else:
        new = (int(resize * w / h + 0.5), resize)
    resized = image.resize(new, Image.Resampling.BILINEAR)
    left, top = (new[0] - size) // 2, (new[1] - size) // 2
    return np.asarray(resized.crop((left, top, left + size, top + size)))


@pytest.mark.parametrize("shape", [(120, 90), (90, 120), (73, 73)])
def test_resize_then_centre_crop(shape: tuple[int, int]) -> None:
    image = Image.fromarray(textured_rgb(shape, seed=sum(shape)))
    crop = ResizeCenterCrop(32, resize=40)
    out = crop(image)
    assert out.shape == (32, 32, 3) and out.dtype == np.uint8
    assert np.array_equal(out, _reference(image, 32, 40))
    assert np.array_equal(crop(np.asarray(image)), out)  # an array is taken as the same image


def test_default_resize_and_a_source_already_at_size() -> None:
    assert ResizeCenterCrop(224).resize == 256 and ResizeCenterCrop(112).resize == 128
    pixels = textured_rgb((40, 40), seed=1)
    assert np.array_equal(ResizeCenterCrop(40, resize=40)(pixels), pixels)  # no resample, no shift
    assert repr(ResizeCenterCrop(8, 9)) == "ResizeCenterCrop(size=8, resize=9)"
    with pytest.raises(ValueError, match="must be positive"):
        ResizeCenterCrop(0)


def test_it_pickles_for_spawned_workers() -> None:
    crop = pickle.loads(pickle.dumps(ResizeCenterCrop(16, 20)))
    pixels = textured_rgb((50, 30), seed=2)
    assert np.array_equal(crop(pixels), ResizeCenterCrop(16, 20)(pixels))
