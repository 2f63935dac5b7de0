"""Check one source image and turn it into a record payload.

Runs in the packer's worker processes, so it is plain functions of plain data. A file that fails
its check comes back as ``Skipped`` with the reason; it never raises for a bad image, so one
broken file can neither stop a pack nor reach a training loop.
"""

from __future__ import annotations

import io
import os
import warnings
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from PIL import Image

from .format import ENCODINGS, RAW_CHANNELS
from .probe import EXIF_ORIENTATION, BombError, probe
from .scan import Sample

CHECKS = ("fast", "full")


@dataclass(frozen=True)
class EncodeOptions:
    """How to check and store each image. The defaults keep the original bytes."""

    encoding: str = "keep"  # keep | jpeg | png | raw
    check: str = "fast"  # fast: header + end marker; full: decode every image
    quality: int = 90  # JPEG quality for encoding="jpeg"
    max_side: int | None = None  # shrink so the longer side is at most this (jpeg, png, raw)
    size: tuple[int, int] | None = None  # (height, width) to resize to exactly (raw)
    max_pixels: int | None = None  # raise PIL's decompression-bomb limit on purpose

    def __post_init__(self) -> None:
        if self.encoding not in ENCODINGS:
            raise ValueError(f"unknown encoding {self.encoding!r}; choose one of {', '.join(ENCODINGS)}")
        if self.check not in CHECKS:
            raise ValueError(f"unknown check {self.check!r}; choose fast or full")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"--quality {self.quality} is out of range; give 1..100")
        if self.max_side is not None and self.max_side < 1:
            raise ValueError(f"--max-side {self.max_side} must be a positive number of pixels")
        if self.max_side is not None and self.encoding == "keep":
            raise ValueError("--max-side re-encodes images; use it with --encoding jpeg, png or raw")
        if self.size is not None and self.encoding != "raw":
            raise ValueError("--size applies to --encoding raw only")
        if self.size is not None and min(self.size) < 1:
            raise ValueError(f"--size {self.size} must be positive HxW")


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Skipped:
    """A source file that will not be packed, and why."""

    path: str
    reason: str


@contextmanager
def _pixel_limit(max_pixels: int | None) -> Iterator[None]:
    """Raise PIL's decompression-bomb limit for the duration, when the user asked for it."""
    if max_pixels is None:
        yield
        return
    saved = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = max_pixels
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = saved


def truncation_problem(data: bytes, pil_format: str | None) -> str | None:
    """A reason if a JPEG or PNG lacks its end marker (the commonest corruption), else None.

    In a JPEG, 0xFFD9 (end of image) must follow the last 0xFFDA (start of scan): entropy-coded
    data never holds either marker, so a cut file has none after its last scan. A PNG must hold
    its IEND chunk, whose CRC is fixed.
    """
    if pil_format in ("JPEG", "MPO"):
        if data.rfind(b"\xff\xd9") < data.rfind(b"\xff\xda"):
            return "truncated JPEG: no end-of-image marker after the last scan"
    elif pil_format == "PNG" and data.rfind(b"IEND\xaeB`\x82") < 0:
        return "truncated PNG: no IEND chunk"
    return None


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
        rgb = rgb.resize(target, Image.Resampling.BICUBIC, reducing_gap=3.0)
    if options.encoding == "raw":
        pixels = np.asarray(rgb, dtype=np.uint8)
        assert pixels.shape[2] == RAW_CHANNELS
        return pixels.tobytes(), rgb.width, rgb.height, "RGB", "raw"
    out = io.BytesIO()
    if options.encoding == "jpeg":
        rgb.save(out, "JPEG", quality=options.quality)
        return out.getvalue(), rgb.width, rgb.height, "RGB", "JPEG"
    rgb.save(out, "PNG", compress_level=3)
    return out.getvalue(), rgb.width, rgb.height, "RGB", "PNG"


def encode_file(root: str, sample: Sample, options: EncodeOptions) -> Encoded | Skipped:
    """Read, check and encode one source file; any problem with the file becomes ``Skipped``."""
    try:
        with open(os.path.join(root, sample.path), "rb") as f:
            data = f.read()
    except OSError as exc:
        return Skipped(sample.path, f"unreadable: {exc.strerror or exc}")
    if not data:
        return Skipped(sample.path, "empty file (0 bytes)")
    try:
        with _pixel_limit(options.max_pixels):
            header = probe(data) if options.check == "fast" and options.encoding == "keep" else None
    except BombError as exc:
        return _bomb(sample, options, exc)
    if header is not None:
        problem = truncation_problem(data, header.format)
        if problem:
            return Skipped(sample.path, problem)
        return Encoded(sample.path, sample.label, data, header.width, header.height, header.mode,
                       header.format, header.orientation, len(data), zlib.crc32(data))
    try:
        with _pixel_limit(options.max_pixels), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # palette-transparency and large-image notes
            image = Image.open(io.BytesIO(data))
            problem = truncation_problem(data, image.format)
            if problem:
                return Skipped(sample.path, problem)
            if options.check == "full":
                image.load()
            orientation = _orientation(image)
            if options.encoding == "keep":
                return Encoded(sample.path, sample.label, data, image.width, image.height, image.mode,
                               image.format or "other", orientation, len(data), zlib.crc32(data))
            payload, width, height, mode, fmt = _reencode(image, options)
    except Image.UnidentifiedImageError:
        return Skipped(sample.path, "not an image PIL can identify (wrong extension or damaged header)")
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
    return [encode_file(root, sample, options) for sample in samples]
