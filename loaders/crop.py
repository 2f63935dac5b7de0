"""Centre crop + resize of uint8 images, written straight into a slot of a batch.

``CenterCrop(224)`` takes the centred square whose side is ``ratio`` (default 224/256) of the
image's shorter side and resizes it to 224×224: the evaluation crop of ImageNet training,
``Resize(256) + CenterCrop(224)``, done in one resampling of only the pixels that are kept. The
geometry is FFCV's ``CenterCropRGBImageDecoder((224, 224), ratio=224/256)``: the square's side is
``int(ratio * short side)`` and its corner ``((h - side) // 2, (w - side) // 2)``; torchvision's
``Resize(256) + CenterCrop(224)`` places the same square up to sub-pixel rounding (under one
source pixel). Resampling is bilinear with antialiasing, by ``torch.nn.functional.interpolate``
(what torchvision's tensor ``Resize(antialias=True)`` does), so pixels agree with a PIL bilinear
resize of the same square to within a few levels.

The same function serves the drop-in path (``CenterCrop`` as a ``transform``) and the fast batch
path (``PackLoader(..., crop=CenterCrop(224))``), so both give identical pixels from identical
decoded images. torch releases the GIL while it resizes, so threads scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from packload.core import resize_kernel
from packload.core.errors import UsageError
from packload.core.torch_private import resize_into
from packload.loaders.collate import as_chw
from packload.loaders.params import check_real, check_side

MIN_CENTER_RATIO = 1 / 64
"""The smallest ``CenterCrop`` ratio: the square keeps at least 1/64 of the shorter side (4 pixels of
a 256-pixel image). Smaller ones crop a few pixels of any real image and blow them up: a mistake,
not a crop (224/256 is ImageNet's; 1 keeps the whole shorter side)."""
_RATIO_RANGE = "in [1/64, 1] (the square's side as a fraction of the shorter side)"


@dataclass(frozen=True)
class CenterCrop:
    """A centred square of ``ratio`` × the shorter side, resized to ``size`` × ``size``.

    Usable as a ``transform`` on PIL images, HxWx3 uint8 arrays or 3xHxW uint8 tensors (it returns
    an HxWx3 uint8 array), and as the ``crop`` of ``PackLoader``/``get_batch``.
    """

    size: int = 224
    ratio: float = 224 / 256

    def __post_init__(self) -> None:
        # One-line UsageErrors (ValueErrors) for nonsense, before any batch is laid out from it.
        object.__setattr__(self, "size", check_side(self.size, "CenterCrop size"))
        ratio = check_real(self.ratio, "CenterCrop ratio", _RATIO_RANGE)
        if not MIN_CENTER_RATIO <= ratio <= 1:
            raise UsageError(f"CenterCrop ratio must be {_RATIO_RANGE}, got {self.ratio!r}")
        object.__setattr__(self, "ratio", ratio)

    def window(self, height: int, width: int) -> tuple[int, int, int]:
        """(top, left, side) of the square taken from a ``height`` × ``width`` image."""
        side = max(1, int(self.ratio * min(height, width)))
        return (height - side) // 2, (width - side) // 2, side

    def decode_scale(self, height: int, width: int) -> float:
        """The smallest fraction of full size a JPEG may be decoded at without losing pixels the
        crop needs: the crop's square must still be at least ``size`` on a side (1.0 when the
        crop enlarges)."""
        return min(1.0, self.size / (self.ratio * min(height, width)))

    def min_decode_size(self, height: int, width: int) -> tuple[int, int]:
        """(min height, min width) to ask a scaling JPEG decoder for, from ``decode_scale``."""
        scale = self.decode_scale(height, width)
        if scale >= 1.0:
            return height, width
        return math.ceil(height * scale), math.ceil(width * scale)

    def windows(self, heights: np.ndarray, widths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``window`` for many images at once: (tops, lefts, sides), int64 arrays."""
        heights, widths = np.asarray(heights, dtype=np.int64), np.asarray(widths, dtype=np.int64)
        sides = np.maximum(1, (self.ratio * np.minimum(heights, widths)).astype(np.int64))
        return (heights - sides) // 2, (widths - sides) // 2, sides

    def min_decode_sizes(self, heights: np.ndarray, widths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``min_decode_size`` for many images at once, (0, 0) where the crop enlarges (decode in full)."""
        heights, widths = np.asarray(heights, dtype=np.int64), np.asarray(widths, dtype=np.int64)
        scale = np.minimum(1.0, self.size / (self.ratio * np.minimum(heights, widths)))
        reduce = scale < 1.0
        return (np.where(reduce, np.ceil(heights * scale), 0).astype(np.int64),
                np.where(reduce, np.ceil(widths * scale), 0).astype(np.int64))

    def into(self, image: np.ndarray, out: torch.Tensor) -> None:
        """Crop and resize HxWx3 uint8 ``image`` into ``out`` (a 3×size×size uint8 tensor view of
        any memory layout, e.g. one slot of a batch)."""
        height, width = image.shape[:2]
        top, left, side = self.window(height, width)
        square = image[top : top + side, left : left + side]
        if side == self.size:
            np.copyto(out.numpy(), square.transpose(2, 0, 1))
            return
        _resize_into(np.ascontiguousarray(square), out)

    def __call__(self, image: Image.Image | np.ndarray | torch.Tensor) -> np.ndarray:
        if isinstance(image, Image.Image) and image.mode != "RGB":
            image = image.convert("RGB")
        array = as_chw(image).transpose(1, 2, 0)
        out = torch.empty((self.size, self.size, 3), dtype=torch.uint8)
        self.into(array, out.permute(2, 0, 1))
        return out.numpy()


def scaled_box(box: tuple[int, int, int, int], height: int, width: int, got_height: int,
               got_width: int) -> tuple[int, int, int, int]:
    """``box`` (top, left, height, width) of a ``height`` × ``width`` image, moved onto the same
    image decoded at ``got_height`` × ``got_width`` (a reduced DCT scale): edges rounded to the
    nearest pixel, at least one pixel on a side."""
    if (got_height, got_width) == (height, width):
        return box
    top, left, box_h, box_w = box
    sy, sx = got_height / height, got_width / width
    new_top, new_left = min(got_height - 1, int(top * sy + 0.5)), min(got_width - 1, int(left * sx + 0.5))
    bottom, right = min(got_height, int((top + box_h) * sy + 0.5)), min(got_width, int((left + box_w) * sx + 0.5))
    return new_top, new_left, max(1, bottom - new_top), max(1, right - new_left)


def scaled_boxes(boxes: np.ndarray, heights: np.ndarray, widths: np.ndarray, got_heights: np.ndarray,
                 got_widths: np.ndarray) -> np.ndarray:
    """``scaled_box`` for many boxes at once: ``boxes`` (B×4 top, left, height, width) moved onto
    their images decoded at ``got_heights`` × ``got_widths``; the same integers, row by row."""
    boxes = np.asarray(boxes, dtype=np.int64).reshape(-1, 4)
    heights, widths = np.asarray(heights, dtype=np.int64), np.asarray(widths, dtype=np.int64)
    got_h, got_w = np.asarray(got_heights, dtype=np.int64), np.asarray(got_widths, dtype=np.int64)
    top, left, box_h, box_w = boxes.T
    sy, sx = got_h / heights, got_w / widths
    new_top = np.minimum(got_h - 1, (top * sy + 0.5).astype(np.int64))
    new_left = np.minimum(got_w - 1, (left * sx + 0.5).astype(np.int64))
    bottom = np.minimum(got_h, ((top + box_h) * sy + 0.5).astype(np.int64))
    right = np.minimum(got_w, ((left + box_w) * sx + 0.5).astype(np.int64))
    moved = np.stack([new_top, new_left, np.maximum(1, bottom - new_top), np.maximum(1, right - new_left)], axis=1)
    same = (got_h == heights) & (got_w == widths)
    return np.where(same[:, None], boxes, moved)


def mirror_rows(images: torch.Tensor, mirrored: np.ndarray) -> None:
    """Mirror the images of ``images`` (B×3×H×W) whose ``mirrored`` entry is True, in place."""
    if mirrored.any():
        rows = torch.from_numpy(np.flatnonzero(mirrored))
        images[rows] = images[rows].flip(3)


def crop_box_into(image: np.ndarray, box: tuple[int, int, int, int], out: torch.Tensor) -> None:
    """Resize the ``box`` (top, left, height, width) of HxWx3 uint8 ``image`` into ``out`` (a
    3×S×S uint8 view of any layout): the resampling of ``RandomResizedCrop`` on both paths."""
    top, left, box_h, box_w = box
    region = image[top : top + box_h, left : left + box_w]
    if (box_h, box_w) == tuple(out.shape[1:]):
        np.copyto(out.numpy(), region.transpose(2, 0, 1))
        return
    if not region.flags.writeable:  # a view of the memory map: torch takes writable arrays only (the box alone is copied)
        region = region.copy()
    resize(torch.from_numpy(region).permute(2, 0, 1).unsqueeze(0), out.unsqueeze(0))


def _resize_into(image: np.ndarray, out: torch.Tensor) -> None:
    """Bilinear, antialiased resize of HxWx3 uint8 ``image`` into ``out`` (3×h×w uint8 view)."""
    resize(torch.from_numpy(image).permute(2, 0, 1).unsqueeze(0), out.unsqueeze(0))


def interleaved(image: torch.Tensor) -> bool:
    """Whether a 1×3×H×W view stores each pixel's 3 bytes together and a row's pixels side by side
    (rows may be any distance apart): what the compiled kernel reads and writes."""
    return image.stride(1) == 1 and image.stride(3) == 3


def resize(square: torch.Tensor, out: torch.Tensor) -> None:
    """Bilinear, antialiased resize of 1×3×h×w uint8 ``square`` (any strides) into 1×3×H×W ``out``.

    torch's fast uint8 kernel runs when ``out`` is channels-last (a slot of a channels-last batch,
    written in place: no copy); it makes a channels-last copy of ``square`` itself when needed, with
    the GIL released. Same pixels as ``F.interpolate(..., mode="bilinear", antialias=True)``, which
    is the fallback. The compiled kernel (``packload/core/resize_kernel.py``), when built, takes it instead
    for interleaved uint8 pixels: bit-exact with torch's kernel, and faster."""
    size = (out.shape[2], out.shape[3])
    if interleaved(square) and interleaved(out) and square.dtype == out.dtype == torch.uint8 \
            and square.device.type == out.device.type == "cpu" and resize_kernel.resize_region(
                square.data_ptr(), square.stride(2), square.shape[2], square.shape[3], out.data_ptr(), out.stride(2),
                size[0], size[1]):
        return  # the compiled kernel: the same pixels, faster (packload/core/resize_kernel.py)
    if out.is_contiguous(memory_format=torch.channels_last) and resize_into(square, out):
        return
    out.copy_(torch.nn.functional.interpolate(square, size=size, mode="bilinear", antialias=True,
                                              align_corners=False))
