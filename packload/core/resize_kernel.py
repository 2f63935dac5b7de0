"""The compiled resize kernel (``packload/core/_resize.c``), when it was built: ``crop.resize`` uses it.

It resamples uint8 RGB images with an antialiased bilinear (triangle) filter, bit-exact with
torch's uint8 kernel (``interpolate(..., mode="bilinear", antialias=True)``): the same weights,
the same fixed-point arithmetic, the same rounding, so every pixel is identical whichever of the
two runs. It is faster than torch's for the common case of the fast path (a square of 120-224
pixels enlarged to 224; BENCHMARKS.md has the figures), and it reads the
source straight from a strided region (a square inside an image in the memory map, or inside a
decode buffer), so nothing is copied first. ctypes releases the GIL for the call.

Used only where it is faster than torch: on x86-64 CPUs with AVX2 (elsewhere its portable code
is slower, and torch resizes). ``set_enabled(False)`` makes packload resize with torch even where
the kernel is available (for comparisons; the pixels are the same).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np

_AVX2 = 2  # rs_level(): the code path the kernel takes on this CPU
_MIN_ROW_BYTES = 16  # the kernel reads up to 16 bytes past a source row's last pixel
_WEIGHTS_KEPT = 1024  # (input, output) size pairs whose weights are kept (10-20 KB each)
# Shrinking by more than this, the kernel takes a general loop slower than torch's; up to it, its
# fast loops beat torch's.
_MAX_SHRINK = 2


def _load() -> tuple[Any, str | None]:
    """(the kernel's functions, None), or (None, why packload resizes with torch here)."""
    try:
        from packload.core import _resize
    except ImportError:
        return None, "the compiled kernel was not built (no C compiler when packload was installed)"
    lib = ctypes.CDLL(_resize.__file__)
    pointer, long, int_ = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
    lib.rs_weights_new.restype = pointer
    lib.rs_weights_new.argtypes = [int_, int_]
    lib.rs_weights_free.argtypes = [pointer]
    lib.rs_scratch_bytes.restype = ctypes.c_size_t
    lib.rs_scratch_bytes.argtypes = [int_, int_]
    lib.rs_resize.restype = int_
    lib.rs_resize.argtypes = [pointer, long, int_, int_, pointer, long, int_, int_, pointer, pointer, pointer,
                              ctypes.c_size_t]
    lib.rs_level.restype = int_
    if lib.rs_level() < _AVX2:
        return None, "this CPU has no AVX2, where torch's resize is the faster one"
    return lib, None


_built, unavailable_reason = _load()
_lib = _built  # None while disabled by set_enabled(False)
_weights: dict[tuple[int, int], int] = {}
_weights_lock = threading.Lock()
_scratch = threading.local()


def available() -> bool:
    """Whether ``resize_region`` resizes here (else ``unavailable_reason`` says why not)."""
    return _lib is not None


def set_enabled(enabled: bool) -> None:
    """Resize with the compiled kernel where it is available (True, the default) or always with torch
    (False: the same pixels; for comparing the two). Affects this process from the next resize on."""
    global _lib, unavailable_reason
    _lib = _built if enabled else None
    if _built is not None:
        unavailable_reason = None if enabled else "disabled by resize_kernel.set_enabled(False)"


def _weights_for(size_in: int, size_out: int) -> int | None:
    """The kernel's weights for ``size_in`` → ``size_out`` samples (None: the side keeps its size)."""
    if size_in == size_out:
        return None
    key = (size_in, size_out)
    handle = _weights.get(key)
    if handle is None:
        with _weights_lock:
            handle = _weights.get(key)
            if handle is None:
                handle = _lib.rs_weights_new(size_in, size_out)
                if not handle:
                    raise MemoryError(f"resize weights for {size_in} -> {size_out} samples")
                if len(_weights) < _WEIGHTS_KEPT:
                    _weights[key] = handle
    return handle


def _scratch_for(height: int, out_width: int) -> np.ndarray:
    """This thread's scratch for resizing ``height`` rows to ``out_width`` columns (kept, grown as
    needed: one per thread, freed with it)."""
    need = _lib.rs_scratch_bytes(height, out_width)
    scratch = getattr(_scratch, "buffer", None)
    if scratch is None or scratch.nbytes < need:
        scratch = _scratch.buffer = np.empty(need, dtype=np.uint8)
    return scratch


def resize_region(source: int, source_row_bytes: int, height: int, width: int, dest: int, dest_row_bytes: int,
                  out_height: int, out_width: int) -> bool:
    """Resize the ``height`` × ``width`` × 3 uint8 region at address ``source`` (rows
    ``source_row_bytes`` apart) into the ``out_height`` × ``out_width`` × 3 region at ``dest``.
    Returns False, having done nothing, where the kernel does not apply (not available, rows too
    short for its reads, or a shrink by more than 2x, where torch is faster): the caller then resizes
    with torch, which gives the same pixels."""
    if _lib is None or width * 3 < _MIN_ROW_BYTES or height < 2 or source_row_bytes < width * 3 \
            or width > _MAX_SHRINK * out_width or height > _MAX_SHRINK * out_height:
        return False
    horizontal, vertical = _weights_for(width, out_width), _weights_for(height, out_height)
    scratch = _scratch_for(height, out_width)
    status = _lib.rs_resize(source, source_row_bytes, height, width, dest, dest_row_bytes, out_height, out_width,
                            horizontal, vertical, scratch.ctypes.data, scratch.nbytes)
    if status:
        raise ValueError(f"resize kernel refused {height}x{width} -> {out_height}x{out_width} (status {status})")
    for handle, key in ((horizontal, (width, out_width)), (vertical, (height, out_height))):
        if handle is not None and key not in _weights:  # built for this call only (the cache is full;
            _lib.rs_weights_free(handle)  # each call then builds its own, so none is freed twice)
    return True


def regions_applicable(heights: np.ndarray, widths: np.ndarray, out_height: int, out_width: int) -> np.ndarray:
    """Which regions of these sizes ``resize_region`` takes (its rules, for many regions at once)."""
    return (widths * 3 >= _MIN_ROW_BYTES) & (heights >= 2) & (widths <= _MAX_SHRINK * out_width) \
        & (heights <= _MAX_SHRINK * out_height)


def weights_for_sizes(sizes_in: np.ndarray, size_out: int) -> np.ndarray | None:
    """The kernel's weights handles (uint64; 0 where a size is ``size_out`` already) for resampling
    each of ``sizes_in`` to ``size_out``, as ``resize_entry``'s function takes them; None where the
    kernel is not available or the sizes do not all fit its weights cache."""
    if _lib is None:
        return None
    handles = []
    for size in np.asarray(sizes_in).tolist():  # a dict look-up each (batches are small)
        handle = _weights.get((size, size_out)) if size != size_out else 0
        if handle is None:
            handle = _weights_for(size, size_out)
            if (size, size_out) not in _weights:  # the cache is full: not kept
                _lib.rs_weights_free(handle)
                return None
        handles.append(handle)
    return np.array(handles, dtype=np.uint64)


def resize_entry() -> int:
    """The address of the kernel's C function ``rs_resize`` (0 where it is not available): for
    native code that resizes many images in one call, with the weights of ``weights_for_sizes``."""
    if _lib is None:
        return 0
    return ctypes.cast(_lib.rs_resize, ctypes.c_void_p).value or 0


def scratch_bytes(height: int, out_width: int) -> int:
    """Bytes of scratch the kernel needs to resize ``height`` rows to ``out_width`` columns."""
    if _lib is None:
        return 0
    return int(_lib.rs_scratch_bytes(height, out_width))
