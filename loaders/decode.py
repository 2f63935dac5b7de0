"""Turn a record payload into RGB pixels, the way ``ImageFolder``'s loader would.

``ImageFolder`` gives ``Image.open(path).convert("RGB")``; so does ``decode_pil`` for any payload.
``decode_array`` gives the same pixels as a height x width x 3 uint8 array and takes the fast
routes where they give the same result: raw payloads need no decode at all, and JPEGs go through
libjpeg-turbo via ``simplejpeg`` (a dependency) when it is importable, which releases the
GIL. With ``decode_size`` a JPEG is decoded at a reduced DCT scale that is still at least that
size (``Image.draft``), much faster when the images are larger than the training resolution.

The stored format code is not trusted: a pack may come from anyone. PIL opens a payload only as one
of the formats packload decodes (``packer.format.DECODABLE``; never EPS, whose plugin runs
Ghostscript), and libjpeg-turbo sees only payloads that start like a JPEG. A JPEG of more scans than
``MAX_JPEG_SCANS`` is refused before either decoder sees it (its scans alone would take seconds to
minutes), with the error an undecodable record gets.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image

from packload.core.errors import PackFormatError
from packload.core.format import SIDEWAYS_ORIENTATIONS
from packload.core.jpeg_scans import TooManyScansError, scans_reason, too_many_scans
from packload.core.probe import NotDecodableError, open_image

try:  # a dependency, absent only where the platform has no wheel for it
    import simplejpeg
except ImportError:  # pragma: no cover - depends on the environment
    simplejpeg = None

# EXIF orientation → the PIL transpose that shows the image upright (as ImageOps.exif_transpose).
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_SIMPLEJPEG_MODES = ("RGB", "L")  # CMYK/YCCK JPEGs go through PIL to match its colour conversion
JPEG_START = b"\xff\xd8\xff"  # start of image, then the first marker
_JPEG_START = JPEG_START


# What decoders raise; a JPEG of too many scans (TooManyScansError, a ValueError) is among them.
DECODE_ERRORS = (Image.DecompressionBombError, OSError, ValueError, SyntaxError)


def decode_failure(exc: BaseException, where: str) -> PackFormatError:
    """Our error for a record (``where``) whose payload a decoder refused with ``exc``."""
    if isinstance(exc, Image.DecompressionBombError):
        return PackFormatError(f"{where}: {exc}; if the image is genuine, raise PIL.Image.MAX_IMAGE_PIXELS on "
                               "purpose before reading")
    if isinstance(exc, TooManyScansError):
        return PackFormatError(f"{where}: {exc}")
    if isinstance(exc, NotDecodableError) and exc.format is not None:  # an image, of a format not decoded
        return PackFormatError(f"{where}: {exc}, so it is refused; convert the source image (to PNG, say) "
                               "and pack again")
    return PackFormatError(f"{where}: cannot decode ({exc}); run `packload verify` on the pack")


def fast_jpeg_available() -> bool:
    """True when the optional libjpeg-turbo decoder (simplejpeg) is installed."""
    return simplejpeg is not None


def raw_array(payload: memoryview | bytes, width: int, height: int) -> np.ndarray:
    """A raw payload as a read-only height x width x 3 view (no copy)."""
    expected = width * height * 3
    if len(payload) != expected:
        raise ValueError(f"raw payload of {len(payload)} bytes, expected {height}x{width}x3 = {expected}")
    return np.frombuffer(payload, dtype=np.uint8).reshape(height, width, 3)


def scaled_from(height: int, width: int, stored_height: int, stored_width: int) -> bool:
    """Whether a JPEG decoded to ``height`` x ``width`` is the stored image at one of libjpeg-turbo's
    scales (n/8 of each side, rounded up)."""
    return any(height == -(-stored_height * n // 8) and width == -(-stored_width * n // 8) for n in range(1, 9))


def dct_scales(heights: np.ndarray, widths: np.ndarray, min_heights: np.ndarray,
               min_widths: np.ndarray) -> np.ndarray:
    """The numerators n of the scales n/8 simplejpeg decodes images of these sizes at, asked for at
    least ``min_heights`` × ``min_widths`` (0 and 0: full size, n = 8). simplejpeg takes the size of
    the smallest n whose sides (rounded up) give both, and TurboJPEG then decodes at the largest n
    that gives that size. Tiny images reach one size at several scales, with other pixels at each:
    the scale, not the size, says how an image was decoded."""
    heights, widths = np.asarray(heights, dtype=np.int64), np.asarray(widths, dtype=np.int64)
    min_h = np.minimum(heights, np.asarray(min_heights, dtype=np.int64))
    min_w = np.minimum(widths, np.asarray(min_widths, dtype=np.int64))
    # ceil(side * n / 8) >= m  <=>  n >= 8 * (m - 1) // side + 1 (any n when m <= 0)
    need = np.maximum(8 * (np.maximum(min_h, 1) - 1) // heights, 8 * (np.maximum(min_w, 1) - 1) // widths) + 1
    smallest = np.where((min_h > 0) | (min_w > 0), np.minimum(need, 8), 8)
    size_h, size_w = -(-heights * smallest // 8), -(-widths * smallest // 8)
    largest = smallest.copy()
    for n in range(8, 0, -1):  # the largest n of the same size: sizes grow with n
        same = (n > smallest) & (largest == smallest) & (-(-heights * n // 8) == size_h) & \
            (-(-widths * n // 8) == size_w)
        largest = np.where(same, n, largest)
    return largest


def scaled_sizes(heights: np.ndarray, widths: np.ndarray, min_heights: np.ndarray,
                 min_widths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (heights, widths) simplejpeg decodes images of these sizes at, asked for at least
    ``min_heights`` × ``min_widths`` (0 and 0: full size): those of ``dct_scales``."""
    heights, widths = np.asarray(heights, dtype=np.int64), np.asarray(widths, dtype=np.int64)
    n = dct_scales(heights, widths, min_heights, min_widths)
    return -(-heights * n // 8), -(-widths * n // 8)


def _stored_size(size: tuple[int, int], orientation: int) -> tuple[int, int]:
    """(height, width) as stored, for a wanted upright size: orientations 5-8 swap the sides."""
    return (size[1], size[0]) if orientation in SIDEWAYS_ORIENTATIONS else size


def _check_pixel_limit(height: int, width: int) -> None:
    """Refuse a decompression bomb as ``Image.open`` does (the libjpeg-turbo route bypasses PIL)."""
    limit = Image.MAX_IMAGE_PIXELS
    if limit and width * height > 2 * limit:
        raise Image.DecompressionBombError(f"Image size ({width * height} pixels) exceeds limit of {2 * limit} "
                                           "pixels, could be decompression bomb DOS attack.")


def _check_size(got_height: int, got_width: int, height: int, width: int) -> None:
    """The image must be the size the index gives it (batches and crops are laid out from the index)."""
    if (got_height, got_width) != (height, width):
        raise ValueError(f"the image is {got_width}x{got_height}, the index says {width}x{height}")


def decode_pil(payload: memoryview | bytes, fmt: str, width: int, height: int,
               decode_size: tuple[int, int] | None = None, orientation: int = 0) -> Image.Image:
    """The payload as a PIL RGB image (``Image.open(original).convert("RGB")`` for lossless packs)."""
    if fmt == "raw":
        image = Image.frombytes("RGB", (width, height), bytes(payload))
    else:
        image = open_image(payload)  # whatever the stored format says: only the formats packload decodes,
        # never a JPEG of too many scans
        _check_size(image.height, image.width, height, width)
        if decode_size is not None and image.format == "JPEG":
            height_min, width_min = _stored_size(decode_size, orientation)
            image.draft("RGB", (width_min, height_min))
        image = image.convert("RGB")
    if orientation in _TRANSPOSE:
        image = image.transpose(_TRANSPOSE[orientation])
    return image


def decode_array(payload: memoryview | bytes, fmt: str, mode: str, width: int, height: int,
                 decode_size: tuple[int, int] | None = None, orientation: int = 0,
                 fast_jpeg: bool = True, fast_idct: bool = False) -> np.ndarray:
    """The payload as a height x width x 3 uint8 array (writable, owned by the caller). ``fast_idct``
    uses libjpeg-turbo's fast integer IDCT (a few percent faster, about one level of 255 different
    on average; PIL's decoder, the fallback, ignores it)."""
    if fmt == "raw" and orientation not in _TRANSPOSE:
        return raw_array(payload, width, height).copy()
    if fmt in ("JPEG", "MPO") and fast_jpeg and simplejpeg is not None and mode in _SIMPLEJPEG_MODES \
            and orientation not in _TRANSPOSE and payload[:3] == _JPEG_START:
        if too_many_scans(payload):  # before libjpeg-turbo spends minutes on it
            raise TooManyScansError(scans_reason())
        min_h, min_w = decode_size if decode_size is not None else (0, 0)
        try:
            header = simplejpeg.decode_jpeg_header(payload)[:2]
        except ValueError:
            header = None  # an unusual JPEG libjpeg-turbo refuses in strict mode: PIL decides
        if header is not None:
            _check_pixel_limit(*header)  # PIL's bomb limit, as Image.open
            _check_size(*header, height, width)
            try:
                return simplejpeg.decode_jpeg(payload, colorspace="RGB", fastdct=fast_idct, min_height=min_h,
                                            min_width=min_w)
            except ValueError:
                pass  # an unusual JPEG libjpeg-turbo refuses in strict mode: PIL decides
    return np.array(decode_pil(payload, fmt, width, height, decode_size, orientation))


def to_output(pixels: np.ndarray | Image.Image, output: str) -> Any:
    """Convert decoded pixels to the requested output: ``pil``, ``numpy`` (HWC) or ``tensor`` (CHW)."""
    if output == "pil":
        return pixels if isinstance(pixels, Image.Image) else Image.fromarray(pixels, "RGB")
    array = np.asarray(pixels)
    if output == "numpy":
        return array
    return torch.from_numpy(np.ascontiguousarray(array)).permute(2, 0, 1)
