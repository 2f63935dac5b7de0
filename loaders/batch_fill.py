"""Fill one preallocated uint8 batch from a pack: the work behind ``get_batch`` and ``PackLoader``.

Two routes, both writing straight into the batch (no per-sample tensors, nothing pickled):

* ``RawGather``: a ``raw`` pack's pixels need no decode. Each part (shard or LMDB chunk) is seen
  as an array whose element ``i`` is the ``record_bytes`` bytes starting at byte ``i`` (a stride
  of one byte), so all the records of a batch that live in one part are copied with a single
  NumPy gather. With ``verify`` each record's CRC-32 is checked first.
* ``fill_decoded``: every other payload is decoded (libjpeg-turbo through simplejpeg when
  installed, at a reduced DCT scale when a ``CenterCrop`` makes the image smaller; PIL otherwise)
  and either copied as it is (all images one size) or cropped and resized into its slot. With a
  crop into a channels-last batch, upright raw and libjpeg-turbo JPEG records take a shorter
  route (``_CropFill``): the square is copied straight from the memory map (or the JPEG decoded
  into one buffer reused for the batch) and resized into its slot by one torch call, with the
  per-record bookkeeping done once per batch in NumPy. Same pixels as the general route. A
  ``RandomResizedCrop`` draws every box of the batch at once and takes ``box_fill.BoxFill``'s
  route, the same for boxes of any shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property

import numpy as np
import torch
from PIL import Image

from packload.core import resize_kernel
from packload.core.errors import PackFormatError, UsageError
from packload.core.format import FORMAT_CODE, PAYLOAD_FORMATS
from packload.loaders.box_fill import BoxFill
from packload.loaders.crop import CenterCrop, crop_box_into, interleaved, mirror_rows, resize, scaled_box
from packload.loaders.decode import (
    DECODE_ERRORS,
    JPEG_START,
    decode_array,
    decode_failure,
    raw_array,
    scaled_from,
    simplejpeg,
)
from packload.loaders.jpeg_fill import fill_jpegs
from packload.loaders.prefetch import distinct
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
                 mirror: np.ndarray | None = None) -> list[int]:
    """Decode each payload into its slot of ``out`` (B×3×H×W uint8, any memory layout): cropped
    and resized by ``crop``, or copied as it is when every image already has the batch's size.
    ``payloads`` are the reader's views of records ``positions`` (``reader.payloads``).

    A payload that cannot be decoded raises ``PackFormatError`` naming the record, or, with
    ``replace``, is swapped for the record ``replace(index, error)`` gives (a ``RandomResizedCrop``
    then draws the replacement's box with the replaced record's key). ``fast_idct`` decodes JPEGs
    with libjpeg-turbo's fast integer IDCT; ``draws`` keys a ``RandomResizedCrop``'s boxes;
    ``mirror`` (a bool per slot) mirrors those slots horizontally.
    Returns the record numbers whose images fill the batch (``positions`` unless some were replaced)."""
    chosen = [int(index) for index in positions]
    if len(chosen) != len(payloads):
        raise ValueError(f"{len(chosen)} records but {len(payloads)} payloads")
    boxed = isinstance(crop, RandomResizedCrop)
    draws = draws or Draws()
    mirror = np.zeros(len(chosen), dtype=bool) if mirror is None else np.asarray(mirror, dtype=bool)
    boxes = crop.boxes(*upright_sizes(reader, chosen, exif_transpose), np.asarray(chosen), draws) if boxed else None
    fast: _CropFill | BoxFill | None = None
    mirrored = np.zeros(len(chosen), dtype=bool)  # slots already mirrored (by the batch decoder)
    if crop is not None and chosen and out.is_contiguous(memory_format=torch.channels_last):
        jpeg = fast_jpeg and simplejpeg is not None
        if boxed:
            fast = BoxFill(reader, chosen, crop, boxes, out, jpeg, exif_transpose, fast_idct)
        else:
            fast = _CropFill(reader, chosen, crop, out, jpeg, exif_transpose, fast_idct)
            fast.fill_raw_squares()
        mirrored = fast.fill_jpegs(mirror)
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
        slot = out[k]
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
    mirror_rows(out, mirror & ~mirrored)
    return chosen


def upright_sizes(reader: PackReader, positions: Sequence[int], exif_transpose: bool) -> tuple[np.ndarray, np.ndarray]:
    """(heights, widths) of records as they are shown: with ``exif_transpose``, orientations 5-8
    (stored sideways) swap their sides."""
    entries = reader.entries[np.asarray(positions, dtype=np.int64)]
    heights, widths = entries["height"].astype(np.int64), entries["width"].astype(np.int64)
    if exif_transpose:
        sideways = np.isin(entries["orientation"], (5, 6, 7, 8))
        heights, widths = np.where(sideways, widths, heights), np.where(sideways, heights, widths)
    return heights, widths


class _CropFill:
    """The common cases of a cropped batch with as little Python per image as possible: raw
    pixels, and JPEGs decoded by libjpeg-turbo, both upright. The index columns and the raw
    images' squares are worked out once per batch; each image goes through one scratch buffer
    reused for the whole batch (no allocation per image), and torch resizes its square straight
    into the image's slot in one call (the same call as ``CenterCrop``, so the same pixels).
    ``fill`` returns False for anything else (other formats, EXIF rotation, a payload that does not
    decode), which the caller then takes through the general route: same pixels, same errors."""

    def __init__(self, reader: PackReader, positions: list[int], crop: CenterCrop, out: torch.Tensor,
                 jpeg: bool, exif_transpose: bool, fast_idct: bool) -> None:
        entries = reader.entries[np.asarray(positions, dtype=np.int64)]
        heights, widths = entries["height"].astype(np.int64), entries["width"].astype(np.int64)
        sides = np.maximum(1, (crop.ratio * np.minimum(heights, widths)).astype(np.int64))  # as CenterCrop.window
        raw = (entries["format"] == FORMAT_CODE["raw"]) & (sides != crop.size)
        if exif_transpose:
            raw &= entries["orientation"] == 0
        # raw: (payload bytes, side, byte offset of the square, row stride), or None for the general route
        self.raw_columns = (raw, heights * widths * 3, sides, ((heights - sides) // 2 * widths + (widths - sides) // 2) * 3,
                            widths * 3)
        jpegs = np.isin(entries["format"], [FORMAT_CODE["JPEG"], FORMAT_CODE["MPO"]])
        jpegs &= np.isin(entries["mode"], [b"RGB", b"L"]) & jpeg
        if Image.MAX_IMAGE_PIXELS:  # a possible decompression bomb takes the general route (a clear error)
            jpegs &= heights * widths <= 2 * Image.MAX_IMAGE_PIXELS
        if exif_transpose:
            jpegs &= entries["orientation"] == 0
        self.jpegs, self.height_array, self.width_array = jpegs, heights, widths
        self.crop = crop
        self.fast_idct = fast_idct
        # Sized by the records that take this route only: raw ones (their sizes checked against their
        # payloads when the pack was opened) and JPEGs within the decompression-bomb limit.
        fast = raw | jpegs
        self.scratch_bytes = int((heights * widths)[fast].max()) * 3 if fast.any() else 0
        # the compiled kernel (when built) resizes straight from the map or the decode buffer
        self.kernel = resize_kernel.available() and bool(len(positions)) and interleaved(out)
        self.reader, self.positions, self.out = reader, np.asarray(positions, dtype=np.int64), out
        self.done = np.zeros(len(positions), dtype=bool)  # filled by fill_raw_squares and fill_jpegs

    @cached_property
    def columns(self) -> tuple[list[tuple[int, ...] | None], list[bool], list[int], list[int]]:
        """Per record, for ``fill``: the raw square's (payload bytes, side, offset, row stride) or None,
        JPEG or not, height, width."""
        raw = [columns[1:] if columns[0] else None
               for columns in zip(*(column.tolist() for column in self.raw_columns), strict=True)]
        return raw, self.jpegs.tolist(), self.height_array.tolist(), self.width_array.tolist()

    @cached_property
    def slots(self) -> tuple[torch.Tensor, ...]:
        """1×3×S×S channels-last views of the batch, one per image (made when one is needed)."""
        return self.out.split(1)

    @cached_property
    def scratch(self) -> np.ndarray:
        """The buffer every image of the batch that ``fill`` takes is decoded or copied into."""
        return np.empty(self.scratch_bytes, dtype=np.uint8)

    @cached_property
    def flat(self) -> torch.Tensor:
        return torch.from_numpy(self.scratch)

    def fill_jpegs(self, mirror: np.ndarray) -> np.ndarray:
        """Decode, crop and resize every JPEG of the batch that the compiled batch decoder takes, in
        one call (one GIL release for all of them), mirroring those ``mirror`` asks for; ``fill``
        then skips them. Returns which slots it mirrored."""
        rows = np.flatnonzero(self.jpegs & ~self.done)
        if not self.kernel or not len(rows):
            return np.zeros(len(self.done), dtype=bool)
        records = self.positions[rows]
        entries = self.reader.entries
        min_sizes = self.crop.min_decode_sizes(entries["height"][records], entries["width"][records])

        def windows(heights: np.ndarray, widths: np.ndarray) -> np.ndarray:
            tops, lefts, sides = self.crop.windows(heights, widths)
            return np.stack([tops, lefts, sides, sides], axis=1)

        done = fill_jpegs(self.reader, records, rows, min_sizes, windows, self.out, mirror[rows], self.fast_idct)
        self.done[rows[done]] = True
        mirrored = np.zeros(len(self.done), dtype=bool)
        mirrored[rows[done]] = mirror[rows[done]]
        return mirrored

    def fill_raw_squares(self) -> None:
        """Crop and resize every raw image of the batch that the compiled kernel takes, in one call
        (one GIL release for all of them), straight from the memory map; ``fill`` then skips them.
        Addresses come from the index: the part's map, the payload's offset, the square's; only
        records whose stored length is their pixels' are taken (others go through ``fill``)."""
        reader, size = self.reader, self.crop.size
        raw, nbytes, sides, square_at, row_bytes = self.raw_columns
        rows = np.flatnonzero(raw)
        if not self.kernel or not len(rows) or reader.ranged:  # a pack at a URL has no map of its parts
            return
        records = self.positions[rows]
        entries = reader.entries
        ok = (entries["payload_len"][records].astype(np.int64) == nbytes[rows]) & \
            resize_kernel.squares_applicable(sides[rows], size)
        if not ok.any():
            return
        rows, records = rows[ok], records[ok]
        parts = entries["part"][records].astype(np.int64)
        unique_parts = distinct(parts)
        bases = np.array([np.frombuffer(reader.part_view(part), np.uint8).ctypes.data for part in unique_parts.tolist()],
                         dtype=np.int64)
        sources = bases[np.searchsorted(unique_parts, parts)] + entries["payload_offset"][records].astype(np.int64) \
            + square_at[rows]
        out = self.out
        dests = out.data_ptr() + rows * out.stride(0)
        if resize_kernel.resize_squares(sources.astype(np.uint64), row_bytes[rows], sides[rows],
                                        dests.astype(np.uint64), out.stride(2), size):
            self.done[rows] = True

    def fill(self, k: int, view: memoryview) -> bool:
        """Crop and resize image ``k`` into its slot; False if it must take the general route."""
        if self.done[k]:
            return True
        raws, jpeg, heights, widths = self.columns
        raw = raws[k]
        if raw is not None:
            nbytes, side, offset, stride = raw
            if len(view) != nbytes:
                return False
            square = np.ndarray((side, side, 3), np.uint8, view, offset, (stride, 3, 1))
            if self.kernel and self._resize(square.ctypes.data, stride, side, k):
                return True
            np.copyto(np.ndarray((side, side, 3), np.uint8, self.scratch), square)  # one copy, straight from the map
            square = self.flat.as_strided((1, 3, side, side), (side * side * 3, 1, side * 3, 3))
        elif jpeg[k] and view[:3] == JPEG_START:  # only what starts as a JPEG reaches libjpeg-turbo
            try:  # sizes from the index, no header call: each call into simplejpeg gives the GIL up and
                # must win it back, which a training loop holding the GIL makes slow (benchmarks/bench_gil.py).
                # An image larger than the index says does not fit the buffer: simplejpeg refuses it.
                min_h, min_w = _decode_size(self.crop, heights[k], widths[k], 0) or (0, 0)
                pixels = simplejpeg.decode_jpeg(view, colorspace="RGB", fastdct=self.fast_idct, min_height=min_h,
                                                min_width=min_w, buffer=self.scratch)
            except DECODE_ERRORS:
                return False  # the general route decides: PIL, or a clear error naming the record
            height, width = pixels.shape[:2]
            if not scaled_from(height, width, heights[k], widths[k]):
                return False  # not the size the index gives: the general route names the record
            top, left, side = self.crop.window(height, width)
            if self.kernel and side != self.crop.size and \
                    self._resize(self.scratch.ctypes.data + (top * width + left) * 3, width * 3, side, k):
                return True
            square = self.flat.as_strided((1, 3, side, side), (height * width * 3, 1, width * 3, 3),
                                          (top * width + left) * 3)
            if side == self.crop.size:
                self.slots[k].copy_(square)
                return True
        else:
            return False
        resize(square, self.slots[k])
        return True

    def _resize(self, source: int, row_bytes: int, side: int, k: int) -> bool:
        """The ``side`` × ``side`` square at address ``source`` into slot ``k`` by the compiled kernel
        (False: it does not apply, use ``resize``)."""
        slot = self.slots[k]
        size = self.crop.size
        return resize_kernel.resize_region(source, row_bytes, side, side, slot.data_ptr(), slot.stride(2), size, size)


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
    if orientation in (5, 6, 7, 8):  # stored sideways: the crop sees the upright size, sides swapped
        height, width = width, height
    if isinstance(crop, RandomResizedCrop):
        if box is None:
            return None
        size = crop.decode_size(box, height, width)
        return None if size == (0, 0) else size
    if crop is None or crop.decode_scale(height, width) >= 1.0:
        return None
    return crop.min_decode_size(height, width)
