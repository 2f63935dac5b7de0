"""The short route of a cropped batch: each record's box decoded and resized straight into its slot.

One route for both crops. A ``CenterCrop``'s box is its window in the image as decoded (at the
smallest DCT scale that keeps the window at least the output's size); a ``RandomResizedCrop``'s box
is drawn in the stored image and moved onto the image as decoded (``crop.scaled_boxes``). Either
way, the batch is laid out from the pack's index in NumPy first (which records take this route,
the scale each JPEG decodes at, its box there), then:

1. ``fill_batch``: every upright JPEG and raw record the compiled batch decoder takes, in one native
   call (``jpeg_fill.fill_jpegs``): each JPEG decoded only over its box, raw pixels resized from
   where they lie in the memory map;
2. ``fill``: one record at a time, what that call left (or everything, where the decoder is not
   there): raw boxes resized from the map, JPEGs decoded whole by simplejpeg into one buffer reused
   for the batch, the box resized by ``crop.resize``.

The pixels are the same on both: the same decode (libjpeg-turbo at the same scale; decoding only the
box gives the full decode's pixels), the same resampling. ``fill`` returns False for anything else
(other formats, EXIF rotation, CMYK, a payload that does not decode, a JPEG whose header does not
give the index's size), which the caller takes through the general route: PIL, or an error naming
the record, the same on every route.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
import torch
from PIL import Image

from packload.core import resize_kernel
from packload.core.format import FORMAT_CODE
from packload.core.jpeg_scans import too_many_scans
from packload.loaders.crop import CenterCrop, interleaved, resize, scaled_boxes
from packload.loaders.decode import DECODE_ERRORS, JPEG_START, dct_scales, simplejpeg
from packload.loaders.jpeg_fill import fill_jpegs
from packload.loaders.random_crop import RandomResizedCrop
from packload.loaders.read import PackReader


class CropFill:
    """Fills the slots of ``out`` (a channels-last N×3×S×S batch) with the crops of records
    ``positions``: ``crop``'s windows for a ``CenterCrop``, ``boxes`` (B×4: top, left, height,
    width, in the stored images) for a ``RandomResizedCrop``. Record ``k`` goes to slot ``rows[k]``
    (``k`` for a whole batch; others for a part of a larger one: a mix's pack)."""

    def __init__(self, reader: PackReader, positions: list[int], crop: CenterCrop | RandomResizedCrop,
                 boxes: np.ndarray | None, out: torch.Tensor, jpeg: bool, exif_transpose: bool,
                 fast_idct: bool, rows: np.ndarray) -> None:
        entries = reader.entries[np.asarray(positions, dtype=np.int64)]
        heights, widths = entries["height"].astype(np.int64), entries["width"].astype(np.int64)
        upright = entries["orientation"] == 0 if exif_transpose else np.ones(len(positions), dtype=bool)
        raw = (entries["format"] == FORMAT_CODE["raw"]) & upright
        jpegs = np.isin(entries["format"], [FORMAT_CODE["JPEG"], FORMAT_CODE["MPO"]]) & upright & jpeg
        jpegs &= np.isin(entries["mode"], [b"RGB", b"L"])
        if Image.MAX_IMAGE_PIXELS:  # a possible decompression bomb takes the general route (a clear error)
            jpegs &= heights * widths <= 2 * Image.MAX_IMAGE_PIXELS
        if isinstance(crop, RandomResizedCrop):
            if boxes is None:
                raise ValueError("a RandomResizedCrop batch needs its boxes")
            min_h, min_w = crop.decode_sizes(boxes, heights, widths)
        else:
            min_h, min_w = crop.min_decode_sizes(heights, widths)
        # The DCT scale n/8 each JPEG decodes at (raw records: full size), and the size it gives.
        self.scales = np.where(jpegs, dct_scales(heights, widths, min_h, min_w), 8)
        self.raw, self.jpegs = raw, jpegs
        self.heights, self.widths, self.stored_boxes = heights, widths, boxes
        self.crop, self.fast_idct = crop, fast_idct
        # JPEGs are decoded into it whole (within the bomb limit), raw boxes copied into it where the
        # kernel does not apply: sized by the largest such image of the batch
        need = np.where(jpegs, heights * widths * 3, 0)
        need = np.maximum(need, np.where(raw, heights * widths * 3, 0))
        self.scratch_bytes = int(need.max()) if len(need) else 0
        self.kernel = resize_kernel.available() and bool(len(positions)) and interleaved(out)
        self.reader, self.positions, self.out = reader, np.asarray(positions, dtype=np.int64), out
        self.out_rows = rows
        self.done = np.zeros(len(positions), dtype=bool)  # filled by fill_batch

    def boxes(self, rows: np.ndarray, got_heights: np.ndarray, got_widths: np.ndarray) -> np.ndarray:
        """The boxes (B×4: top, left, height, width) of records ``rows`` in their images decoded at
        ``got_heights`` × ``got_widths``."""
        if isinstance(self.crop, RandomResizedCrop):
            assert self.stored_boxes is not None
            return scaled_boxes(self.stored_boxes[rows], self.heights[rows], self.widths[rows], got_heights, got_widths)
        tops, lefts, sides = self.crop.windows(got_heights, got_widths)
        return np.stack([tops, lefts, sides, sides], axis=1)

    def fill_batch(self, mirror: np.ndarray) -> np.ndarray:
        """Every JPEG and raw record of the batch that the compiled batch decoder takes, decoded (only
        over its box), resized into its slot and mirrored where ``mirror`` asks, in one call (one GIL
        release for all of them); ``fill`` then skips them. Returns which slots it mirrored."""
        mirrored = np.zeros(len(self.done), dtype=bool)
        rows = np.flatnonzero((self.jpegs | self.raw) & ~self.done)
        if not self.kernel or not len(rows):
            return mirrored
        scales = self.scales[rows]
        boxes = self.boxes(rows, -(-self.heights[rows] * scales // 8), -(-self.widths[rows] * scales // 8))
        done = fill_jpegs(self.reader, self.positions[rows], self.out_rows[rows], scales, boxes, self.out, mirror[rows],
                          self.fast_idct, self.raw[rows])
        self.done[rows[done]] = True
        mirrored[rows[done]] = mirror[rows[done]]
        return mirrored

    @cached_property
    def columns(self) -> tuple[list[bool], list[bool], list[int], list[int], list[int]]:
        """Per record, for ``fill``: raw or not, JPEG or not, height, width, DCT scale."""
        return (self.raw.tolist(), self.jpegs.tolist(), self.heights.tolist(), self.widths.tolist(),
                self.scales.tolist())

    @cached_property
    def _views(self) -> tuple[torch.Tensor, ...]:
        """1×3×S×S channels-last views of the batch, one per slot (made when one is needed)."""
        return self.out.split(1)

    def slot(self, k: int) -> torch.Tensor:
        """The slot of image ``k``."""
        return self._views[int(self.out_rows[k])]

    @cached_property
    def scratch(self) -> np.ndarray:
        """The buffer every image of the batch that ``fill`` takes is decoded or copied into."""
        return np.empty(self.scratch_bytes, dtype=np.uint8)

    @cached_property
    def flat(self) -> torch.Tensor:
        return torch.from_numpy(self.scratch)

    def fill(self, k: int, view: memoryview) -> bool:
        """Crop and resize image ``k`` into its slot; False if it must take the general route."""
        if self.done[k]:
            return True
        raw, jpeg, heights, widths, scales = self.columns
        height, width = heights[k], widths[k]
        if raw[k]:
            if len(view) != height * width * 3:
                return False
            top, left, box_h, box_w = self.boxes(np.array([k]), np.array([height]), np.array([width]))[0].tolist()
            region = np.ndarray((box_h, box_w, 3), np.uint8, view, (top * width + left) * 3, (width * 3, 3, 1))
            if self._resize(region.ctypes.data, width * 3, box_h, box_w, k):
                return True
            np.copyto(self.scratch[: box_h * box_w * 3].reshape(box_h, box_w, 3), region)  # the box alone
            source = self.flat.as_strided((1, 3, box_h, box_w), (box_h * box_w * 3, 1, box_w * 3, 3))
        elif jpeg[k] and simplejpeg is not None and view[:3] == JPEG_START:  # only JPEGs reach libjpeg-turbo
            got_h, got_w = -(-height * scales[k] // 8), -(-width * scales[k] // 8)
            try:  # the index's size must be the header's, as on every route; then a decode at the
                # scale the index gives (the buffer is sized from the index, so nothing larger fits)
                if tuple(simplejpeg.decode_jpeg_header(view)[:2]) != (height, width) or too_many_scans(view):
                    return False  # the general route names the record
                pixels = simplejpeg.decode_jpeg(view, colorspace="RGB", fastdct=self.fast_idct, min_height=got_h,
                                                min_width=got_w, buffer=self.scratch)
            except DECODE_ERRORS:
                return False  # the general route decides: PIL, or a clear error naming the record
            if pixels.shape[:2] != (got_h, got_w):
                return False
            top, left, box_h, box_w = self.boxes(np.array([k]), np.array([got_h]), np.array([got_w]))[0].tolist()
            start = (top * got_w + left) * 3
            if self._resize(self.scratch.ctypes.data + start, got_w * 3, box_h, box_w, k):
                return True
            source = self.flat.as_strided((1, 3, box_h, box_w), (got_h * got_w * 3, 1, got_w * 3, 3), start)
        else:
            return False
        if (box_h, box_w) == (self.crop.size, self.crop.size):
            self.slot(k).copy_(source)
        else:
            resize(source, self.slot(k))
        return True

    def _resize(self, source: int, row_bytes: int, box_h: int, box_w: int, k: int) -> bool:
        """The ``box_h`` × ``box_w`` region at address ``source`` into slot ``k`` by the compiled
        kernel (False: it does not apply, or the box is already the output's size)."""
        size = self.crop.size
        if not self.kernel or (box_h, box_w) == (size, size):
            return False
        slot = self.slot(k)
        return resize_kernel.resize_region(source, row_bytes, box_h, box_w, slot.data_ptr(), slot.stride(2), size, size)
