"""Random-resized-crop and horizontal flip for training, drawn per sample and reproducible.

``RandomResizedCrop(224)`` draws a box with torchvision's ``RandomResizedCrop.get_params``
algorithm (area fraction uniform in ``scale``, aspect ratio log-uniform in ``ratio``, ten tries,
then a centred fallback with the aspect clamped to ``ratio``) and resizes it to 224×224 with the
resampling ``CenterCrop`` uses (``loaders/crop.py``: bilinear, antialiased, the compiled kernel).

Every random number comes from a counter-based generator keyed by ``(seed, epoch, rank, record
index)`` (splitmix64 over the key and a draw counter): a sample's box and flip depend on nothing
else: not on the thread or process that builds it, not on the batch it lands in, not on what was
read before. So the same seed gives the same crops, a resumed epoch gives the crops the
uninterrupted one would have given, and the fast path (``PackLoader``, which takes the key from its
sampler) and the drop-in path (``PackedImageFolder(transform=RandomResizedCrop(...))``, which takes
it from ``PackedImageFolder.set_epoch``) draw the same boxes for the same sample. Draws for a whole
batch are computed at once in NumPy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from packload.core.errors import UsageError
from packload.loaders.collate import as_chw
from packload.loaders.crop import CenterCrop, crop_box_into
from packload.loaders.params import check_pair, check_side

_TRIES = 10  # torchvision's get_params: tries before the centred fallback
_TOP_DRAW, _LEFT_DRAW = 2 * _TRIES, 2 * _TRIES + 1  # draw counters of the accepted box's corner
_FLIP_DRAW = 2 * _TRIES + 2  # draw counter of the flip
_GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_MASK = (1 << 64) - 1
MIN_RATIO = 1e-6
"""``RandomResizedCrop``'s aspect ratios lie in [1e-6, 1e6]: far past any real use (torchvision's
default is 3/4..4/3), and near enough to 1 that a box's sides stay well inside int64 for any
image a pack stores (sides up to 2^24)."""
_RATIO_RANGE = "with 1e-6 <= low <= high <= 1e6 (width / height of the box)"


@dataclass(frozen=True)
class Draws:
    """The key of a run's random draws, besides each sample's record index: the sampler's seed, the
    epoch and the DDP rank. ``PackLoader`` takes it from its sampler; the drop-in path from
    ``PackedImageFolder.set_epoch``."""

    seed: int = 0
    epoch: int = 0
    rank: int = 0


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(_MIX1)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(_MIX2)
    return x ^ (x >> np.uint64(31))


def _key(draws: Draws) -> int:
    """One 64-bit key for ``draws`` (each field mixed in turn, so nearby keys are unrelated)."""
    key = 0
    for value in (draws.seed, draws.epoch, draws.rank):
        mixed = _mix(np.array([((key ^ (int(value) & _MASK)) + _GOLDEN) & _MASK], dtype=np.uint64))
        key = int(mixed[0])
    return key


def uniforms(indices: np.ndarray, draws: Draws, counters: np.ndarray) -> np.ndarray:
    """Uniform floats in [0, 1), one per (sample, counter): ``len(indices)`` × ``len(counters)``.

    Sample ``i``'s draw ``c`` is splitmix64's output number ``c`` from the state
    ``mix(key ^ index)``: a pure function of (seed, epoch, rank, index, c)."""
    with np.errstate(over="ignore"):
        states = _mix(np.asarray(indices, dtype=np.int64).astype(np.uint64) ^ np.uint64(_key(draws)))
        steps = (np.asarray(counters, dtype=np.uint64) + np.uint64(1)) * np.uint64(_GOLDEN)
        bits = _mix(states[:, None] + steps[None, :])
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def flips(indices: np.ndarray, draws: Draws, probability: float) -> np.ndarray:
    """Which samples are mirrored: a bool per index, True with ``probability``, keyed as the boxes."""
    if probability <= 0 or not len(indices):
        return np.zeros(len(indices), dtype=bool)
    return uniforms(indices, draws, np.array([_FLIP_DRAW]))[:, 0] < probability


def flip_probability(flip: bool | float) -> float:
    """``flip`` as a probability: True is 0.5, False 0, a float in [0, 1] itself."""
    if isinstance(flip, bool):
        return 0.5 if flip else 0.0
    if not isinstance(flip, (int, float)) or not 0.0 <= flip <= 1.0:
        raise UsageError(f"flip must be a bool or a probability in [0, 1], got {flip!r}")
    return float(flip)


def check_crop(crop: object, name: str = "crop", int_side: bool = False) -> CenterCrop | RandomResizedCrop | None:
    """``crop`` if it is a ``CenterCrop``, a ``RandomResizedCrop`` or None (with ``int_side``, an int
    too: the side of a ``CenterCrop``); a one-line ``UsageError`` naming ``name`` otherwise (a string
    or a torchvision transform would fail deep in a batch)."""
    if crop is None or isinstance(crop, (CenterCrop, RandomResizedCrop)):
        return crop
    if int_side and isinstance(crop, int) and not isinstance(crop, bool):
        return CenterCrop(check_side(crop, name))
    kinds = "a packload CenterCrop or RandomResizedCrop" + (", an int (a CenterCrop's side)" if int_side else "")
    raise UsageError(f"{name} must be {kinds} or None, got {crop!r} ({type(crop).__name__})")


@dataclass(frozen=True)
class RandomResizedCrop:
    """A random box (torchvision's ``RandomResizedCrop`` sampling) resized to ``size`` × ``size``.

    Args:
        size: the output's side.
        scale: range of the box's area as a fraction of the image's.
        ratio: range of the box's aspect ratio (width / height), drawn log-uniformly.
        flip: probability of mirroring the crop horizontally (``PackLoader(flip=...)`` sets it too).
        dct_scale: in ``PackLoader``, decode a JPEG at the smallest libjpeg-turbo DCT scale that
            still gives the box at least ``size`` pixels on each side (faster for boxes much larger
            than ``size``; pixels differ slightly from a full decode). False decodes in full, and
            then the fast path gives exactly the drop-in path's pixels.

    As the ``crop`` of ``PackLoader`` or ``get_batch``, the key of the draws is the sampler's
    seed, epoch and rank. As a ``PackedImageFolder`` transform the dataset passes each sample's
    record index, and the seed, epoch and rank given to ``PackedImageFolder.set_epoch``; it
    returns an HxWx3 uint8 array. Called directly it needs ``index`` (and ``draws``).
    """

    size: int = 224
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: float = 0.0
    dct_scale: bool = True

    keyed = True  # a transform that wants the sample's index and the draws' key (PackedImageFolder)

    def __post_init__(self) -> None:
        # One-line UsageErrors (ValueErrors) for nonsense, before any box is drawn from it.
        object.__setattr__(self, "size", check_side(self.size, "RandomResizedCrop size"))
        object.__setattr__(self, "scale", check_pair(self.scale, "RandomResizedCrop scale", 0.0, 1.0, low_open=True,
                                                     valid="with 0 < low <= high <= 1 (fractions of the image's area)"))
        object.__setattr__(self, "ratio", check_pair(self.ratio, "RandomResizedCrop ratio", MIN_RATIO, 1 / MIN_RATIO,
                                                     low_open=False, valid=_RATIO_RANGE))
        object.__setattr__(self, "flip", flip_probability(self.flip))
        if not isinstance(self.dct_scale, bool):
            raise UsageError(f"RandomResizedCrop dct_scale must be True or False, got {self.dct_scale!r}")

    def boxes(self, heights: np.ndarray, widths: np.ndarray, indices: np.ndarray, draws: Draws) -> np.ndarray:
        """Boxes ``(top, left, height, width)`` (int64, one row per sample) for images of these sizes.

        torchvision's ``get_params``, vectorised: for each of ten tries an area fraction
        ``U(scale)`` and an aspect ``exp(U(log ratio))``; the box is ``round(sqrt(area * aspect))``
        wide and ``round(sqrt(area / aspect))`` high (Python's rounding, half to even); the first
        try that fits is placed at a uniform corner; if none fits, the centred box of the whole
        image with its aspect clamped to ``ratio``."""
        heights = np.asarray(heights, dtype=np.int64)
        widths = np.asarray(widths, dtype=np.int64)
        count = len(heights)
        if not count:
            return np.zeros((0, 4), dtype=np.int64)
        u = uniforms(indices, draws, np.arange(_LEFT_DRAW + 1))
        area = (heights * widths).astype(np.float64)[:, None]
        targets = area * (self.scale[0] + u[:, 0:2 * _TRIES:2] * (self.scale[1] - self.scale[0]))
        log_low, log_high = math.log(self.ratio[0]), math.log(self.ratio[1])
        aspects = np.exp(log_low + u[:, 1:2 * _TRIES:2] * (log_high - log_low))
        box_w = np.round(np.sqrt(targets * aspects)).astype(np.int64)
        box_h = np.round(np.sqrt(targets / aspects)).astype(np.int64)
        fits = (box_w > 0) & (box_w <= widths[:, None]) & (box_h > 0) & (box_h <= heights[:, None])
        found = fits.any(axis=1)
        first = fits.argmax(axis=1)
        rows = np.arange(count)
        h, w = box_h[rows, first], box_w[rows, first]
        top = np.floor(u[:, _TOP_DRAW] * (heights - h + 1)).astype(np.int64)
        left = np.floor(u[:, _LEFT_DRAW] * (widths - w + 1)).astype(np.int64)
        if not found.all():
            fh, fw = self._fallback(heights, widths)
            h, w = np.where(found, h, fh), np.where(found, w, fw)
            top = np.where(found, top, (heights - h) // 2)
            left = np.where(found, left, (widths - w) // 2)
        return np.stack([top, left, h, w], axis=1)

    def _fallback(self, heights: np.ndarray, widths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(height, width) of torchvision's fallback: the whole image, its aspect clamped to ``ratio``
        (at least one pixel on a side, where torchvision could give none)."""
        in_ratio = widths / heights
        narrow, wide = in_ratio < self.ratio[0], in_ratio > self.ratio[1]
        h = np.where(narrow, np.round(widths / self.ratio[0]), heights).astype(np.int64)
        w = np.where(wide, np.round(heights * self.ratio[1]), widths).astype(np.int64)
        return np.clip(h, 1, heights), np.clip(w, 1, widths)

    def box(self, height: int, width: int, index: int, draws: Draws | None = None) -> tuple[int, int, int, int]:
        """The box ``(top, left, height, width)`` of record ``index`` in a ``height`` × ``width`` image."""
        row = self.boxes(np.array([height]), np.array([width]), np.array([index]), draws or Draws())[0]
        return int(row[0]), int(row[1]), int(row[2]), int(row[3])

    def decode_size(self, box: tuple[int, int, int, int] | np.ndarray, height: int, width: int) -> tuple[int, int]:
        """(min height, min width) to ask a scaling JPEG decoder for so that ``box`` of a
        ``height`` × ``width`` image keeps at least ``size`` pixels on each side ((0, 0): full size)."""
        box_h, box_w = int(box[2]), int(box[3])
        scale = max(self.size / box_h, self.size / box_w)
        if not self.dct_scale or scale >= 1.0:
            return 0, 0
        return math.ceil(height * scale), math.ceil(width * scale)

    def decode_sizes(self, boxes: np.ndarray, heights: np.ndarray, widths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``decode_size`` for many boxes (B×4) at once: (min heights, min widths), 0 for full size."""
        boxes = np.asarray(boxes, dtype=np.int64).reshape(-1, 4)
        heights, widths = np.asarray(heights, dtype=np.int64), np.asarray(widths, dtype=np.int64)
        scale = np.maximum(self.size / boxes[:, 2], self.size / boxes[:, 3])
        reduce = scale < 1.0 if self.dct_scale else np.zeros(len(boxes), dtype=bool)
        return (np.where(reduce, np.ceil(heights * scale), 0).astype(np.int64),
                np.where(reduce, np.ceil(widths * scale), 0).astype(np.int64))

    def __call__(self, image: Image.Image | np.ndarray | torch.Tensor, index: int | None = None,
                 draws: Draws | None = None) -> np.ndarray:
        if index is None:
            raise TypeError("RandomResizedCrop draws each sample's box from its record index: use it as a "
                            "PackedImageFolder transform or a PackLoader crop, or pass index= (and draws=)")
        if isinstance(image, Image.Image) and image.mode != "RGB":
            image = image.convert("RGB")
        array = as_chw(image).transpose(1, 2, 0)
        draws = draws or Draws()
        box = self.box(array.shape[0], array.shape[1], index, draws)
        out = torch.empty((self.size, self.size, 3), dtype=torch.uint8)
        crop_box_into(array, box, out.permute(2, 0, 1))
        result = out.numpy()
        if self.flip and flips(np.array([index]), draws, self.flip)[0]:
            result = np.ascontiguousarray(result[:, ::-1])
        return result
