"""Fill one preallocated uint8 batch from a pack: the work behind ``get_batch`` and ``PackLoader``.

Two routes, both writing straight into the batch (no per-sample tensors, nothing pickled):

* ``RawGather``: a ``raw`` pack's pixels need no decode. Each part (shard or LMDB chunk) is seen
  as an array whose element ``i`` is the ``record_bytes`` bytes starting at byte ``i`` (a stride
  of one byte), so all the records of a batch that live in one part are copied with a single
  NumPy gather. With ``verify`` each record's CRC-32 is checked first.
* ``fill_decoded``: every other payload is decoded (libjpeg-turbo when it is there, at a reduced DCT
  scale when the crop makes the image smaller; PIL otherwise) and either copied as it is (all images
  one size) or cropped and resized into its slot. With a crop into a channels-last batch, upright
  raw and JPEG records take a shorter route (``crop_fill.CropFill``): a whole batch in one native
  call, each JPEG decoded only over its box, the per-record bookkeeping done once per batch in
  NumPy. Same pixels as the general route, which takes the rest one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from packload.core.errors import PackFormatError, UsageError
from packload.core.format import PAYLOAD_FORMATS, SIDEWAYS_ORIENTATIONS
from packload.loaders.crop import CenterCrop, crop_box_into, mirror_rows, scaled_box
from packload.loaders.crop_fill import CropFill
from packload.loaders.decode import (
    DECODE_ERRORS,
    decode_array,
    decode_failure,
    raw_array,
)
from packload.loaders.random_crop import Draws, RandomResizedCrop
from packload.loaders.read import PackReader

Replace = Callable[[int, Exception], tuple[int, memoryview]]
_SOURCES_KEPT = 128  # parts' strided views kept
_FEW_PARTS = 8  # above this many parts in one batch, a per-record loop beats one gather per part


def _strided_records(view: memoryview, record_bytes: int) -> np.ndarray:
    """``view`` as an array of overlapping ``record_bytes``-byte items, item ``i`` at byte ``i``."""
    count = len(view) - record_bytes + 1
    if count <= 0:
        return np.empty(0, dtype=np.dtype((np.void, record_bytes)))
    return np.ndarray((count,), dtype=np.dtype((np.void, record_bytes)), buffer=view, strides=(1,))


class RawGather:
    """Gathers a raw pack's records into batches. Built once per open reader: it keeps the index
    columns it needs as plain int64 arrays and one strided view per part, so that a batch costs a
    few NumPy calls whatever its size."""

    def __init__(self, reader: PackReader) -> None:
        entries = reader.entries
        self.reader = reader
        self.parts = entries["part"].astype(np.int64)
        self.offsets = entries["payload_offset"].astype(np.int64)
        self.labels = entries["label"].astype(np.int64)
        lengths = entries["payload_len"]
        self.record_bytes = int(lengths[0]) if len(entries) else 0
        self.uniform = bool(len(entries)) and bool((lengths == self.record_bytes).all())
        self.one_part = bool(len(entries)) and bool((self.parts == self.parts[0]).all())
        heights, widths = entries["height"], entries["width"]
        same = bool(len(entries)) and bool((heights == heights[0]).all() and (widths == widths[0]).all())
        self.size: tuple[int, int] | None = (int(heights[0]), int(widths[0])) if same else None
        self._sources: dict[int, np.ndarray] = {}

    def _source(self, part: int) -> np.ndarray:
        source = self._sources.get(part)
        if source is None:
            if len(self._sources) >= _SOURCES_KEPT:  # each holds its part's map (and descriptor) open
                del self._sources[next(iter(self._sources))]
            source = self._sources[part] = _strided_records(self.reader.part_view(part), self.record_bytes)
        return source

    def __call__(self, positions: np.ndarray, out: np.ndarray | None = None, verify: bool = False) -> np.ndarray:
        """Records ``positions`` (0..records-1) as one B×H×W×3 uint8 array: written into ``out``
        (C-contiguous, each item one payload's size) when given, else freshly allocated (with no
        extra copy when the batch comes from one part)."""
        count = len(positions)
        if out is None:
            if self.size is None:
                raise UsageError(f"{self.reader.path}: raw images of different sizes cannot share a batch; "
                                 "pack with --size HxW, or give a crop")
            shape = (count, *self.size, 3)
            if self.one_part and not verify and count and not self.reader.ranged:
                gathered = self._gather(int(self.parts[0]), positions, self.offsets[positions], None, slice(None))
                return gathered.view(np.uint8).reshape(shape)
            out = np.empty(shape, dtype=np.uint8)
        if count == 0:
            return out
        record_bytes = out[0].nbytes
        if not self.uniform or record_bytes != self.record_bytes:
            lengths = self.reader.entries["payload_len"][positions]
            if (lengths != record_bytes).any():
                bad = int(positions[np.flatnonzero(lengths != record_bytes)[0]])
                raise UsageError(f"{self.reader.where(bad)}: payload of {int(lengths[lengths != record_bytes][0])} "
                                 f"bytes, not the {out.shape[1:]} pixels of the batch; pack with --size HxW or "
                                 "give a crop")
        # One record at a time, through the reader's checks; a pack at a URL so too, by its blocks
        # (a part's whole view would join a whole shard in memory).
        if verify or self.reader.ranged:
            flat = out.reshape(count, record_bytes)
            for k, view in enumerate(self.reader.payloads(positions, verify=verify)):
                flat[k] = np.frombuffer(view, np.uint8)
            return out
        dest = out.reshape(count, record_bytes).view(np.dtype((np.void, record_bytes))).reshape(count)
        offsets = self.offsets[positions]
        parts = self.parts[positions]
        unique_parts = np.unique(parts)
        if len(unique_parts) > _FEW_PARTS:  # scattered over many parts (LMDB chunks): record by record
            for k, (part, start) in enumerate(zip(parts.tolist(), offsets.tolist(), strict=True)):
                source = self._source(part)
                if start >= len(source):
                    raise PackFormatError(f"{self.reader.where(int(positions[k]))}: payload runs past the end of "
                                          "its part; the pack is damaged")
                dest[k] = source[start]
        else:
            for part in unique_parts.tolist():
                self._gather(part, positions, offsets, dest, parts == part)
        return out

    def _gather(self, part: int, positions: np.ndarray, offsets: np.ndarray, dest: np.ndarray | None,
                mine: slice | np.ndarray) -> np.ndarray:
        """The records of ``part`` among ``positions``, gathered into ``dest[mine]`` or returned."""
        source = self._source(part)
        starts = offsets[mine]
        if starts.size and int(starts.max()) >= len(source):
            first = int(positions[mine][np.argmax(starts)])
            raise PackFormatError(f"{self.reader.where(first)}: payload runs past the end of its part; "
                                  "the pack is damaged")
        if dest is None:
            return source[starts]
        dest[mine] = source[starts]
        return dest


def fill_decoded(reader: PackReader, positions: Sequence[int], payloads: Sequence[memoryview], out: torch.Tensor,
                 *, crop: CenterCrop | RandomResizedCrop | None, fast_jpeg: bool = True, exif_transpose: bool = False,
                 replace: Replace | None = None, fast_idct: bool = False, draws: Draws | None = None,
                 mirror: np.ndarray | None = None, rows: np.ndarray | None = None) -> list[int]:
    """Decode each payload into its slot of ``out`` (B×3×H×W uint8, any memory layout): cropped
    and resized by ``crop``, or copied as it is when every image already has the batch's size.
    ``payloads`` are the reader's views of records ``positions`` (``reader.payloads``).

    A payload that cannot be decoded raises ``PackFormatError`` naming the record, or, with
    ``replace``, is swapped for the record ``replace(index, error)`` gives (a ``RandomResizedCrop``
    then draws the replacement's box with the replaced record's key). ``fast_idct`` decodes JPEGs
    with libjpeg-turbo's fast integer IDCT; ``draws`` keys a ``RandomResizedCrop``'s boxes;
    ``mirror`` (a bool per record) mirrors those images horizontally. ``rows``: the slot of ``out``
    each record goes to (default: record ``k`` to slot ``k``), for a part of a larger batch.
    Returns the record numbers whose images fill the batch (``positions`` unless some were replaced)."""
    chosen = [int(index) for index in positions]
    if len(chosen) != len(payloads):
        raise ValueError(f"{len(chosen)} records but {len(payloads)} payloads")
    slots = np.arange(len(chosen), dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
    boxed = isinstance(crop, RandomResizedCrop)
    draws = draws or Draws()
    mirror = np.zeros(len(chosen), dtype=bool) if mirror is None else np.asarray(mirror, dtype=bool)
    boxes = crop.boxes(*upright_sizes(reader, chosen, exif_transpose), np.asarray(chosen), draws) if boxed else None
    fast: CropFill | None = None
    mirrored = np.zeros(len(chosen), dtype=bool)  # slots already mirrored (by the batch decoder)
    if crop is not None and chosen and out.is_contiguous(memory_format=torch.channels_last):
        fast = CropFill(reader, chosen, crop, boxes, out, fast_jpeg, exif_transpose, fast_idct, slots)
        mirrored = fast.fill_batch(mirror)
    for k in (range(len(chosen)) if fast is None else np.flatnonzero(~fast.done).tolist()):
        view = payloads[k]
        if fast is not None and fast.fill(k, view):
            continue
        index = key = chosen[k]
        box = tuple(boxes[k].tolist()) if boxed else None
        while True:
            try:
                pixels = _decode(reader, index, view, crop, fast_jpeg, exif_transpose, fast_idct, box)
                break
            except PackFormatError as exc:
                if replace is None:
                    raise
                index, view = replace(index, exc)
                index = chosen[k] = int(index)
                if boxed:
                    heights, widths = upright_sizes(reader, [index], exif_transpose)
                    box = crop.box(int(heights[0]), int(widths[0]), key, draws)
        slot = out[int(slots[k])]
        if boxed:
            heights, widths = upright_sizes(reader, [index], exif_transpose)
            crop_box_into(pixels, scaled_box(box, int(heights[0]), int(widths[0]), *pixels.shape[:2]), slot)
        elif crop is not None:
            crop.into(pixels, slot)
        elif pixels.shape[:2] != tuple(slot.shape[1:]):
            raise UsageError(f"{reader.where(index)}: image is {pixels.shape[0]}x{pixels.shape[1]}, the batch "
                             f"{slot.shape[1]}x{slot.shape[2]}; give a crop (or a transform) that makes one size")
        else:
            np.copyto(slot.numpy(), pixels.transpose(2, 0, 1))
    mirrored_slots = np.zeros(len(out), dtype=bool)
    mirrored_slots[slots] = mirror & ~mirrored
    mirror_rows(out, mirrored_slots)
    return chosen


def upright_sizes(reader: PackReader, positions: Sequence[int], exif_transpose: bool) -> tuple[np.ndarray, np.ndarray]:
    """(heights, widths) of records as they are shown: with ``exif_transpose``, orientations 5-8
    (stored sideways) swap their sides."""
    entries = reader.entries[np.asarray(positions, dtype=np.int64)]
    heights, widths = entries["height"].astype(np.int64), entries["width"].astype(np.int64)
    if exif_transpose:
        sideways = np.isin(entries["orientation"], SIDEWAYS_ORIENTATIONS)
        heights, widths = np.where(sideways, widths, heights), np.where(sideways, heights, widths)
    return heights, widths


def _decode(reader: PackReader, index: int, view: memoryview, crop: CenterCrop | RandomResizedCrop | None,
            fast_jpeg: bool, exif_transpose: bool, fast_idct: bool = False,
            box: tuple[int, int, int, int] | None = None) -> np.ndarray:
    """Record ``index``'s pixels, HxWx3 uint8 (a zero-copy view for raw); PackFormatError if damaged.
    ``box`` is a ``RandomResizedCrop``'s box (in the upright image), for a reduced-scale decode."""
    entry = reader.entries[index]
    width, height = int(entry["width"]), int(entry["height"])
    fmt = PAYLOAD_FORMATS[int(entry["format"])]
    orientation = int(entry["orientation"]) if exif_transpose else 0
    try:
        if fmt == "raw" and orientation == 0:
            return raw_array(view, width, height)
        mode = entry["mode"].decode("ascii", "replace")
        return decode_array(view, fmt, mode, width, height, _decode_size(crop, height, width, orientation, box),
                            orientation, fast_jpeg, fast_idct)
    except DECODE_ERRORS as exc:
        raise decode_failure(exc, reader.where(index)) from exc


def _decode_size(crop: CenterCrop | RandomResizedCrop | None, height: int, width: int, orientation: int,
                 box: tuple[int, int, int, int] | None = None) -> tuple[int, int] | None:
    """The smallest (height, width) a JPEG may be decoded at for ``crop`` (None: full size), in the
    upright image's terms (``decode_array`` turns them back for images stored sideways)."""
    if orientation in SIDEWAYS_ORIENTATIONS:  # stored sideways: the crop sees the upright size, sides swapped
        height, width = width, height
    if isinstance(crop, RandomResizedCrop):
        if box is None:
            return None
        size = crop.decode_size(box, height, width)
        return None if size == (0, 0) else size
    if crop is None or crop.decode_scale(height, width) >= 1.0:
        return None
    return crop.min_decode_size(height, width)
