"""Check one source image and turn it into a record payload.

Runs in the packer's worker processes, so it is plain functions of plain data. A file that fails
its check comes back as ``Skipped`` with the reason; it never raises for a bad image, so one
broken file can neither stop a pack nor reach a training loop.
"""

from __future__ import annotations

import errno
import io
import os
import warnings
import zlib
from dataclasses import dataclass
from stat import S_ISREG

import numpy as np
from PIL import Image

try:  # libjpeg-turbo, releases the GIL: the fast path for re-encoding JPEGs (a dependency)
    import simplejpeg
except ImportError:  # pragma: no cover - PIL does everything without it
    simplejpeg = None

from packload.core import resize_kernel
from packload.core.format import ENCODINGS, RAW_CHANNELS
from packload.core.jpeg_scans import TooManyScansError, scans_reason, too_many_scans
from packload.core.probe import EXIF_ORIENTATION, BombError, ImageHeader, NotDecodableError, open_image, probe
from packload.core.safe_files import (
    FileChangedError,
    NotRegularFileError,
    kind_of,
    read_open_file,
    read_regular,
)
from packload.core.scan import Sample
from packload.core.special_files import NOT_REGULAR

CHECKS = ("fast", "full")


@dataclass(frozen=True)
class EncodeOptions:
    """How to check and store each image. The defaults keep the original bytes."""

    encoding: str = "keep"  # keep | jpeg | png | raw
    check: str = "fast"  # fast: header + end marker; full: decode every image
    quality: int = 90  # JPEG quality for encoding="jpeg"
    max_side: int | None = None  # shrink so the longer side is at most this (jpeg, png, raw)
    size: tuple[int, int] | None = None  # (height, width) to resize to exactly (raw)
    max_pixels: int | None = None  # the decompression-bomb limit, raised on purpose (None: PIL's own)

    def __post_init__(self) -> None:
        if self.encoding not in ENCODINGS:
            raise ValueError(f"unknown encoding {self.encoding!r}; choose one of {', '.join(ENCODINGS)}")
        if self.check not in CHECKS:
            raise ValueError(f"unknown check {self.check!r}; choose fast or full")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"--quality {self.quality} is out of range; give 1..100")
        if self.max_side is not None and self.max_side < 1:
            raise ValueError(f"--max-side {self.max_side} must be a positive number of pixels")
        if self.max_pixels is not None and self.max_pixels < 1:
            raise ValueError(f"--max-pixels {self.max_pixels} must be a positive number of pixels "
                             "(for example 500000000)")
        if self.max_side is not None and self.encoding == "keep":
            raise ValueError("--max-side re-encodes images; use it with --encoding jpeg, png or raw")
        if self.size is not None and self.encoding != "raw":
            raise ValueError("--size applies to --encoding raw only")
        if self.size is not None and min(self.size) < 1:
            raise ValueError(f"--size {self.size} must be positive HxW")


@dataclass(slots=True)
class Encoded:
    """A checked image ready to write: payload bytes and what the record header says."""

    path: str
    label: int
    payload: bytes
    width: int
    height: int
    mode: str
    format: str
    orientation: int
    source_bytes: int
    crc32: int  # of the payload, computed in the worker so the writer need not


@dataclass(slots=True)
class Skipped:
    """A source file that will not be packed, and why."""

    path: str
    reason: str


def truncation_problem(data: bytes, pil_format: str | None) -> str | None:
    """A reason if a JPEG or PNG lacks its end marker (the commonest corruption), else None.

    In a JPEG, 0xFFD9 (end of image) must follow the last 0xFFDA (start of scan): entropy-coded
    data never holds either marker, so a cut file has none after its last scan. A PNG must hold
    its IEND chunk, whose CRC is fixed.
    """
    if pil_format in ("JPEG", "MPO"):
        if data.endswith(b"\xff\xd9"):  # the common case, decided without searching the whole file
            return None
        if data.rfind(b"\xff\xd9") < data.rfind(b"\xff\xda"):
            return "truncated JPEG: no end-of-image marker after the last scan"
    elif pil_format == "PNG" and not data.endswith(_PNG_END) and data.rfind(_PNG_END) < 0:
        return "truncated PNG: no IEND chunk"
    return None


_PNG_END = b"IEND\xaeB`\x82"  # the IEND chunk's type and its fixed CRC


def _orientation(image: Image.Image) -> int:
    try:
        value = image.getexif().get(EXIF_ORIENTATION, 0)
    except Exception:  # a damaged EXIF block must not cost the image: treat as "no orientation"
        return 0
    return value if isinstance(value, int) and 1 <= value <= 8 else 0


def _target_size(width: int, height: int, options: EncodeOptions) -> tuple[int, int]:
    """(width, height) after --size or --max-side; unchanged when neither shrinks it."""
    if options.size is not None:
        return options.size[1], options.size[0]
    if options.max_side is not None and max(width, height) > options.max_side:
        scale = options.max_side / max(width, height)
        return max(1, round(width * scale)), max(1, round(height * scale))
    return width, height


def _reencode(image: Image.Image, options: EncodeOptions) -> tuple[bytes, int, int, str, str]:
    """Decode, resize if asked, convert to RGB (what ImageFolder yields) and store."""
    target = _target_size(image.width, image.height, options)
    if target != image.size and image.format == "JPEG":
        image.draft("RGB", target)  # decode at reduced DCT scale: still at least the target size
    rgb = image.convert("RGB")
    if target != rgb.size:
        rgb = rgb.resize(target, RESIZE, reducing_gap=3.0)
    return _store(rgb, options)


def _store(rgb: Image.Image | np.ndarray, options: EncodeOptions) -> tuple[bytes, int, int, str, str]:
    """The payload of RGB pixels (an image or an HxWx3 uint8 array) in ``options.encoding``."""
    if isinstance(rgb, np.ndarray):
        height, width = rgb.shape[:2]
    else:
        width, height = rgb.size
    if options.encoding == "raw":
        pixels = np.asarray(rgb, dtype=np.uint8)
        assert pixels.shape[2] == RAW_CHANNELS
        return pixels.tobytes(), width, height, "RGB", "raw"
    if options.encoding == "jpeg" and simplejpeg is not None:
        pixels = np.ascontiguousarray(rgb, dtype=np.uint8)
        return (simplejpeg.encode_jpeg(pixels, quality=options.quality, colorspace="RGB", colorsubsampling="420"),
                width, height, "RGB", "JPEG")
    image = Image.fromarray(rgb) if isinstance(rgb, np.ndarray) else rgb
    out = io.BytesIO()
    if options.encoding == "jpeg":
        image.save(out, "JPEG", quality=options.quality)
        return out.getvalue(), width, height, "RGB", "JPEG"
    image.save(out, "PNG", compress_level=3)
    return out.getvalue(), width, height, "RGB", "PNG"


def _reencode_jpeg(data: bytes, header: ImageHeader, options: EncodeOptions) -> tuple[bytes, int, int, str, str] | None:
    """Re-encode a plain RGB or greyscale JPEG with libjpeg-turbo, or None to leave it to PIL.

    The same steps as ``_reencode``: decode at the reduced DCT scale PIL's ``draft`` picks (1/2, 1/4
    or 1/8, still at least the target size), resize to the target with ``resize_rgb``, encode; each
    step is faster than PIL's, and each releases the GIL, so this runs on threads.
    """
    width, height = header.width, header.height
    target = _target_size(width, height, options)
    scale = _draft_scale((width, height), target)
    try:
        if scale > 1:  # ask for PIL's draft size: libjpeg-turbo then picks that same 1/scale
            pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True,
                                            min_height=-(-height // scale), min_width=-(-width // scale))
        else:
            pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True)
        if pixels.shape[:2] != (-(-height // scale), -(-width // scale)):
            return None
    except Exception:  # noqa: BLE001 - any trouble decoding: PIL decides whether the file is bad
        return None
    if (pixels.shape[1], pixels.shape[0]) != target:
        pixels = resize_rgb(pixels, target)
    return _store(pixels, options)


def _draft_scale(size: tuple[int, int], target: tuple[int, int]) -> int:
    """The DCT scale divisor PIL's ``JpegImageFile.draft`` picks to decode ``size`` for ``target``."""
    most = min(size[0] // target[0], size[1] // target[1])
    return next(scale for scale in (8, 4, 2, 1) if scale <= most) if most >= 1 else 1


def resize_rgb(pixels: np.ndarray, target: tuple[int, int]) -> np.ndarray:
    """HxWx3 uint8 ``pixels`` (C-contiguous) resized to ``target`` (width, height), with ``RESIZE``.

    Shrinking uses PyTorch's antialiased kernel on uint8 (vectorised, GIL released), which follows
    PIL's filter of the same name: results differ from ``Image.resize`` by at most 1 in a few
    pixels. Its output is written straight into an HxWx3 array (channels-last), which is the layout
    the kernel works in and what the encoders take. Where packload's compiled kernel applies (shrinks
    of up to 2x, the common case of ``--max-side`` on photos), it gives the same pixels as PyTorch's
    kernel, faster. Enlarging (``--size`` past the source) uses PIL.
    """
    width, height = target
    if width > pixels.shape[1] or height > pixels.shape[0]:
        image = Image.fromarray(pixels).resize(target, RESIZE, reducing_gap=3.0)
        return np.asarray(image)
    out = np.empty((height, width, RAW_CHANNELS), np.uint8)
    if RESIZE == Image.Resampling.BILINEAR and resize_kernel.resize_region(
            pixels.ctypes.data, pixels.strides[0], pixels.shape[0], pixels.shape[1], out.ctypes.data,
            out.strides[0], height, width):
        return out
    import torch  # on first use, not at import: it takes a second or two, and `keep` packs never need it

    batch = torch.from_numpy(pixels).permute(2, 0, 1).unsqueeze(0)  # NCHW view of HWC memory
    from packload.core.torch_private import resize_into

    if resize_into(batch, torch.from_numpy(out).permute(2, 0, 1).unsqueeze(0), _TORCH_MODE[RESIZE]):
        return out
    planes = torch.nn.functional.interpolate(batch, size=(height, width), mode=_TORCH_MODE[RESIZE],
                                             antialias=True)[0].numpy()
    for channel in range(RAW_CHANNELS):  # one plane at a time: far faster than one strided copy
        out[..., channel] = planes[channel]
    return out


# PIL's filter for --max-side and --size, and PyTorch's antialiased equivalent. Bilinear (a triangle
# filter as wide as the shrink, as torchvision's Resize does by default) rather than bicubic: it is
# about twice as fast in PyTorch's uint8 kernel, and at the shrinks packing does (to a training
# size) the two differ by a few grey levels at edges.
RESIZE = Image.Resampling.BILINEAR
_TORCH_MODE = {Image.Resampling.BILINEAR: "bilinear", Image.Resampling.BICUBIC: "bicubic"}

# Non-blocking: a FIFO that took a file's place since the scan must not stop the open; no
# controlling terminal from a terminal device either.
_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
               | getattr(os, "O_CLOEXEC", 0))
# The first read of a file asks for this much: a regular file shorter than that comes whole in one
# call, without the fstat (and its Python object) that sizing it would take. It is a positioned
# read, which pipes, FIFOs, sockets and terminals refuse (ESPIPE): data from those never passes for
# a short file. A read this long is sized by ``_read_rest``, which refuses anything but a regular file.
FIRST_READ = 64 << 10


def _read_file(path: str) -> bytes:
    """The whole regular file at ``path``: ``NotRegularFileError`` for anything else (checked after
    opening without blocking), ``FileChangedError`` when its size changes while it is read."""
    return read_regular(path)


def _read_rest(fd: int, start: bytes, path: str) -> bytes:
    """The whole file open at ``fd``, whose first bytes ``start`` were read already; as ``_read_file``,
    never more than the size seen by ``fstat`` (a device would give bytes without end)."""
    info = os.fstat(fd)
    if not S_ISREG(info.st_mode):
        raise NotRegularFileError(errno.EINVAL, f"{kind_of(info.st_mode)}, {NOT_REGULAR}", path)
    return read_open_file(fd, info.st_size, path, start)


def _unreadable(exc: OSError, path: str) -> str:
    """The reason the file at ``path`` is skipped, which could not be read with ``exc``."""
    if isinstance(exc, NotRegularFileError):
        return str(exc.strerror)  # "a FIFO (named pipe), not a regular file"
    if isinstance(exc, FileChangedError):
        return f"{exc.strerror}: something is writing to it; pack again once it is complete"
    try:  # a socket cannot even be opened (ENXIO): say what it is rather than the error's text
        mode = os.stat(path).st_mode
    except OSError:
        mode = 0
    if mode and not S_ISREG(mode):
        return f"{kind_of(mode)}, {NOT_REGULAR}"
    return f"unreadable: {exc.strerror or exc}"


def encode_file(root: str, sample: Sample, options: EncodeOptions, prefix: str | None = None) -> Encoded | Skipped:
    """Read, check and encode one source file; any problem with the file becomes ``Skipped``.
    ``prefix`` is ``os.path.join(root, "")``, when the caller has it at hand."""
    path = (prefix or os.path.join(root, "")) + sample.path
    try:
        data = _read_file(path)
    except OSError as exc:
        return Skipped(sample.path, _unreadable(exc, path))
    return encode_data(sample, data, options)


def encode_data(sample: Sample, data: bytes, options: EncodeOptions) -> Encoded | Skipped:
    """Check and encode the bytes ``data`` of ``sample`` (read from a file, or fetched from an object
    store); any problem with them becomes ``Skipped``, with the reason ``encode_file`` gives."""
    if not data:
        return Skipped(sample.path, "empty file (0 bytes)")
    if too_many_scans(data):  # before anything decodes it: its scans alone would take minutes
        return Skipped(sample.path, scans_reason())
    keep = options.encoding == "keep"
    try:
        header = probe(data, options.max_pixels) if options.check == "fast" or not keep else None
    except BombError as exc:
        return _bomb(sample, options, exc)
    if header is not None:
        problem = truncation_problem(data, header.format)
        if problem:
            return Skipped(sample.path, problem)
        if keep:
            return Encoded(sample.path, sample.label, data, header.width, header.height, header.mode,
                           header.format, header.orientation, len(data), zlib.crc32(data))
        if simplejpeg is not None and header.format == "JPEG" and header.mode in ("RGB", "L"):
            stored = _reencode_jpeg(data, header, options)
            if stored is not None:
                payload, width, height, mode, fmt = stored
                return Encoded(sample.path, sample.label, payload, width, height, mode, fmt, header.orientation,
                               len(data), zlib.crc32(payload))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # palette-transparency and large-image notes
            # the formats packload decodes only (no plugin that runs programs), the pixel limit passed
            # explicitly (PIL's global is never set: other threads pack with their own)
            image = open_image(data, options.max_pixels)
            problem = truncation_problem(data, image.format)
            if problem:
                return Skipped(sample.path, problem)
            if options.check == "full":
                image.load()
            orientation = _orientation(image)
            if keep:
                return Encoded(sample.path, sample.label, data, image.width, image.height, image.mode,
                               image.format or "other", orientation, len(data), zlib.crc32(data))
            payload, width, height, mode, fmt = _reencode(image, options)
    except (NotDecodableError, TooManyScansError) as exc:
        return Skipped(sample.path, str(exc))
    except Image.DecompressionBombError as exc:
        return _bomb(sample, options, exc)
    except Exception as exc:  # noqa: BLE001 - PIL raises many types on hostile data; each is a skip
        return Skipped(sample.path, f"not a readable image: {type(exc).__name__}: {exc}")
    return Encoded(sample.path, sample.label, payload, width, height, mode, fmt, orientation, len(data),
                   zlib.crc32(payload))


def _bomb(sample: Sample, options: EncodeOptions, exc: Exception) -> Skipped:
    limit = options.max_pixels or Image.MAX_IMAGE_PIXELS
    return Skipped(sample.path, f"decompression bomb ({exc}); if the image is genuine, raise the "
                                f"limit on purpose with --max-pixels (now {limit})")


def encode_chunk(root: str, samples: list[Sample], options: EncodeOptions) -> list[Encoded | Skipped]:
    """Encode a run of consecutive samples (the unit of work sent to a worker process)."""
    prefix = os.path.join(root, "")
    if options.encoding == "keep" and options.check == "fast":
        return _keep_chunk(root, prefix, samples, options)
    return [encode_file(root, sample, options, prefix) for sample in samples]


def _keep_chunk(root: str, prefix: str, samples: list[Sample], options: EncodeOptions) -> list[Encoded | Skipped]:
    """``encode_file`` for ``keep`` with the fast check, as one tight loop: packing small files costs
    little more than this loop's few microseconds of Python per file. Plain JPEGs and PNGs are
    decided here with the same checks (header probe, decompression-bomb limit, end marker); any
    other file, and any file with a problem, goes through ``encode_file``, which gives the reason; a
    JPEG of too many scans is skipped here (``too_many_scans``: tens of microseconds)."""
    out: list[Encoded | Skipped] = []
    append = out.append
    open_, pread, close, crc32 = os.open, os.pread, os.close, zlib.crc32
    flags, max_pixels, first_read = _OPEN_FLAGS, options.max_pixels, FIRST_READ
    for sample in samples:
        path, label = sample
        try:
            fd = open_(prefix + path, flags)
            try:
                data = pread(fd, first_read, 0)  # a shorter answer means the end of the (regular) file
                if len(data) == first_read:
                    data = _read_rest(fd, data, path)
            finally:
                close(fd)
            header = probe(data, max_pixels) if data else None
        except (OSError, BombError):
            header = None
        if header is None:  # not a plain JPEG or PNG, unreadable, not a regular file, changed while read
            append(encode_file(root, sample, options, prefix))
            continue
        fmt = header.format
        if fmt == "JPEG" and too_many_scans(data):
            append(Skipped(path, scans_reason()))
            continue
        if (data.endswith(b"\xff\xd9") if fmt == "JPEG" else data.endswith(_PNG_END)) or (
                truncation_problem(data, fmt) is None):
            append(Encoded(path, label, data, header.width, header.height, header.mode, fmt, header.orientation,
                           len(data), crc32(data)))
        else:
            append(encode_file(root, sample, options, prefix))
    return out
