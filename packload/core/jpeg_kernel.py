"""The compiled batch decoder (``packload/core/_jpeg_boxes.c``): many JPEGs in one call, each decoded
only where its crop lies.

``decode_boxes`` decodes a batch's JPEG records (raw records need none), resamples each record's box
into its slot with the compiled resize kernel (``resize_kernel``) and mirrors the slots asked for, all
in one ctypes call: the GIL is given up once for the batch, where decoding image by image gives it up
and wins it back several times per image, each time waiting while a training loop holds the GIL
(``benchmarks/bench_gil.py``). Each JPEG is decoded only over the box: the iMCU columns it touches,
from its first row to its last, at the DCT scale the caller chose (``decode_region`` shows one box).

The extension is built with a C compiler alone (setup.py): it is written against the libjpeg API and
linked to no library. At first use this module finds a libjpeg-turbo that exports that API (the
libjpeg 6.2 ABI and libjpeg-turbo's ``jpeg_crop_scanline``/``jpeg_skip_scanlines``), in this order:

1. the one Pillow's own decoder uses (Pillow's wheels carry a libjpeg-turbo; Pillow built from
   source uses the system's), so that nothing new is loaded into the process, and a new Pillow
   brings its own;
2. a system libjpeg-turbo (``libjpeg.so.62``, as ``ctypes.util.find_library("jpeg")`` finds it).

A library is taken only if it accepts the ABI this file was compiled for (``jpeg_CreateDecompress``
checks the version and the struct's size) and passes a self-check (a small JPEG encoded by PIL,
decoded whole and by its box, against PIL's own pixels). Where none does, where the extension was not
built, or where the resize kernel is not in use, ``available()`` is False, ``unavailable_reason()``
says why, and the loaders decode one image at a time (the same pixels, slower).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import io
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packload.core import resize_kernel
from packload.core.jpeg_scans import MAX_JPEG_SCANS

# per record: height, width, DCT scale n (of n/8), decode height, decode width, box top, left, height, width
GEOMETRY_FIELDS = 9
# The library functions the extension calls, in the order of its enum api_entry.
_API = ("jpeg_std_error", "jpeg_CreateDecompress", "jpeg_destroy_decompress", "jpeg_mem_src", "jpeg_read_header",
        "jpeg_start_decompress", "jpeg_crop_scanline", "jpeg_skip_scanlines", "jpeg_read_scanlines",
        "jpeg_abort_decompress")
_FAST_IDCT, _WHOLE = 1, 2  # the extension's flags
# Columns decoded beyond a box, at most: libjpeg-turbo's iMCU is at most 32 pixels wide at our scales
# (4 x 8); one iMCU of margin each side, and the left edge moved down to an iMCU boundary.
_MARGIN_COLUMNS = 3 * 32
_buffers = threading.local()  # each thread's decode buffer and resize scratch, grown as needed


@dataclass(frozen=True)
class _Decoder:
    """The extension's functions, bound to one libjpeg-turbo."""

    region: Any  # pl_jpeg_region
    api: np.ndarray  # the library's function addresses (uint64), in the order of _API
    library: Any  # the ctypes handle, kept so the library stays loaded
    description: str  # which library, for doctor


def _extension() -> tuple[Any, str | None]:
    """(the extension as a ctypes library, None), or (None, why it is not there)."""
    try:
        from packload.core import _jpeg_boxes
    except ImportError:
        return None, "the compiled batch decoder was not built (it needs a C compiler when packload is installed)"
    lib = ctypes.CDLL(_jpeg_boxes.__file__)
    pointer, size, int_ = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    lib.pl_jpeg_accepts.restype = int_
    lib.pl_jpeg_accepts.argtypes = [pointer, ctypes.c_char_p, size]
    lib.pl_jpeg_boxes.restype = int_
    lib.pl_jpeg_boxes.argtypes = [pointer, int_, pointer, pointer, pointer, pointer, pointer, pointer, pointer,
                                  ctypes.c_long, int_, int_, int_, ctypes.c_uint64, pointer, size, pointer, size,
                                  pointer]
    lib.pl_jpeg_region.restype = int_
    lib.pl_jpeg_region.argtypes = [pointer, pointer, ctypes.c_ulong, pointer, int_, int_, pointer, size, pointer]
    return lib, None


def _pillow_libraries() -> list[tuple[str, str]]:
    """(path, where from) of the libjpeg Pillow decodes with: the one its ``_imaging`` module mapped
    into this process (Linux), else the ones its wheel carries beside it."""
    import PIL
    from PIL import Image  # noqa: F401  (loads PIL._imaging, and with it Pillow's libjpeg)

    found: list[tuple[str, str]] = []
    maps = Path("/proc/self/maps")
    try:
        mapped = maps.read_text() if maps.exists() else ""
    except OSError:
        mapped = ""
    for path in dict.fromkeys(re.findall(r"(/\S*/libjpeg[^/\s]*\.so[^/\s]*)$", mapped, flags=re.MULTILINE)):
        where = "Pillow's wheel" if "pillow" in path.lower() else "the system, as Pillow uses it"
        found.append((path, where))
    folder = Path(PIL.__file__).resolve().parent
    for pattern in ("../pillow.libs/libjpeg*", "../Pillow.libs/libjpeg*", ".dylibs/libjpeg*"):
        found += [(str(path), "Pillow's wheel") for path in sorted(folder.glob(pattern))
                  if str(path) not in {known for known, _ in found}]
    return found


def _candidates() -> list[tuple[str, str]]:
    """Libraries to try, best first: Pillow's, then the system's libjpeg."""
    found = _pillow_libraries()
    system = ctypes.util.find_library("jpeg")
    if system and all(Path(path).name != system for path, _ in found):
        found.append((system, "the system"))
    return found


def _self_check(decoder: _Decoder) -> str | None:
    """None when ``decoder`` decodes a small 4:2:0 JPEG (encoded by PIL) as PIL does and its box as
    the whole image's box, else what went wrong."""
    from PIL import Image

    ramp = np.arange(40 * 56 * 3, dtype=np.uint32).reshape(40, 56, 3)
    image = ((ramp * 2654435761) >> 24).astype(np.uint8)  # busy enough to exercise every block
    buffer = io.BytesIO()
    Image.fromarray(image, "RGB").save(buffer, "JPEG", quality=90, subsampling=2)
    data = buffer.getvalue()
    expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    whole = _region(decoder, data, 40, 56, 8, (0, 0, 40, 56), fast_idct=False, whole=True)
    box = _region(decoder, data, 40, 56, 8, (9, 17, 22, 30), fast_idct=False, whole=False)
    if whole is None or box is None:
        return "it refused a JPEG that PIL decodes"
    if np.abs(whole.astype(np.int16) - expected).max() > 1:
        return "its pixels differ from PIL's"
    if not np.array_equal(box, whole[9:31, 17:47]):
        return "a box decoded alone differs from the same box of the whole image"
    return None


def _bind(extension: Any, path: str, where: str) -> tuple[_Decoder | None, str]:
    """(the decoder on library ``path``, its description), or (None, why that library is not used)."""
    name = Path(path).name
    try:
        library = ctypes.CDLL(path)
        addresses = [ctypes.cast(getattr(library, symbol), ctypes.c_void_p).value for symbol in _API]
    except (OSError, AttributeError) as exc:
        return None, f"{name} from {where} cannot be used ({exc})"
    api = np.array(addresses, dtype=np.uint64)
    message = ctypes.create_string_buffer(200)
    if not extension.pl_jpeg_accepts(api.ctypes.data, message, len(message)):
        said = message.value.decode("utf-8", "replace") or "it refused the libjpeg 6.2 ABI"
        return None, f"{name} from {where} is not the libjpeg 6.2 ABI this build expects ({said})"
    decoder = _Decoder(extension.pl_jpeg_region, api, library,
                       f"libjpeg-turbo {name} from {where}")
    failed = _self_check(decoder)
    if failed:
        return None, f"{name} from {where} failed the self-check: {failed}"
    return decoder, decoder.description


_lock = threading.Lock()
_state: dict[str, Any] = {}  # the extension and the decoder, each with why not, set once at first use
_enabled = True  # False while disabled by set_enabled(False)
_crop_first = True  # False while set_crop_first(False)


def _extension_lib() -> Any:
    """The extension (loaded at first use, then kept), or None where it was not built."""
    if "extension" not in _state:
        with _lock:
            if "extension" not in _state:
                _state["extension"], _state["extension_reason"] = _extension()
    return _state["extension"]


def _decoder() -> _Decoder | None:
    """The bound decoder (found at first use, then kept), or None."""
    if "reason" not in _state:
        extension = _extension_lib()
        with _lock:
            if "reason" not in _state:
                reason = _state["extension_reason"]
                decoder = None
                if extension is not None:
                    refused = []
                    for path, where in _candidates():
                        decoder, said = _bind(extension, path, where)
                        if decoder is not None:
                            break
                        refused.append(said)
                    if decoder is None:
                        reason = ("no usable libjpeg-turbo was found: " + "; ".join(refused) if refused else
                                  "no libjpeg-turbo was found (neither Pillow's nor the system's)")
                _state["decoder"], _state["reason"] = decoder, reason
    return _state["decoder"]


def available() -> bool:
    """Whether ``decode_boxes`` decodes JPEGs here: built, a libjpeg-turbo bound, enabled, and the
    resize kernel in use."""
    return raw_available() and _decoder() is not None


def raw_available() -> bool:
    """Whether ``decode_boxes`` resizes raw records here (built, enabled, the resize kernel in use:
    no libjpeg-turbo needed)."""
    return _enabled and resize_kernel.available() and _extension_lib() is not None


def set_enabled(enabled: bool) -> None:
    """Decode batches of JPEGs with the compiled decoder where it is available (True, the default)
    or always one image at a time (False: the same pixels; for comparing the two). Affects this
    process from the next batch on."""
    global _enabled
    _enabled = bool(enabled)


def set_crop_first(enabled: bool) -> None:
    """Decode only each crop's region (True, the default) or every row and column of each image, then
    crop (False: the same pixels, slower; for measuring what decoding only the crop saves)."""
    global _crop_first
    _crop_first = bool(enabled)


def unavailable_reason() -> str | None:
    """Why ``available()`` is False (None when it is True)."""
    if _decoder() is None:
        return _state["reason"]
    if not _enabled:
        return "disabled by jpeg_kernel.set_enabled(False)"
    if not resize_kernel.available():
        return f"the resize kernel is not in use: {resize_kernel.unavailable_reason}"
    return None


def description() -> str | None:
    """Which library the decoder runs on (None where it does not run)."""
    decoder = _decoder()
    return decoder.description if decoder is not None else None


def _buffer(name: str, nbytes: int) -> np.ndarray:
    """This thread's buffer ``name`` of at least ``nbytes`` bytes (kept, grown as needed)."""
    buffer = getattr(_buffers, name, None)
    if buffer is None or buffer.nbytes < nbytes:
        buffer = np.empty(max(nbytes, 1), dtype=np.uint8)
        setattr(_buffers, name, buffer)
    return buffer


def _pixels_bytes(geometry: np.ndarray, whole: bool) -> np.ndarray:
    """Bytes of pixels the decoder writes for each record of ``geometry`` (n × GEOMETRY_FIELDS): the
    box's rows, its columns with their margin (the whole decoded image where ``whole``)."""
    decode_h, decode_w = geometry[:, 3].astype(np.int64), geometry[:, 4].astype(np.int64)
    if whole:
        return decode_h * decode_w * 3
    return np.minimum(decode_h, geometry[:, 7]) * np.minimum(decode_w, geometry[:, 8].astype(np.int64)
                                                              + _MARGIN_COLUMNS) * 3


def _region(decoder: _Decoder, payload: bytes | memoryview, height: int, width: int, scale: int,
            box: tuple[int, int, int, int], fast_idct: bool, whole: bool,
            max_scans: int = MAX_JPEG_SCANS) -> np.ndarray | None:
    data = np.frombuffer(payload, dtype=np.uint8)
    decode_size = (-(-height * scale // 8), -(-width * scale // 8))
    geometry = np.array([height, width, scale, *decode_size, *box], dtype=np.int32)
    pixels = _buffer("pixels", int(_pixels_bytes(geometry[None], whole).max()))
    out = np.empty((max(box[2], 0), max(box[3], 0), 3), dtype=np.uint8)
    flags = (_FAST_IDCT if fast_idct else 0) | (_WHOLE if whole else 0)
    status = decoder.region(decoder.api.ctypes.data, data.ctypes.data, len(data), geometry.ctypes.data, flags,
                            max_scans, pixels.ctypes.data, pixels.nbytes, out.ctypes.data)
    if status < 0:
        raise MemoryError("libjpeg-turbo could not create a decompressor")
    return out if status else None


def decode_region(payload: bytes | memoryview, height: int, width: int, scale: int,
                  box: tuple[int, int, int, int], fast_idct: bool = False,
                  max_scans: int = MAX_JPEG_SCANS) -> np.ndarray | None:
    """The ``box`` (top, left, height, width, in the decoded image) of a JPEG whose index size is
    ``height`` × ``width``, decoded at the DCT scale ``scale``/8 (sides rounded up) as the batch
    decoder decodes it (only the box, unless ``set_crop_first(False)``): box height × box width × 3
    uint8, or None where the decoder leaves the record to the general route (or is not available);
    a progressive JPEG of more than ``max_scans`` scans is left too."""
    decoder = _decoder()
    if decoder is None or not _enabled:
        return None
    return _region(decoder, payload, height, width, scale, box, fast_idct, not _crop_first, max_scans)


def decode_boxes(payloads: np.ndarray, lengths: np.ndarray, geometry: np.ndarray, mirror: np.ndarray,
                 dests: np.ndarray, dest_row_bytes: int, out_size: int, fast_idct: bool,
                 raw: np.ndarray | None = None) -> np.ndarray:
    """Decode JPEG record ``i`` (``lengths[i]`` bytes at address ``payloads[i]``; where ``raw[i]``,
    the stored image's pixels, resized from where they lie with no decode), resize its box
    into the ``out_size`` × ``out_size`` × 3 slot at address ``dests[i]`` (rows ``dest_row_bytes``
    apart) and mirror it where ``mirror[i]``; ``geometry`` is ``n`` × ``GEOMETRY_FIELDS``: the
    index's height and width, the DCT scale n (of n/8) and the decode size it gives, the box in the
    decoded image.
    Every box must pass ``resize_kernel.regions_applicable`` or be the slot's size. Returns which
    records were done: the others (not JPEGs, not the index's size, CMYK, over ``MAX_JPEG_SCANS``
    scans, any decoder warning) are left for the caller, as is everything where the decoder is not
    available (and every JPEG where no libjpeg-turbo is bound)."""
    count = len(lengths)
    done = np.zeros(count, dtype=np.uint8)
    if not count or not raw_available():
        return done.astype(bool)
    decoder = _decoder()  # None: raw records only (JPEGs are left)
    geometry = np.ascontiguousarray(geometry, dtype=np.int32)
    box_h, box_w = geometry[:, 7], geometry[:, 8]
    weights_w = resize_kernel.weights_for_sizes(box_w, out_size)
    weights_h = resize_kernel.weights_for_sizes(box_h, out_size)
    if weights_w is None or weights_h is None:  # more sizes than the weights cache keeps
        return done.astype(bool)
    weights = np.ascontiguousarray(np.stack([weights_w, weights_h], axis=1))
    raw = np.zeros(count, dtype=np.uint8) if raw is None else np.ascontiguousarray(raw, dtype=np.uint8)
    decoded = np.where(raw == 0, _pixels_bytes(geometry, not _crop_first), 0)  # raw: no decode
    pixels = _buffer("pixels", int(decoded.max()))
    scratch = _buffer("scratch", resize_kernel.scratch_bytes(int(box_h.max()), out_size))
    payloads = np.ascontiguousarray(payloads, dtype=np.uint64)
    lengths = np.ascontiguousarray(lengths, dtype=np.uint64)
    mirror = np.ascontiguousarray(mirror, dtype=np.uint8)
    dests = np.ascontiguousarray(dests, dtype=np.uint64)
    flags = (_FAST_IDCT if fast_idct else 0) | (0 if _crop_first else _WHOLE)
    api = decoder.api.ctypes.data if decoder is not None else None
    status = _extension_lib().pl_jpeg_boxes(api, count, payloads.ctypes.data, lengths.ctypes.data, raw.ctypes.data,
                           geometry.ctypes.data, weights.ctypes.data, mirror.ctypes.data, dests.ctypes.data,
                           dest_row_bytes, out_size, flags, MAX_JPEG_SCANS, resize_kernel.resize_entry(),
                           pixels.ctypes.data, pixels.nbytes, scratch.ctypes.data, scratch.nbytes, done.ctypes.data)
    if status < 0:
        raise MemoryError("libjpeg-turbo could not create a decompressor")
    return done.astype(bool)
