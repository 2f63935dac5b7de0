"""Helpers (not tests) that write real image files with PIL for tests.

Tests of the packer and loaders need actual files on disk: ordinary ImageFolder
trees, valid-but-unusual images that a packer must accept, broken files that it
must skip, and hidden or stray files that it must ignore. Everything here is
deterministic (seeded) and small, so tests stay fast.

Import with ``from tests.image_factory import ...`` (``tests`` is a package; run pytest from the repo root).
"""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

__all__ = [
    "make_image_folder",
    "textured_rgb",
    "write_broken_files",
    "write_hidden_and_stray",
    "write_image",
    "write_odd_images",
]

# EXIF tag id of Orientation; value 6 means "rotate 90 degrees clockwise to display".
EXIF_ORIENTATION = 0x0112


def textured_rgb(size: tuple[int, int], seed: int = 0) -> np.ndarray:
    """A deterministic ``(height, width, 3)`` uint8 array with gradient, blobs and fine noise.

    Textured rather than flat so that codecs do real work and a wrong decode (swapped
    channels, transposed axes) changes pixel values detectably.
    """
    w, h = size
    rng = np.random.default_rng(seed)
    ys = np.linspace(0.0, 1.0, h, dtype=np.float32)[:, None, None]
    xs = np.linspace(0.0, 1.0, w, dtype=np.float32)[None, :, None]
    c0, c1, c2 = (rng.uniform(30, 225, 3).astype(np.float32) for _ in range(3))
    arr = c0 + (c1 - c0) * xs + (c2 - c0) * ys
    # Smooth blobs: coarse random grid upscaled bicubically, one channel at a time.
    coarse = rng.normal(0.0, 25.0, (max(2, h // 8), max(2, w // 8), 3)).astype(np.float32)
    for c in range(3):
        blob = Image.fromarray(coarse[:, :, c]).resize((w, h), Image.Resampling.BICUBIC)
        arr[:, :, c] += np.asarray(blob)
    arr += rng.normal(0.0, 6.0, (h, w, 1)).astype(np.float32)
    return np.clip(arr, 0, 255).astype(np.uint8)


def _textured(mode: str, size: tuple[int, int], seed: int) -> Image.Image:
    """A textured PIL image in ``mode`` (including ``I;16``, ``P``, ``CMYK``, ``LA``, ``1``...)."""
    rgb = Image.fromarray(textured_rgb(size, seed))
    if mode == "RGB":
        return rgb
    if mode == "I;16":
        # Spread the 8-bit luminance over the full 16-bit range, plus low bits so it is truly 16-bit.
        lum = np.asarray(rgb.convert("L"), dtype=np.uint16) * 257
        lum += np.random.default_rng(seed + 1).integers(0, 200, lum.shape, dtype=np.uint16)
        return Image.fromarray(lum)
    if mode == "P":
        return rgb.quantize(colors=64)
    if mode in ("RGBA", "LA"):
        # A horizontal alpha ramp: fully transparent on the left, opaque on the right.
        w, h = size
        alpha = np.tile(np.linspace(0, 255, w, dtype=np.float32)[None, :], (h, 1)).astype(np.uint8)
        img = rgb.convert(mode)
        img.putalpha(Image.fromarray(alpha))
        return img
    return rgb.convert(mode)


def _format_for(path: Path) -> str:
    ext = path.suffix.lower()
    fmt = Image.registered_extensions().get(ext)
    if fmt is None:
        raise ValueError(f"cannot infer an image format from the suffix of {path.name!r}; pass fmt=")
    return fmt


def write_image(
    path: Path,
    mode: str = "RGB",
    size: tuple[int, int] = (48, 40),
    fmt: str | None = None,
    seed: int = 0,
    **save_kwargs: object,
) -> Path:
    """Write a textured, deterministic image of ``mode`` and ``size`` (width, height) to ``path``.

    ``fmt`` (a PIL format name such as ``"JPEG"``) is inferred from the suffix when None;
    ``save_kwargs`` go to ``Image.save`` (e.g. ``quality=``, ``exif=``). Parent folders are
    created. Returns ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    img = _textured(mode, size, seed)
    img.save(path, format=fmt or _format_for(path), **save_kwargs)
    return path


def make_image_folder(
    root: Path,
    classes: tuple[str, ...] = ("cat", "dog"),
    per_class: int = 4,
    seed: int = 0,
) -> list[Path]:
    """Write a small ImageFolder tree ``root/<class>/img_<k>.{jpg,png}``; return the files sorted.

    Each class alternates JPEG and PNG (so both decoders are exercised) and every image
    has its own seed and a slightly different size, so no two files are identical.
    """
    root = Path(root)
    files = []
    for ci, name in enumerate(classes):
        for k in range(per_class):
            ext = "jpg" if k % 2 == 0 else "png"
            img_seed = seed * 100_003 + ci * 1_009 + k
            size = (40 + (k % 3) * 8, 32 + (ci % 3) * 8)
            files.append(write_image(root / name / f"img_{k:03d}.{ext}", size=size, seed=img_seed))
    return sorted(files)


def write_odd_images(class_dir: Path) -> list[Path]:
    """Write valid but unusual images that torchvision's ImageFolder would load; return them sorted.

    Covers unusual modes (P with and without transparency, RGBA, LA, 16-bit grey, L and
    CMYK JPEG), an EXIF-rotated JPEG (orientation 6, 48x32 stored), other formats (BMP,
    TIFF, WebP, PPM, PGM, 3-frame APNG) and awkward names (upper-case ``.JPG``, unicode,
    spaces, a leading dash). All open with PIL and ``convert("RGB")``.
    """
    d = Path(class_dir)
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = 6
    files = [
        write_image(d / "palette.png", mode="P", seed=1),
        write_image(d / "palette_transparent.png", mode="P", seed=2, transparency=0),
        write_image(d / "rgba.png", mode="RGBA", seed=3),
        write_image(d / "la.png", mode="LA", seed=4),
        write_image(d / "gray16.png", mode="I;16", seed=5),
        write_image(d / "gray.jpg", mode="L", seed=6),
        write_image(d / "cmyk.jpg", mode="CMYK", seed=7),
        write_image(d / "exif_rotated.jpg", size=(48, 32), seed=8, exif=exif.tobytes()),
        write_image(d / "image.bmp", seed=9),
        write_image(d / "image.tiff", seed=10),
        write_image(d / "image.webp", seed=11, quality=80),
        write_image(d / "image.ppm", seed=12),
        write_image(d / "image.pgm", mode="L", seed=13),
        write_image(d / "UPPER.JPG", seed=15),
        write_image(d / "café ünï.png", seed=16),
        write_image(d / "with space.jpg", seed=17),
        write_image(d / "-dash.png", seed=18),
    ]
    frames = [_textured("RGB", (48, 40), 100 + i) for i in range(3)]
    apng = d / "animated.png"
    frames[0].save(apng, format="PNG", save_all=True, append_images=frames[1:], duration=100, loop=0)
    files.append(apng)
    return sorted(files)


def _png_chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def decompression_bomb_png(width: int = 30000, height: int = 30000) -> bytes:
    """A tiny (~60 byte) PNG whose header claims ``width`` x ``height`` pixels.

    Far above PIL's ``MAX_IMAGE_PIXELS`` * 2, so ``Image.open`` raises ``DecompressionBombError``
    before decoding anything. The pixel data is a single empty row, i.e. the file is also
    truncated, should anyone disable the check.
    """
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale, no interlace
    idat = zlib.compress(b"\x00")
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", idat)
        + _png_chunk(b"IEND", b"")
    )


def _encoded(fmt: str, size: tuple[int, int], seed: int, **kwargs: object) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(textured_rgb(size, seed)).save(buf, format=fmt, **kwargs)
    return buf.getvalue()


def write_broken_files(class_dir: Path) -> dict[str, str]:
    """Write files with image extensions that a packer must skip; return ``{file name: kind}``.

    Kinds: ``truncated_jpeg`` (valid header, cut mid-scan, no FFD9 end marker: opens but
    fails to load), ``truncated_png`` (cut inside IDAT, no IEND: opens but fails to load),
    ``empty`` (zero bytes), ``not_an_image`` (text named ``.png``), and
    ``decompression_bomb`` (PNG header claiming 30000x30000: ``Image.open`` raises
    ``DecompressionBombError``).
    """
    d = Path(class_dir)
    d.mkdir(parents=True, exist_ok=True)
    jpeg = _encoded("JPEG", (96, 80), seed=21, quality=90)
    png = _encoded("PNG", (96, 80), seed=22)
    truncated_jpeg = jpeg[: len(jpeg) // 2]
    # Cut in the middle of the (single) IDAT chunk, so there is no IEND.
    idat_start = png.index(b"IDAT") + 4
    idat_len = struct.unpack(">I", png[idat_start - 8 : idat_start - 4])[0]
    truncated_png = png[: idat_start + idat_len // 2]
    if b"\xff\xd9" in truncated_jpeg or b"IEND" in truncated_png:  # cannot happen; guards the premise
        raise RuntimeError("truncated files unexpectedly still contain an end marker")
    contents = {
        "truncated.jpg": (truncated_jpeg, "truncated_jpeg"),
        "truncated.png": (truncated_png, "truncated_png"),
        "empty.jpg": (b"", "empty"),
        "not_an_image.png": (b"this is a text file, not a PNG\n", "not_an_image"),
        "bomb.png": (decompression_bomb_png(), "decompression_bomb"),
    }
    for name, (data, _) in contents.items():
        (d / name).write_bytes(data)
    return {name: kind for name, (_, kind) in contents.items()}


def write_hidden_and_stray(root: Path) -> list[Path]:
    """Write real JPEGs (plus one text file) that a packer must ignore; return them sorted.

    In the first class folder of ``root`` (sorted; ``cat`` is created if there is none):
    ``.hidden.jpg``, ``.cache/x.jpg`` (inside a hidden sub-folder) and ``notes.txt``.
    At the top level: ``.cache/x.jpg`` (a hidden would-be class) and ``stray.jpg``
    (outside any class folder). The images are valid, so skipping them must be due to
    their location or name, not to a decode failure.
    """
    root = Path(root)
    class_dirs = (
        sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        if root.is_dir()
        else []
    )
    class_dir = class_dirs[0] if class_dirs else root / "cat"
    files = [
        write_image(class_dir / ".hidden.jpg", seed=31),
        write_image(class_dir / ".cache" / "x.jpg", seed=32),
        write_image(root / ".cache" / "x.jpg", seed=33),
        write_image(root / "stray.jpg", seed=34),
    ]
    notes = class_dir / "notes.txt"
    notes.write_text("not an image\n", encoding="utf-8")
    files.append(notes)
    return sorted(files)
