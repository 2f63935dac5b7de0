"""Seeded synthetic image datasets in torchvision ImageFolder layout.

Benchmarks and tests need many realistic small image files without downloading
ImageNet or CIFAR. The generators here write ``out/<class>/<name>.<ext>`` trees
whose files look like photos to a codec: smooth colour gradients, shapes, and
multi-octave 1/f ("fractal") noise with a class-dependent palette, so JPEG
sizes and decode costs are close to real data (white noise would be far too
large and too slow to decode; flat colour far too small and fast).

Every image is drawn from its own random stream derived from ``(seed, index)``,
so the bytes written depend only on the seed and the image index, never on the
number of worker processes or on how work is chunked.
"""

from __future__ import annotations

import ctypes
import io
import math
import multiprocessing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from packload.core.cpus import usable_cores
from packload.core.libc import libc_function
from packload.core.progress import progress_bar
from packload.core.workers import die_with_parent, worker_parent

__all__ = ["make_cifar_like", "make_imagenet_like"]

# Spawn-key tags keep the per-image, per-class and per-kind random streams apart.
_KIND_IMAGENET = 1
_KIND_CIFAR = 2
_STREAM_IMAGE = 0
_STREAM_CLASS = 1

_MIN_SIDE = 200
_MAX_SIDE = 500


@dataclass(frozen=True)
class _Job:
    """Everything a worker needs to write one chunk of images (picklable)."""

    kind: int
    out: str
    seed: int
    count: int
    classes: int
    start: int
    stop: int


# --------------------------------------------------------------------------- naming


def _class_names(classes: int) -> list[str]:
    """Zero-padded ``n00``-style names so that sorted order equals class index."""
    width = max(2, len(str(classes - 1)))
    return [f"n{c:0{width}d}" for c in range(classes)]


def _file_name(class_name: str, index: int, count: int, ext: str) -> str:
    """Zero-padded per-image file name so that sorted order equals index order."""
    width = max(6, len(str(count - 1)))
    return f"{class_name}_{index:0{width}d}.{ext}"


def _class_of(index: int, classes: int) -> int:
    """Round-robin assignment: class sizes differ by at most one image."""
    return index % classes


# --------------------------------------------------------------------------- random streams


def _image_rng(kind: int, seed: int, index: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(kind, _STREAM_IMAGE, index)))


def _class_rng(kind: int, seed: int, class_idx: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(kind, _STREAM_CLASS, class_idx)))


@dataclass(frozen=True)
class _ClassStyle:
    """Per-class look: a palette of related colours, texture roughness and shape preference."""

    palette: np.ndarray  # (n, 3) float32 in 0..255
    smoothness: float  # extra spectral slope of the texture: 0 = natural 1/f, larger = smoother
    texture: float  # strength of the luminance texture
    ellipse_bias: float  # probability that a shape is an ellipse rather than a polygon


def _hsv_to_rgb(hsv: np.ndarray) -> np.ndarray:
    """Vectorised HSV (0..1) to RGB (0..255) for an ``(n, 3)`` array."""
    h, s, v = hsv[:, 0] * 6.0, hsv[:, 1], hsv[:, 2]
    i = np.floor(h).astype(np.int64) % 6
    f = h - np.floor(h)
    p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
    table = np.stack(
        [
            np.stack([v, t, p], 1),
            np.stack([q, v, p], 1),
            np.stack([p, v, t], 1),
            np.stack([p, q, v], 1),
            np.stack([t, p, v], 1),
            np.stack([v, p, q], 1),
        ],
        0,
    )
    return (table[i, np.arange(len(i))] * 255.0).astype(np.float32)


def _class_style(kind: int, seed: int, class_idx: int) -> _ClassStyle:
    rng = _class_rng(kind, seed, class_idx)
    base_hue = rng.random()
    n = 6
    hues = (base_hue + rng.normal(0.0, 0.07, n)) % 1.0
    sats = rng.uniform(0.25, 0.9, n)
    vals = rng.uniform(0.3, 0.95, n)
    palette = _hsv_to_rgb(np.stack([hues, sats, vals], 1))
    return _ClassStyle(
        palette=palette,
        smoothness=float(rng.uniform(0.2, 0.5)),
        texture=float(rng.uniform(0.2, 0.4)),
        ellipse_bias=float(rng.uniform(0.2, 0.8)),
    )


# --------------------------------------------------------------------------- content


def _fractal_noise(rng: np.random.Generator, h: int, w: int, smoothness: float, finest: int) -> np.ndarray:
    """Unit-variance multi-octave noise of shape ``(h, w)``, amplitude spectrum ~ 1/f^(1 + smoothness).

    Built as a Laplacian-pyramid synthesis: start from a few random values, then
    repeatedly upscale by two (bicubic, in C via PIL) and add a new octave whose
    amplitude is ``2**-smoothness`` times the previous one (equal energy per octave,
    ``smoothness=0``, is the 1/f spectrum of natural photos). ``finest`` is the side
    in pixels of the smallest octave's cells (1 = per-pixel detail).
    """
    levels = max(1, int(math.log2(max(h, w) / 4)))
    finest_level = int(round(math.log2(max(1, finest))))
    shape_of = [(max(1, -(-h // 2**k)), max(1, -(-w // 2**k))) for k in range(levels + 1)]
    noise = rng.standard_normal(shape_of[levels], dtype=np.float32)
    for k in range(levels - 1, -1, -1):
        sh, sw = shape_of[k]
        noise = np.asarray(Image.fromarray(noise).resize((sw, sh), Image.Resampling.BICUBIC))
        if k >= finest_level:
            amp = np.float32(0.5 ** ((levels - k) * smoothness))
            noise = noise + amp * rng.standard_normal((sh, sw), dtype=np.float32)
    std = float(noise.std())
    return noise / std if std > 0 else noise


def _gradient(rng: np.random.Generator, h: int, w: int, c0: np.ndarray, c1: np.ndarray) -> Image.Image:
    """Linear colour ramp from ``c0`` to ``c1`` along a random direction, as an RGB image.

    Computed on a coarse grid and upscaled bilinearly (exact for a linear ramp), which is far
    cheaper than evaluating every pixel in numpy.
    """
    theta = rng.uniform(0, 2 * np.pi)
    gh, gw = max(2, h // 16), max(2, w // 16)
    ys = np.linspace(-0.5, 0.5, gh, dtype=np.float32)[:, None] * np.float32(math.sin(theta))
    xs = np.linspace(-0.5, 0.5, gw, dtype=np.float32)[None, :] * np.float32(math.cos(theta))
    t = np.clip(ys + xs + 0.5, 0.0, 1.0)[:, :, None]
    small = np.clip(c0 * (1 - t) + c1 * t, 0, 255).astype(np.uint8)
    return Image.fromarray(small).resize((w, h), Image.Resampling.BILINEAR)


def _jitter(rng: np.random.Generator, colour: np.ndarray, amount: float) -> np.ndarray:
    return np.clip(colour + rng.normal(0.0, amount, 3).astype(np.float32), 0, 255)


def _draw_shapes(rng: np.random.Generator, img: Image.Image, style: _ClassStyle, n: int) -> None:
    """Draw ``n`` filled ellipses / rotated polygons with palette colours onto ``img`` in place."""
    draw = ImageDraw.Draw(img)
    w, h = img.size
    for _ in range(n):
        colour = _jitter(rng, style.palette[rng.integers(len(style.palette))], 18.0)
        fill = tuple(int(v) for v in colour)
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        rx = rng.uniform(0.05, 0.35) * w
        ry = rx * math.exp(rng.uniform(-0.7, 0.7))
        if rng.random() < style.ellipse_bias:
            draw.ellipse([cx - rx, cy - ry, cx + rx, cy + ry], fill=fill)
        else:
            sides = int(rng.integers(3, 7))
            angles = rng.uniform(0, 2 * np.pi) + np.sort(rng.uniform(0, 2 * np.pi, sides))
            pts = [(cx + rx * math.cos(a), cy + ry * math.sin(a)) for a in angles]
            draw.polygon(pts, fill=fill)


def _render(
    rng: np.random.Generator, style: _ClassStyle, h: int, w: int, n_shapes: int, grain: float
) -> np.ndarray:
    """One textured RGB image as a ``(h, w, 3)`` uint8 array."""
    pal = style.palette
    pick = rng.choice(len(pal), size=2, replace=False)
    img = _gradient(rng, h, w, _jitter(rng, pal[pick[0]], 20.0), _jitter(rng, pal[pick[1]], 20.0))
    _draw_shapes(rng, img, style, n_shapes)
    arr = np.asarray(img, dtype=np.float32)

    # Luminance texture: multiplicative 1/f-like noise down to 2-pixel cells (like foliage, fur, clouds).
    lum = _fractal_noise(rng, h, w, style.smoothness, finest=2)
    lum *= np.float32(style.texture)
    lum += np.float32(1.0)
    arr *= lum[:, :, None]
    # Colour blotches: smooth per-channel noise from an 8x coarser grid, upscaled in one RGB resize.
    # Stored as uint8 around 128 so PIL can resize it; rescaled to a +-10 (1 sigma) colour shift.
    chroma = rng.normal(128.0, 40.0, (max(1, h // 8), max(1, w // 8), 3))
    chroma_img = Image.fromarray(np.clip(chroma, 0, 255).astype(np.uint8)).resize(
        (w, h), Image.Resampling.BICUBIC
    )
    chroma_full = np.asarray(chroma_img, dtype=np.float32)
    chroma_full -= np.float32(128.0)
    chroma_full *= np.float32(0.25)
    arr += chroma_full
    # Sensor-like grain, shared by the three channels.
    if grain > 0:
        arr += (np.float32(grain) * rng.standard_normal((h, w), dtype=np.float32))[:, :, None]
    np.clip(arr, 0, 255, out=arr)
    return arr.astype(np.uint8)


def _imagenet_bytes(seed: int, index: int, style: _ClassStyle) -> bytes:
    rng = _image_rng(_KIND_IMAGENET, seed, index)
    w = int(rng.integers(_MIN_SIDE, _MAX_SIDE + 1))
    h = int(np.clip(round(w * math.exp(rng.uniform(-0.45, 0.45))), _MIN_SIDE, _MAX_SIDE))
    quality = int(rng.integers(75, 96))
    arr = _render(rng, style, h, w, n_shapes=int(rng.integers(3, 10)), grain=float(rng.uniform(1.0, 3.0)))
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def _cifar_bytes(seed: int, index: int, style: _ClassStyle) -> bytes:
    rng = _image_rng(_KIND_CIFAR, seed, index)
    arr = _render(rng, style, 32, 32, n_shapes=int(rng.integers(1, 4)), grain=float(rng.uniform(0.0, 4.0)))
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


# --------------------------------------------------------------------------- driver


def _write_chunk(job: _Job) -> int:
    """Write images ``job.start .. job.stop - 1``; returns how many were written."""
    names = _class_names(job.classes)
    styles: dict[int, _ClassStyle] = {}
    ext, encode = ("jpg", _imagenet_bytes) if job.kind == _KIND_IMAGENET else ("png", _cifar_bytes)
    out = Path(job.out)
    for index in range(job.start, job.stop):
        c = _class_of(index, job.classes)
        if c not in styles:
            styles[c] = _class_style(job.kind, job.seed, c)
        data = encode(job.seed, index, styles[c])
        (out / names[c] / _file_name(names[c], index, job.count, ext)).write_bytes(data)
    return job.stop - job.start


def _worker_init(parent: int | None) -> None:
    """Pool initializer: end with the parent process ``parent`` (``die_with_parent``), and keep
    freed image-sized buffers in the worker's heap (glibc only).

    Each image allocates and frees a few MB of numpy temporaries; by default glibc
    returns them to the OS every time, and the page faults on re-use cost a large share
    of the run time. Raising the mmap and trim thresholds avoids that. Only done in worker
    processes we own, never in the caller's process; silently skipped elsewhere.
    """
    die_with_parent(parent)
    mallopt = libc_function("mallopt", [ctypes.c_int, ctypes.c_int])
    if mallopt is not None:
        mallopt(-3, 64 << 20)  # M_MMAP_THRESHOLD
        mallopt(-1, 256 << 20)  # M_TRIM_THRESHOLD


def _chunks(count: int, workers: int) -> Iterator[tuple[int, int]]:
    size = max(1, min(200, math.ceil(count / (workers * 8))))
    for start in range(0, count, size):
        yield start, min(count, start + size)


def _check_args(count: int, classes: int, seed: int, workers: int | None) -> None:
    for name, value in (("count", count), ("classes", classes), ("seed", seed)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if classes < 1:
        raise ValueError(f"classes must be >= 1, got {classes}")
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1 or None (all cores), got {workers}")


def _generate(
    kind: int,
    out: Path,
    count: int,
    classes: int,
    seed: int,
    workers: int | None,
    progress: bool,
    desc: str,
) -> list[Path]:
    _check_args(count, classes, seed, workers)
    count, classes, seed = int(count), int(classes), int(seed)
    out = Path(out)
    names = _class_names(classes)
    for name in names[: min(classes, count)]:
        (out / name).mkdir(parents=True, exist_ok=True)

    n_workers = workers if workers is not None else usable_cores()
    jobs = [_Job(kind, str(out), seed, count, classes, a, b) for a, b in _chunks(count, n_workers)]
    n_workers = min(n_workers, len(jobs))
    with progress_bar(total=count, desc=desc, unit="img", disable=not progress) as bar:
        if n_workers <= 1:
            for job in jobs:
                bar.update(_write_chunk(job))
        else:
            context = multiprocessing.get_context()
            with context.Pool(n_workers, initializer=_worker_init, initargs=(worker_parent(context),)) as pool:
                for done in pool.imap_unordered(_write_chunk, jobs):
                    bar.update(done)

    ext = "jpg" if kind == _KIND_IMAGENET else "png"
    paths = [
        out / names[_class_of(i, classes)] / _file_name(names[_class_of(i, classes)], i, count, ext)
        for i in range(count)
    ]
    return sorted(paths)


def make_imagenet_like(
    out: Path,
    count: int = 20000,
    classes: int = 20,
    seed: int = 0,
    workers: int | None = None,
    progress: bool = True,
) -> list[Path]:
    """Write ``count`` ImageNet-like JPEGs to ``out/<class>/<class>_<index>.jpg``; return them sorted.

    Images have sides of 200-500 px with varied aspect ratios, JPEG quality 75-95 and
    photo-like texture (file sizes as photos have, not those of noise or flat colour), so packing
    and decoding benchmarks behave as on real data. Classes are named ``n00``, ``n01``, ... (sorted order is the
    class index) and receive images round-robin, so their sizes differ by at most one.
    Output bytes depend only on ``seed`` and ``count``/``classes``, not on ``workers``
    (``None`` = all available cores; ``1`` = no subprocesses).
    """
    return _generate(_KIND_IMAGENET, out, count, classes, seed, workers, progress, "imagenet-like")


def make_cifar_like(
    out: Path,
    count: int = 50000,
    classes: int = 10,
    seed: int = 0,
    workers: int | None = None,
    progress: bool = True,
) -> list[Path]:
    """Write ``count`` CIFAR-like 32x32 RGB PNGs to ``out/<class>/<class>_<index>.png``; return them sorted.

    Same layout, class naming, balancing and determinism guarantees as
    :func:`make_imagenet_like`; the content is textured (gradient, shapes, noise), not constant,
    so PNG sizes and decode costs resemble real small images.
    """
    return _generate(_KIND_CIFAR, out, count, classes, seed, workers, progress, "cifar-like")
