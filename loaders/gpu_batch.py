"""The device-independent half of building batches on a GPU: the plan of a batch and the crop.

``plan_batch`` splits a batch into the records a GPU JPEG decoder takes (upright JPEGs in RGB or
greyscale, within the decompression-bomb limit) and the others (PNG in a ``keep`` pack, raw
pixels, EXIF-rotated images, CMYK JPEGs), which the CPU path decodes; it gathers every record's
box in the stored image (``RandomResizedCrop``'s draws, keyed by seed, epoch, rank and record as
on the CPU path, so both paths crop the same boxes; ``CenterCrop``'s centred square; or the whole
image), its flip and its label. ``crop_resize_flip`` then resizes each decoded image's box into its
slot of the batch (bilinear, antialiased: ``torch.nn.functional.interpolate``, the filter of the
CPU path) and mirrors the flipped ones, on tensors of any device: the tests run it on CPU tensors,
``loaders/gpu_decode.py`` on CUDA ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from packload.core.errors import UsageError
from packload.core.format import FORMAT_CODE, SIDEWAYS_ORIENTATIONS
from packload.loaders.crop import CenterCrop
from packload.loaders.random_crop import Draws, RandomResizedCrop, flips

GPU_FORMATS = (FORMAT_CODE["JPEG"], FORMAT_CODE["MPO"])  # payload formats a GPU JPEG decoder takes
GPU_MODES = (b"RGB", b"L")  # stored modes it turns into RGB as the CPU path does (not CMYK, YCCK)
_UPRIGHT = (0, 1)  # EXIF orientations that need no turn: none, or "normal"


@dataclass(frozen=True)
class BatchPlan:
    """What one batch needs, row by row (rows in the batch's order).

    ``positions``: record numbers; ``on_device``: whether the GPU decoder takes the row; ``boxes``:
    (top, left, height, width) in the stored image, for the rows on the device; ``flips``: rows to
    mirror; ``labels``: int64 class indices; ``size``: (height, width) of the batch's images."""

    positions: np.ndarray
    on_device: np.ndarray
    boxes: np.ndarray
    flips: np.ndarray
    labels: np.ndarray
    size: tuple[int, int]

    @property
    def device_rows(self) -> np.ndarray:
        """Rows the GPU decoder takes."""
        return np.flatnonzero(self.on_device)

    @property
    def host_rows(self) -> np.ndarray:
        """Rows the CPU path decodes (and the batch copies up)."""
        return np.flatnonzero(~self.on_device)


def plan_batch(entries: np.ndarray, positions: np.ndarray, crop: CenterCrop | RandomResizedCrop | None,
               flip: float, draws: Draws, exif_transpose: bool = False) -> BatchPlan:
    """The plan of the batch of records ``positions``; ``entries`` is the pack's whole index
    (``PackReader.entries``). Without a crop every image must have one size (UsageError if not, as
    on the CPU path)."""
    positions = np.asarray(positions, dtype=np.int64)
    rows = entries[positions]
    heights, widths = rows["height"].astype(np.int64), rows["width"].astype(np.int64)
    upright = np.isin(rows["orientation"], _UPRIGHT) if exif_transpose else np.ones(len(rows), dtype=bool)
    on_device = np.isin(rows["format"], GPU_FORMATS) & np.isin(rows["mode"], GPU_MODES) & upright
    if Image.MAX_IMAGE_PIXELS:  # a possible decompression bomb goes to the CPU path, which refuses it clearly
        on_device &= heights * widths <= 2 * Image.MAX_IMAGE_PIXELS
    if isinstance(crop, RandomResizedCrop):
        boxes = crop.boxes(heights, widths, positions, draws)
        size = (crop.size, crop.size)
    elif isinstance(crop, CenterCrop):
        sides = np.maximum(1, (crop.ratio * np.minimum(heights, widths)).astype(np.int64))  # as CenterCrop.window
        boxes = np.stack([(heights - sides) // 2, (widths - sides) // 2, sides, sides], axis=1)
        size = (crop.size, crop.size)
    elif crop is None:
        size = _one_size(rows, heights, widths, exif_transpose)
        boxes = np.stack([np.zeros_like(heights), np.zeros_like(widths), heights, widths], axis=1)
    else:
        raise UsageError(f"crop must be a CenterCrop, a RandomResizedCrop, an int or None, got {crop!r}")
    labels = rows["label"].astype(np.int64)
    return BatchPlan(positions, on_device, boxes.reshape(-1, 4), flips(positions, draws, flip), labels, size)


def _one_size(rows: np.ndarray, heights: np.ndarray, widths: np.ndarray, exif_transpose: bool) -> tuple[int, int]:
    """The one (height, width) of every image in the batch, as shown (UsageError if they differ)."""
    if not len(rows):
        return 0, 0
    if exif_transpose:  # orientations 5-8 are stored sideways
        sideways = np.isin(rows["orientation"], SIDEWAYS_ORIENTATIONS)
        heights, widths = np.where(sideways, widths, heights), np.where(sideways, heights, widths)
    if (heights != heights[0]).any() or (widths != widths[0]).any():
        raise UsageError("images of different sizes cannot share a batch; give crop= (CenterCrop or "
                         "RandomResizedCrop) or pack with --size HxW")
    return int(heights[0]), int(widths[0])


def crop_resize_flip(images: Sequence[torch.Tensor], origins: Sequence[tuple[int, int]], boxes: np.ndarray,
                     mirrored: np.ndarray, out: torch.Tensor) -> None:
    """Resize box ``k`` of ``images[k]`` (3×h×w uint8, the stored image or the part of it that starts at
    ``origins[k]`` = (top, left): a region decode) into ``out[k]`` (B×3×H×W uint8, any layout, on the
    images' device), mirrored where ``mirrored[k]``.

    Bilinear with antialiasing (``interpolate``) in float32, rounded to the nearest level: within a
    level or two of the CPU path's uint8 kernel; a box already of the output's size is copied as it is.
    One float batch collects the results, so the rounding, the flips and the conversion to uint8 are
    one call each for the whole batch."""
    count = len(images)
    if count != len(out) or count != len(boxes) or count != len(origins):
        raise ValueError(f"{count} images, {len(origins)} origins, {len(boxes)} boxes and {len(out)} slots")
    if not count:
        return
    size = (int(out.shape[2]), int(out.shape[3]))
    staged = torch.empty(out.shape, dtype=torch.float32, device=out.device).contiguous(
        memory_format=torch.channels_last if out.is_contiguous(memory_format=torch.channels_last)
        else torch.contiguous_format)
    for k, (image, (oy, ox), box) in enumerate(zip(images, origins, boxes.tolist(), strict=True)):
        top, left, box_h, box_w = box
        top, left = top - oy, left - ox
        if top < 0 or left < 0 or top + box_h > image.shape[1] or left + box_w > image.shape[2]:
            raise ValueError(f"box {box} lies outside image {k} ({tuple(image.shape[1:])} at {(oy, ox)})")
        region = image[:, top : top + box_h, left : left + box_w].unsqueeze(0)
        if (box_h, box_w) == size:
            staged[k].copy_(region[0])
        else:
            staged[k].copy_(torch.nn.functional.interpolate(region.float(), size=size, mode="bilinear",
                                                            antialias=True, align_corners=False)[0])
    flipped = np.flatnonzero(np.asarray(mirrored, dtype=bool))
    if len(flipped):
        rows = torch.from_numpy(flipped).to(out.device)
        staged.index_copy_(0, rows, staged.index_select(0, rows).flip(-1))
    out.copy_(staged.round_().clamp_(0, 255))
