"""Read an image's format, size, mode and EXIF orientation from its header, fast.

For the two formats that make up nearly every dataset, JPEG and PNG, the header is parsed here in
a few microseconds (PIL's parser takes tens, which dominates packing time). Whenever a file is
anything but plain, the answer is ``None`` and the caller asks PIL, so the result is always what
``PIL.Image.open`` reports. ``tests/core/test_probe.py`` checks that agreement on many kinds of image.

``open_image`` is the one way packload lets PIL open image data, at pack time and at read time: only
the formats of ``DECODABLE``, because some of PIL's plugins start external programs (EPS runs
Ghostscript) and every plugin is code run on data from elsewhere.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from typing import Any, NamedTuple

from PIL import Image

from packload.core.format import DECODABLE
from packload.core.jpeg_scans import TooManyScansError, scans_reason, too_many_scans

_JPEG_MODES = {1: "L", 3: "RGB", 4: "CMYK"}
# SOF markers: C0-CF except C4 (DHT), C8 (JPG) and CC (DAC).
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# (bit depth, colour type) → PIL mode, for the PNG kinds read here; others go to PIL.
_PNG_MODES = {(8, 0): "L", (8, 2): "RGB", (8, 3): "P", (8, 4): "LA", (8, 6): "RGBA"}
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_IHDR = struct.Struct(">IIBB")
_U32_BE = struct.Struct(">I")
_U16_BE = struct.Struct(">H")
EXIF_ORIENTATION = 0x0112


class ImageHeader(NamedTuple):
    """What the header says: PIL's format name, width, height, mode, EXIF orientation (0: none).
    A named tuple: packing makes one per file, so it must be cheap to create."""

    format: str
    width: int
    height: int
    mode: str
    orientation: int


class BombError(Image.DecompressionBombError, ValueError):
    """The header claims more pixels than PIL's decompression-bomb limit allows (PIL's own error for
    it, so that every caller handling a bomb handles this one)."""


def _check_pixels(width: int, height: int, limit: int | None) -> None:
    """``BombError`` past twice ``limit`` pixels (PIL's rule; ``Image.MAX_IMAGE_PIXELS`` when None)."""
    if limit is None:
        limit = Image.MAX_IMAGE_PIXELS
    if limit and max(1, width) * max(1, height) > 2 * limit:
        raise BombError(f"Image size ({width * height} pixels) exceeds limit of {2 * limit} pixels, "
                        "could be decompression bomb DOS attack.")


def _exif_orientation(tiff: bytes) -> int | None:
    """Orientation from a TIFF-structured EXIF block; None if the block is not plain."""
    if len(tiff) < 8 or tiff[:2] not in (b"II", b"MM"):
        return None
    end = "<" if tiff[:2] == b"II" else ">"
    (ifd,) = struct.unpack_from(end + "I", tiff, 4)
    if ifd + 2 > len(tiff):
        return None
    (count,) = struct.unpack_from(end + "H", tiff, ifd)
    if ifd + 2 + 12 * count > len(tiff):
        return None
    for k in range(count):
        tag, kind, n = struct.unpack_from(end + "HHI", tiff, ifd + 2 + 12 * k)
        if tag == EXIF_ORIENTATION:
            if kind != 3 or n != 1:
                return None
            (value,) = struct.unpack_from(end + "H", tiff, ifd + 2 + 12 * k + 8)
            return value if 1 <= value <= 8 else 0
    return 0


def _probe_jpeg(data: bytes, limit: int | None) -> ImageHeader | None:
    pos, size = 2, len(data)
    orientation, seen_exif = 0, False
    while pos + 4 <= size:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        (length,) = _U16_BE.unpack_from(data, pos + 2)
        segment = data[pos + 4 : pos + 2 + length]
        if length < 2 or pos + 2 + length > size:
            return None
        if marker == 0xE1 and segment[:6] == b"Exif\0\0" and not seen_exif:
            found = _exif_orientation(segment[6:])  # PIL reads the first EXIF block only
            if found is None:
                return None
            orientation, seen_exif = found, True
        elif marker == 0xE2 and segment[:4] == b"MPF\0":
            return None  # multi-picture: PIL reports MPO, let it
        elif marker in _SOF:
            if len(segment) < 6:
                return None
            height, width = struct.unpack_from(">HH", segment, 1)
            mode = _JPEG_MODES.get(segment[5])
            if mode is None or width == 0 or height == 0:
                return None
            _check_pixels(width, height, limit)
            return ImageHeader("JPEG", width, height, mode, orientation)
        elif marker == 0xDA:
            return None  # scan data before any frame header: not plain
        pos += 2 + length
    return None


def _probe_png(data: bytes, limit: int | None) -> ImageHeader | None:
    if len(data) < 33 or data[12:16] != b"IHDR":
        return None
    width, height, depth, colour = _PNG_IHDR.unpack_from(data, 16)
    mode = _PNG_MODES.get((depth, colour))
    if mode is None or width == 0 or height == 0 or data[28] != 0:  # interlace is fine; compression 0
        return None
    pos = 33
    while pos + 8 <= len(data):  # chunks before the image data: eXIf/acTL need PIL's full reading
        (length,) = _U32_BE.unpack_from(data, pos)
        kind = data[pos + 4 : pos + 8]
        if kind == b"IDAT":
            _check_pixels(width, height, limit)
            return ImageHeader("PNG", width, height, mode, 0)
        if kind in (b"eXIf", b"acTL") or (colour in (0, 2) and kind == b"tRNS"):
            return None
        pos += 12 + length
    return None


def probe(data: bytes, max_pixels: int | None = None) -> ImageHeader | None:
    """The header of a plain JPEG or PNG, or None to ask PIL. Raises ``BombError`` past PIL's limit
    (``Image.MAX_IMAGE_PIXELS``, or ``max_pixels`` when given)."""
    if data[:3] == b"\xff\xd8\xff":
        return _probe_jpeg(data, max_pixels)
    if data[:8] == _PNG_SIGNATURE:
        return _probe_png(data, max_pixels)
    return None


class NotDecodableError(Image.UnidentifiedImageError):
    """Data that is not an image in one of the formats packload decodes (``DECODABLE``): an image of
    another format (EPS, say; its name in ``format``), or no image at all (``format`` None). The
    message says which, and is one line."""

    format: str | None = None


DECODABLE_NAMES = ", ".join(DECODABLE)  # for messages
_open_formats: tuple[str, ...] | None = None


def _registered_formats() -> tuple[str, ...]:
    """``DECODABLE`` less the names this PIL has no opener for (PIL 13 opens MPO files through its
    JPEG opener and registers none for MPO; asking ``Image.open`` for it would raise ``KeyError``)."""
    global _open_formats
    if _open_formats is None:
        Image.init()  # every plugin registered, so that the list is complete (imports only, once)
        _open_formats = tuple(name for name in DECODABLE if name in Image.OPEN)
    return _open_formats


def open_image(data: bytes | memoryview, max_pixels: int | None = None) -> Image.Image:
    """``Image.open`` of image data in memory, restricted to the formats packload decodes;
    ``NotDecodableError`` with the reason (``not_decodable_reason``) for anything else.

    Two refusals come before any decoding: an image of more than twice ``max_pixels`` pixels
    (``Image.DecompressionBombError``; PIL's own limit ``Image.MAX_IMAGE_PIXELS``, the user's setting,
    when ``max_pixels`` is None: it is read, never written), and a JPEG of more scans than
    ``MAX_JPEG_SCANS`` (``TooManyScansError``). The limit is passed, not set on PIL, so calls on
    several threads with different limits cannot see each other's (PIL's plugins check the sizes of
    a GIF's later frames against its global on their own).
    """
    if too_many_scans(data):
        raise TooManyScansError(scans_reason())
    limit = Image.MAX_IMAGE_PIXELS if max_pixels is None else max_pixels
    stream = io.BytesIO(data)
    prefix = stream.read(16)  # what Image.open hands the plugins' signature checks
    for name in _registered_formats():  # as Image.open, with the bomb check against ``limit``
        factory, accept = Image.OPEN[name]
        if accept is not None and not _accepts(accept, prefix):  # a plugin's "no", or its warning string
            continue
        stream.seek(0)
        try:
            image = factory(stream, "")
        except (SyntaxError, IndexError, TypeError, struct.error):  # what Image.open takes for "not this format"
            continue
        _check_pixels(*image.size, limit)
        return image
    name = refused_format(data)
    error = NotDecodableError(_reason(name))
    error.format = name
    raise error


def _accepts(accept: Callable[[bytes], Any] | None, prefix: bytes) -> bool:
    """Whether a plugin's signature check takes ``prefix`` (a string it returns is a warning: a no)."""
    try:
        if accept is None:
            return False
        result = accept(prefix)
        return bool(result) and not isinstance(result, str)
    except Exception:  # noqa: BLE001 - a plugin's signature check failing on odd bytes is a "no"
        return False


def refused_format(data: bytes | memoryview) -> str | None:
    """PIL's name for the image format ``data`` starts like (``EPS``), when PIL knows it and
    packload does not decode it; None for a format packload decodes (perhaps damaged) or none known.
    Only the plugins' signature checks run (comparisons of the first 16 bytes), never a decoder."""
    Image.init()
    prefix = bytes(data[:16])  # what Image.open hands the signature checks
    openers = list(Image.OPEN.items())
    if any(_accepts(accept, prefix) for name, (_, accept) in openers if name in DECODABLE):
        return None
    return next((name for name, (_, accept) in openers if name not in DECODABLE and _accepts(accept, prefix)), None)


def not_decodable_reason(data: bytes | memoryview) -> str:
    """Why ``open_image`` refuses ``data``, in one line: which format it is, or that it is no image."""
    return _reason(refused_format(data))


def _reason(name: str | None) -> str:
    if name is not None:
        return f"{name} image: not a format packload decodes ({DECODABLE_NAMES})"
    return f"not an image in a format packload decodes ({DECODABLE_NAMES}): wrong extension or damaged header"
