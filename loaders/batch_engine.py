"""How one batch of a pack is made: the fast path behind ``PackedImageFolder.get_batch`` and
``get_encoded_batch``, which ``PackLoader``, ``batch_loader`` and a mix of packs call.

A batch is built in one of four ways, chosen here and nowhere else:

1. **cropped** (a ``CenterCrop`` or ``RandomResizedCrop``): each record decoded only over its crop
   and resized into its slot of one preallocated batch (``batch_fill.fill_decoded``: the compiled
   batch decoder for JPEGs and raw records, one by one for the rest), mirrored where the flips say;
   with ``rows``, into chosen rows of a larger batch (a mix's pack writing its part);
2. **raw, uncropped**: the records' pixels gathered straight from the memory map (``RawGather``);
3. **the caller's transform** (no crop): the Dataset's own samples, transformed, stacked;
4. **encoded**: the stored payloads, undecoded, in one flat tensor with offsets.

Damaged records raise, or under ``on_error="skip"`` give their place to the next intact record,
as the drop-in path does. The engine reads through ``BatchSource``, the part of the Dataset it needs.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch
from PIL import Image

from packload.core.errors import ChecksumError, PackFormatError, UsageError
from packload.core.format import FORMAT_CODE, SIDEWAYS_ORIENTATIONS
from packload.loaders.batch_fill import RawGather, Replace, fill_decoded
from packload.loaders.collate import collate_encoded
from packload.loaders.crop import CenterCrop, mirror_rows
from packload.loaders.params import check_batch_memory
from packload.loaders.random_crop import Draws, RandomResizedCrop, check_crop, flip_probability, flips
from packload.loaders.read import PackReader


class BatchSource(Protocol):
    """What the engine reads from the Dataset: its options, its reader, and its own batches where
    its transform decides the images (``PackedImageFolder`` is one)."""

    transform: Any
    exif_transpose: bool
    verify: bool
    on_error: str
    fast_jpeg: bool
    shown: str

    @property
    def encoding(self) -> str: ...

    def __len__(self) -> int: ...

    def reader(self) -> PackReader: ...

    def transformed_batch(self, positions: np.ndarray, pin_memory: bool) -> tuple[torch.Tensor, Any]:
        """The records' samples through the Dataset's transform, stacked, and their targets."""
        ...

    def batch_targets(self, reader: PackReader, chosen: Sequence[int] | np.ndarray, labels: torch.Tensor) -> Any:
        """The targets of records ``chosen`` (``labels``: their class indices), batched."""
        ...


class BatchEngine:
    """Makes whole batches of ``source``'s pack (see the module's notes); one per Dataset, holding
    only what this process built for it (the raw gatherer of its reader)."""

    def __init__(self, source: BatchSource) -> None:
        self.source = source
        self._gather: RawGather | None = None

    def get_batch(self, indices: Sequence[int], channels_last: bool = False, *,
                  crop: CenterCrop | RandomResizedCrop | None = None, pin_memory: bool = False,
                  fast_idct: bool = False, flip: bool | float = False, draws: Draws | None = None,
                  out: torch.Tensor | None = None, rows: np.ndarray | None = None) -> tuple[torch.Tensor, Any]:
        """``(B×3×H×W uint8, targets)`` for records ``indices``: ``PackedImageFolder.get_batch``."""
        source = self.source
        flip = flip_probability(flip)
        crop = check_crop(crop)  # a string or a torchvision transform: one line here, not an AttributeError later
        reader = source.reader()
        positions = reader.positions(indices)
        if crop is not None:  # a batch larger than the memory there is: one line, not torch's allocation error
            check_batch_memory(len(positions), crop.size, "crop size")
        draws = draws or Draws()
        if rows is not None:
            rows = _checked_rows(rows, out, crop, channels_last, len(positions))
        if crop is None and source.transform is not None:  # the caller's transform decides the size
            batch, labels = source.transformed_batch(positions, pin_memory)
            batch = batch.contiguous(memory_format=torch.channels_last) if channels_last else batch
        elif crop is None and source.encoding == "raw" and not source.exif_transpose:
            try:
                batch, labels = self._gather_batch(reader, positions, channels_last, pin_memory)
            except ChecksumError:
                if source.on_error == "raise":
                    raise  # else decode record by record below, replacing the damaged ones
                batch, labels = self._decode_batch(reader, positions, crop, channels_last, pin_memory)
        else:  # the decode mirrors the images itself (the batch decoder while the slot is in cache)
            mirror = flips(positions, draws, flip) if flip else None
            return self._decode_batch(reader, positions, crop, channels_last, pin_memory,
                                      out if crop is not None else None, fast_idct, draws, mirror, rows)
        if flip:
            mirror_rows(batch, flips(positions, draws, flip))
        return batch, labels

    def get_encoded_batch(self, indices: Sequence[int], *,
                          pin_memory: bool = False) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """The stored payloads, undecoded: ``PackedImageFolder.get_encoded_batch``."""
        reader = self.source.reader()
        positions = reader.positions(indices)
        chosen, views = self._payloads(reader, positions)
        labels = reader.entries["label"][np.asarray(chosen, dtype=np.int64)].tolist()
        data, offsets, classes = collate_encoded(list(zip(views, labels, strict=True)), pin_memory=pin_memory)
        return data, offsets, self.source.batch_targets(reader, chosen, classes)

    def close(self) -> None:
        """Drop what was built for this process's reader."""
        self._gather = None

    # -- the ways a batch is made -----------------------------------------------------------
    def _gather_batch(self, reader: PackReader, positions: np.ndarray, channels_last: bool,
                      pin_memory: bool) -> tuple[torch.Tensor, Any]:
        """A raw batch copied straight from the memory map (no decode)."""
        pin = pin_memory and torch.cuda.is_available()
        if self._gather is None or self._gather.reader is not reader:
            self._gather = RawGather(reader)
        plan = self._gather
        if pin or self.source.verify or plan.size is None:
            height, width = plan.size if plan.size is not None else self._batch_size_of(reader, positions, None)
            hwc = torch.empty((len(positions), height, width, 3), dtype=torch.uint8, pin_memory=pin and channels_last)
            plan(positions, hwc.numpy(), self.source.verify)
        else:
            hwc = torch.from_numpy(plan(positions))
        images = hwc.permute(0, 3, 1, 2)
        if not channels_last:
            images = torch.empty(images.shape, dtype=torch.uint8, pin_memory=pin).copy_(images)
        labels = torch.from_numpy(plan.labels[positions])
        return images, self.source.batch_targets(reader, positions, labels.pin_memory() if pin else labels)

    def _decode_batch(self, reader: PackReader, positions: np.ndarray, crop: CenterCrop | RandomResizedCrop | None,
                      channels_last: bool, pin_memory: bool, images: torch.Tensor | None = None,
                      fast_idct: bool = False, draws: Draws | None = None, mirror: np.ndarray | None = None,
                      rows: np.ndarray | None = None) -> tuple[torch.Tensor, Any]:
        """A batch decoded (and cropped) record by record, damaged records replaced under ``on_error="skip"``;
        written into ``images`` when it has the batch's shape and layout, else into a new tensor (with
        ``rows``, into those rows of ``images``, checked by the caller); the images ``mirror`` marks
        mirrored."""
        pin = pin_memory and torch.cuda.is_available()
        if rows is None:
            height, width = self._batch_size_of(reader, positions, crop)
            count = len(positions)
            layout = torch.channels_last if channels_last else torch.contiguous_format
            if images is None or images.shape != (count, 3, height, width) or images.dtype != torch.uint8 \
                    or not images.is_contiguous(memory_format=layout):
                images = torch.empty((count, 3, height, width), dtype=torch.uint8, pin_memory=pin,
                                     memory_format=layout)
        chosen, views = self._payloads(reader, positions)
        chosen = fill_decoded(reader, chosen, views, images, crop=crop, fast_jpeg=self.source.fast_jpeg,
                              exif_transpose=self.source.exif_transpose, replace=self._replacer(reader),
                              fast_idct=fast_idct, draws=draws, mirror=mirror, rows=rows)
        labels = torch.from_numpy(reader.entries["label"][np.asarray(chosen, dtype=np.int64)].astype(np.int64))
        assert images is not None
        return images, self.source.batch_targets(reader, chosen, labels.pin_memory() if pin else labels)

    def _batch_size_of(self, reader: PackReader, positions: np.ndarray,
                       crop: CenterCrop | RandomResizedCrop | None) -> tuple[int, int]:
        """(height, width) of the batch: the crop's, or the one size every record has."""
        if crop is not None:
            return crop.size, crop.size
        entries = reader.entries[positions]
        heights, widths = entries["height"], entries["width"]
        if self.source.exif_transpose:  # orientations 5-8 are stored sideways
            sideways = np.isin(entries["orientation"], SIDEWAYS_ORIENTATIONS)
            heights, widths = np.where(sideways, widths, heights), np.where(sideways, heights, widths)
        if len(positions) and ((heights != heights[0]).any() or (widths != widths[0]).any()):
            raise UsageError(f"{self.source.shown}: images of different sizes cannot share a batch; pack with "
                             "--size HxW, or give a crop (or a transform) that makes one size")
        if not len(positions):
            return 0, 0
        height, width = int(heights[0]), int(widths[0])
        limit = Image.MAX_IMAGE_PIXELS  # decoded images are refused past it: no batch is allocated for them
        if limit and height * width > 2 * limit and (entries["format"] != FORMAT_CODE["raw"]).any():
            raise PackFormatError(f"{reader.where(int(positions[0]))}: the index gives {width}x{height} pixels, "
                                  f"more than the decompression-bomb limit ({2 * limit} pixels); if the images are "
                                  "genuine, raise PIL.Image.MAX_IMAGE_PIXELS on purpose before reading")
        return height, width

    # -- damaged records ---------------------------------------------------------------------
    def _replacer(self, reader: PackReader) -> Replace | None:
        """With ``on_error="skip"``: the next intact record after a damaged one (None: raise)."""
        if self.source.on_error == "raise":
            return None

        def replace(index: int, error: Exception) -> tuple[int, memoryview]:
            warnings.warn(f"skipping damaged {reader.where(index)}: {error}", stacklevel=4)
            chosen, views = self._intact(reader, [(index + 1) % len(self.source)])
            return chosen[0], views[0]

        return replace

    def _payloads(self, reader: PackReader, positions: np.ndarray) -> tuple[list[int], list[memoryview]]:
        """The records' payloads (checked under ``verify``); under ``on_error="skip"`` a damaged one's
        place goes to the next intact record. Returns the record numbers used and their payloads."""
        try:
            return positions.tolist(), reader.payloads(positions, verify=self.source.verify)
        except ChecksumError:
            if self.source.on_error == "raise":
                raise
            return self._intact(reader, positions.tolist())

    def _intact(self, reader: PackReader, positions: list[int]) -> tuple[list[int], list[memoryview]]:
        """Each record's payload, or, for a damaged one, the next intact record's (with a warning)."""
        chosen, views = [], []
        count = len(self.source)
        for index in positions:
            for attempt in range(count):
                candidate = (index + attempt) % count
                try:
                    views.append(reader.payload(candidate, verify=True))
                    chosen.append(candidate)
                    break
                except ChecksumError as exc:
                    warnings.warn(f"skipping damaged {reader.where(candidate)}: {exc}", stacklevel=4)
            else:
                raise PackFormatError(f"{self.source.shown}: no intact record left to return")
        return chosen, views


def _checked_rows(rows: np.ndarray, out: torch.Tensor | None, crop: CenterCrop | RandomResizedCrop | None,
                  channels_last: bool, count: int) -> np.ndarray:
    """``rows`` as int64, once ``out`` is known to be a batch of the crop's size and layout that
    holds them, one per index; ValueError otherwise."""
    rows = np.asarray(rows, dtype=np.int64)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    if crop is None or out is None or len(rows) != count or out.dtype != torch.uint8 \
            or tuple(out.shape[1:]) != (3, crop.size, crop.size) or not out.is_contiguous(memory_format=layout) \
            or (len(rows) and (rows.min() < 0 or rows.max() >= len(out))):
        raise ValueError("rows= needs a crop and an out batch of the crop's size and layout that holds those "
                         "rows, one per index")
    return rows
