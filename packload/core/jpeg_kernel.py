"""The compiled batch decoder (``packload/core/_jpeg_boxes.c``), when it was built: many JPEGs in one call.

``decode_boxes`` decodes a batch's JPEG records with libjpeg-turbo's TurboJPEG API (raw records
need none), resamples each record's box into its slot with the compiled resize kernel
(``resize_kernel``) and mirrors the slots asked for, all in one ctypes call: the GIL is given up
once for the batch. Decoding image by
image through simplejpeg gives it up and wins it back several times per image, and each of those
waits while a training loop holds the GIL (``benchmarks/bench_gil.py``). The pixels are
simplejpeg's (the same TurboJPEG calls, flags and decode size) resized as ``crop.resize`` resizes.

Built by setup.py only where the TurboJPEG headers and library are installed (Debian/Ubuntu:
``libturbojpeg0-dev``), and used only where the resize kernel is in use; elsewhere ``available()``
is False, ``unavailable_reason`` says why, and the loaders decode one image at a time.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np

from packload.core import resize_kernel

GEOMETRY_FIELDS = 8  # per record: height, width, decode height, decode width, box top, left, height, width
_buffers = threading.local()  # each thread's decode buffer and resize scratch, grown as needed


def _load() -> tuple[Any, str | None]:
    """(the decoder's function, None), or (None, why JPEGs are decoded one by one here)."""
    try:
        from packload.core import _jpeg_boxes
    except ImportError as exc:
        if "turbojpeg" in str(exc):
            return None, f"the compiled batch decoder cannot load libjpeg-turbo's TurboJPEG library ({exc})"
        return None, ("the compiled batch decoder was not built (it needs a C compiler and libjpeg-turbo's "
                      "TurboJPEG headers, libturbojpeg0-dev, when packload is installed)")
    lib = ctypes.CDLL(_jpeg_boxes.__file__)
    pointer, size = ctypes.c_void_p, ctypes.c_size_t
    lib.pl_jpeg_boxes.restype = ctypes.c_int
    lib.pl_jpeg_boxes.argtypes = [ctypes.c_int, pointer, pointer, pointer, pointer, pointer, pointer, pointer, ctypes.c_long,
                                  ctypes.c_int, ctypes.c_int, ctypes.c_uint64, pointer, size, pointer, size, pointer]
    return lib.pl_jpeg_boxes, None


_built, _built_reason = _load()
_decode = _built  # None while disabled by set_enabled(False)


def available() -> bool:
    """Whether ``decode_boxes`` decodes here: built, loaded, enabled, and the resize kernel in use."""
    return _decode is not None and resize_kernel.available()


def set_enabled(enabled: bool) -> None:
    """Decode batches of JPEGs with the compiled decoder where it is available (True, the default)
    or always one image at a time through simplejpeg (False: the same pixels; for comparing the
    two). Affects this process from the next batch on."""
    global _decode
    _decode = _built if enabled else None


def unavailable_reason() -> str | None:
    """Why ``available()`` is False (None when it is True)."""
    if _built is None:
        return _built_reason
    if _decode is None:
        return "disabled by jpeg_kernel.set_enabled(False)"
    if not resize_kernel.available():
        return f"the resize kernel is not in use: {resize_kernel.unavailable_reason}"
    return None


def _buffer(name: str, nbytes: int) -> np.ndarray:
    """This thread's buffer ``name`` of at least ``nbytes`` bytes (kept, grown as needed)."""
    buffer = getattr(_buffers, name, None)
    if buffer is None or buffer.nbytes < nbytes:
        buffer = np.empty(max(nbytes, 1), dtype=np.uint8)
        setattr(_buffers, name, buffer)
    return buffer


def decode_boxes(payloads: np.ndarray, lengths: np.ndarray, geometry: np.ndarray, mirror: np.ndarray,
                 dests: np.ndarray, dest_row_bytes: int, out_size: int, fast_idct: bool,
                 raw: np.ndarray | None = None) -> np.ndarray:
    """Decode JPEG record ``i`` (``lengths[i]`` bytes at address ``payloads[i]``; where ``raw[i]``,
    the stored image's pixels, resized from where they lie with no decode), resize its box
    into the ``out_size`` × ``out_size`` × 3 slot at address ``dests[i]`` (rows ``dest_row_bytes``
    apart) and mirror it where ``mirror[i]``; ``geometry`` is ``n`` × ``GEOMETRY_FIELDS``: the
    index's height and width, the decode size (simplejpeg's choice for the wanted minimum), the box
    in the decoded image. Every box must pass ``resize_kernel.regions_applicable`` or be the slot's
    size. Returns which records were done: the others (not JPEGs, not the index's size, CMYK, any
    decoder warning) are left for the caller, as is everything where the decoder is not available."""
    count = len(lengths)
    done = np.zeros(count, dtype=np.uint8)
    if not count or not available():
        return done.astype(bool)
    geometry = np.ascontiguousarray(geometry, dtype=np.int32)
    box_h, box_w = geometry[:, 6], geometry[:, 7]
    weights_w = resize_kernel.weights_for_sizes(box_w, out_size)
    weights_h = resize_kernel.weights_for_sizes(box_h, out_size)
    if weights_w is None or weights_h is None:  # more sizes than the weights cache keeps
        return done.astype(bool)
    weights = np.ascontiguousarray(np.stack([weights_w, weights_h], axis=1))
    raw = np.zeros(count, dtype=np.uint8) if raw is None else np.ascontiguousarray(raw, dtype=np.uint8)
    decoded = np.where(raw == 0, geometry[:, 2].astype(np.int64) * geometry[:, 3] * 3, 0)  # raw: no decode
    pixels = _buffer("pixels", int(decoded.max()))
    scratch = _buffer("scratch", resize_kernel.scratch_bytes(int(box_h.max()), out_size))
    payloads = np.ascontiguousarray(payloads, dtype=np.uint64)
    lengths = np.ascontiguousarray(lengths, dtype=np.uint64)
    mirror = np.ascontiguousarray(mirror, dtype=np.uint8)
    dests = np.ascontiguousarray(dests, dtype=np.uint64)
    status = _decode(count, payloads.ctypes.data, lengths.ctypes.data, raw.ctypes.data, geometry.ctypes.data,
                     weights.ctypes.data, mirror.ctypes.data, dests.ctypes.data, dest_row_bytes, out_size,
                     int(fast_idct), resize_kernel.resize_entry(), pixels.ctypes.data, pixels.nbytes,
                     scratch.ctypes.data, scratch.nbytes, done.ctypes.data)
    if status < 0:
        raise MemoryError("libjpeg-turbo could not create a decoder")
    return done.astype(bool)
