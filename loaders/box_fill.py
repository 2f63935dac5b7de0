"""The short route of a ``RandomResizedCrop`` batch: each sample's box resized straight into its slot.

The counterpart of ``batch_fill._CropFill`` for boxes of any shape: upright raw records are
resized from the memory map itself (the kernel reads the box where it lies; only the box, never
the whole image, is copied where the kernel does not apply), and JPEGs decoded by libjpeg-turbo
into one buffer reused for the batch, at the smallest DCT scale that keeps the box at least the
output's size on each side (``RandomResizedCrop.dct_scale``). Resampling is ``crop.resize``'s
(the compiled kernel, or torch with the same pixels), so a box gives the drop-in transform's
pixels from the same decoded image. ``fill`` returns False for anything else (other formats, EXIF
rotation, a payload that does not decode), which the caller takes through the general route.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
import torch
from PIL import Image

from packload.core import resize_kernel
from packload.core.format import FORMAT_CODE
from packload.loaders.crop import interleaved, resize, scaled_box, scaled_boxes
from packload.loaders.decode import DECODE_ERRORS, JPEG_START, scaled_from, simplejpeg
from packload.loaders.jpeg_fill import fill_jpegs
from packload.loaders.random_crop import RandomResizedCrop
from packload.loaders.read import PackReader


class BoxFill:
    """Fills the slots of ``out`` (a channels-last B×3×S×S batch) with ``boxes`` (B×4: top, left,
    height, width, in the stored image's pixels) of records ``positions``."""

    def __init__(self, reader: PackReader, positions: list[int], crop: RandomResizedCrop, boxes: np.ndarray,
                 out: torch.Tensor, jpeg: bool, exif_transpose: bool, fast_idct: bool) -> None:
        entries = reader.entries[np.asarray(positions, dtype=np.int64)]
        heights, widths = entries["height"].astype(np.int64), entries["width"].astype(np.int64)
        upright = entries["orientation"] == 0 if exif_transpose else np.ones(len(positions), dtype=bool)
        raw = (entries["format"] == FORMAT_CODE["raw"]) & upright
        self.raw_array = np.where(raw, heights * widths * 3, -1)  # -1: not a raw record
        jpegs = np.isin(entries["format"], [FORMAT_CODE["JPEG"], FORMAT_CODE["MPO"]]) & upright & jpeg
        jpegs &= np.isin(entries["mode"], [b"RGB", b"L"])
        if Image.MAX_IMAGE_PIXELS:  # a possible decompression bomb takes the general route (a clear error)
            jpegs &= heights * widths <= 2 * Image.MAX_IMAGE_PIXELS
        self.jpegs, self.height_array, self.width_array, self.box_array = jpegs, heights, widths, boxes
        self.crop, self.fast_idct = crop, fast_idct
        # JPEGs are decoded into it (within the bomb limit), raw boxes copied into it where the kernel
        # does not apply: sized by the largest such image of the batch
        need = np.where(jpegs, heights * widths * 3, 0)
        need = np.maximum(need, np.where(raw, boxes[:, 2] * boxes[:, 3] * 3, 0)) if len(boxes) else need
        self.scratch_bytes = int(need.max()) if len(need) else 0
        self.kernel = resize_kernel.available() and bool(len(positions)) and interleaved(out)
        self.reader, self.positions, self.out = reader, np.asarray(positions, dtype=np.int64), out
        self.done = np.zeros(len(positions), dtype=bool)  # filled by fill_jpegs

    @cached_property
    def columns(self) -> tuple[list[int], list[bool], list[int], list[int], list[list[int]]]:
        """Per record, for ``fill``: raw payload bytes (-1: not raw), JPEG or not, height, width, box."""
        return (self.raw_array.tolist(), self.jpegs.tolist(), self.height_array.tolist(), self.width_array.tolist(),
                self.box_array.tolist())

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
        """Decode every JPEG of the batch that the compiled batch decoder takes and resize its box
        into its slot, the upright raw records' boxes straight from the map too, in one call (one GIL
        release for all of them), mirroring those ``mirror`` asks for; ``fill`` then skips them.
        Returns which slots it mirrored."""
        mirrored = np.zeros(len(self.done), dtype=bool)
        raw = self.raw_array >= 0
        rows = np.flatnonzero((self.jpegs | raw) & ~self.done)
        if not self.kernel or not len(rows):
            return mirrored
        records, boxes = self.positions[rows], self.box_array[rows]
        entries = self.reader.entries
        heights, widths = entries["height"][records], entries["width"][records]
        min_sizes = self.crop.decode_sizes(boxes, heights, widths)

        def moved(got_heights: np.ndarray, got_widths: np.ndarray) -> np.ndarray:
            return scaled_boxes(boxes, heights, widths, got_heights, got_widths)

        done = fill_jpegs(self.reader, records, rows, min_sizes, moved, self.out, mirror[rows], self.fast_idct,
                          raw[rows])
        self.done[rows[done]] = True
        mirrored[rows[done]] = mirror[rows[done]]
        return mirrored

    def fill(self, k: int, view: memoryview) -> bool:
        """Crop and resize image ``k`` into its slot; False if it must take the general route."""
        if self.done[k]:
            return True
        raw_bytes, jpeg, heights, widths, boxes = self.columns
        top, left, box_h, box_w = boxes[k]
        width = widths[k]
        if raw_bytes[k] >= 0:
            if len(view) != raw_bytes[k]:
                return False
            region = np.ndarray((box_h, box_w, 3), np.uint8, view, (top * width + left) * 3, (width * 3, 3, 1))
            if self.kernel and self._resize(region.ctypes.data, width * 3, box_h, box_w, k):
                return True
            np.copyto(self.scratch[: box_h * box_w * 3].reshape(box_h, box_w, 3), region)  # the box alone
            source = self.flat.as_strided((1, 3, box_h, box_w), (box_h * box_w * 3, 1, box_w * 3, 3))
        elif jpeg[k] and view[:3] == JPEG_START:  # only what starts as a JPEG reaches libjpeg-turbo
            height = heights[k]
            try:  # sizes from the index, no header call (each call into simplejpeg gives the GIL up);
                # an image larger than the index says does not fit the buffer: simplejpeg refuses it
                min_h, min_w = self.crop.decode_size(boxes[k], height, width)
                pixels = simplejpeg.decode_jpeg(view, colorspace="RGB", fastdct=self.fast_idct, min_height=min_h,
                                                min_width=min_w, buffer=self.scratch)
            except DECODE_ERRORS:
                return False  # the general route decides: PIL, or a clear error naming the record
            got_h, got_w = pixels.shape[:2]
            if not scaled_from(got_h, got_w, height, width):
                return False  # not the size the index gives: the general route names the record
            top, left, box_h, box_w = scaled_box((top, left, box_h, box_w), height, width, got_h, got_w)
            start = (top * got_w + left) * 3
            if self.kernel and self._resize(self.scratch.ctypes.data + start, got_w * 3, box_h, box_w, k):
                return True
            source = self.flat.as_strided((1, 3, box_h, box_w), (got_h * got_w * 3, 1, got_w * 3, 3), start)
        else:
            return False
        if (box_h, box_w) == (self.crop.size, self.crop.size):
            self.slots[k].copy_(source)
        else:
            resize(source, self.slots[k])
        return True

    def _resize(self, source: int, row_bytes: int, box_h: int, box_w: int, k: int) -> bool:
        """The ``box_h`` × ``box_w`` region at address ``source`` into slot ``k`` by the compiled
        kernel (False: it does not apply, or the box is already the output's size)."""
        size = self.crop.size
        if (box_h, box_w) == (size, size):
            return False
        slot = self.slots[k]
        return resize_kernel.resize_region(source, row_bytes, box_h, box_w, slot.data_ptr(), slot.stride(2), size, size)
