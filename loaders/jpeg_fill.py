"""A batch's JPEG and raw records decoded, cropped, resized and mirrored in one native call (one GIL
release).

The native half of ``crop_fill.CropFill``: everything about the batch is worked out in NumPy first,
from the pack's index (each payload's address in the memory map, the scale each JPEG decodes at, its
box there, the slot it goes to), and then ``packload.core.jpeg_kernel.decode_boxes`` does every
record without coming back to Python, each JPEG decoded only over its box. The pixels are those of
the one-by-one route (simplejpeg's decode at the same scale, the resize kernel's resampling, the same
mirror). Records it leaves (boxes the resize kernel does not take, payloads that are not plain JPEGs
of the index's size) are marked not done, and the caller takes them one by one.
"""

from __future__ import annotations

import numpy as np
import torch

from packload.core import jpeg_kernel, resize_kernel
from packload.loaders.prefetch import distinct
from packload.loaders.read import PackReader


def payload_addresses(reader: PackReader, records: np.ndarray,
                      keep: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(addresses, lengths) of the records' payloads (uint64): in the pack's memory maps, from the
    index (the same bytes ``reader.payloads`` gives views of; every entry was checked to lie inside
    its part when the pack was opened). A pack at a URL has no map of its parts: its payloads are
    read (through the block cache) into ``keep``, which the caller holds until the native call ends."""
    entries = reader.entries
    if reader.ranged:
        keep.extend(reader.payload_bytes(records.tolist()))
        addresses = np.array([np.frombuffer(data, np.uint8).ctypes.data if data else 0 for data in keep],
                             dtype=np.uint64)
        return addresses, np.array([len(data) for data in keep], dtype=np.uint64)
    parts = entries["part"][records].astype(np.int64)
    offsets = entries["payload_offset"][records].astype(np.uint64)
    lengths = entries["payload_len"][records].astype(np.uint64)
    if len(parts) and (parts == parts[0]).all():  # the common case: one shard or chunk
        return np.uint64(np.frombuffer(reader.part_view(int(parts[0])), np.uint8).ctypes.data) + offsets, lengths
    unique_parts = distinct(parts)
    bases = np.array([np.frombuffer(reader.part_view(part), np.uint8).ctypes.data for part in unique_parts.tolist()],
                     dtype=np.uint64)
    return bases[np.searchsorted(unique_parts, parts)] + offsets, lengths


def fill_jpegs(reader: PackReader, records: np.ndarray, rows: np.ndarray, scales: np.ndarray, boxes: np.ndarray,
               out: torch.Tensor, mirror: np.ndarray, fast_idct: bool, raw: np.ndarray) -> np.ndarray:
    """Decode records ``records`` (JPEGs by the index, or raw pixels where ``raw``) into slots
    ``rows`` of ``out`` (a channels-last B×3×S×S uint8 batch), each JPEG at the DCT scale
    ``scales``/8 (raw records: 8, full size) and only over its box (``boxes``: B×4 top, left, height,
    width in the image at that scale), resized to S × S and mirrored where ``mirror`` (per row).
    Returns which of ``rows`` were done (JPEGs only where a libjpeg-turbo is bound, none where the
    compiled decoder is not available)."""
    count = len(rows)
    done = np.zeros(count, dtype=bool)
    if not count or not jpeg_kernel.raw_available():
        return done
    size = out.shape[2]
    entries = reader.entries
    heights, widths = entries["height"][records].astype(np.int64), entries["width"][records].astype(np.int64)
    scales = np.where(raw, 8, scales)
    got_h, got_w = -(-heights * scales // 8), -(-widths * scales // 8)
    boxes = np.asarray(boxes, dtype=np.int64).reshape(-1, 4)
    box_h, box_w = boxes[:, 2], boxes[:, 3]
    take = resize_kernel.regions_applicable(box_h, box_w, size, size) | ((box_h == size) & (box_w == size))
    if not jpeg_kernel.available():
        take &= raw  # no libjpeg-turbo bound: raw records only
    if not take.any():
        return done
    picked = np.flatnonzero(take)
    keep: list[bytes] = []  # a URL pack's payloads, alive until decode_boxes returns
    addresses, lengths = payload_addresses(reader, records[picked], keep)
    geometry = np.stack([heights[picked], widths[picked], scales[picked], got_h[picked], got_w[picked],
                         boxes[picked, 0], boxes[picked, 1], box_h[picked], box_w[picked]], axis=1)
    dests = np.uint64(out.data_ptr()) + rows[picked].astype(np.uint64) * np.uint64(out.stride(0))
    done[picked] = jpeg_kernel.decode_boxes(addresses, lengths, geometry, mirror[picked], dests, out.stride(2), size,
                                            fast_idct, raw[picked])
    return done
