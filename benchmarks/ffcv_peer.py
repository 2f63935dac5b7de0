"""FFCV as a benchmark peer: write an ImageFolder-style folder to a ``.beton`` and read it back.

FFCV is benchmark-only: never a dependency of packload, never installed in CI. Every FFCV import
is inside a function, so this module imports (and ``unavailable()`` answers) without it. Recipe
(FFCV 1.0.2, in the peer venv beside torch 2.13.0+cpu; see BENCHMARKS.md and
``benchmarks/requirements-ffcv.txt``)::

    apt-get install -y pkg-config libturbojpeg0-dev libopencv-dev   # FFCV's C extension builds against these
    pip install -r benchmarks/requirements-ffcv.txt                  # its Python dependencies
    pip install --no-deps ffcv==1.0.2                                # --no-deps: it declares opencv-python

Functions (no module state; each builds what it needs, so each may run in a fresh forked process):

``unavailable() -> str | None``
    ``None`` when FFCV imports, else ``"not installed (...)"`` with the reason and the recipe.
``samples(source_folder) -> list[tuple[str, int]]``
    The folder's images and class indices in ImageFolder order (``packload.core.scan.scan_folder``, the
    order ``pack`` uses), so record ``i`` of a ``.beton`` is record ``i`` of a packload pack.
``write(source_folder, out_path, mode="raw", max_resolution=None, quality=90, workers=None) -> dict``
    ``DatasetWriter`` with ``{"image": RGBImageField(write_mode=mode, max_resolution=...,
    jpeg_quality=quality), "label": IntField()}`` fed by ``FolderDataset`` (PIL image in RGB,
    label). Returns ``seconds`` (writer start to return), ``seconds_fsync`` (plus an fsync of the
    file), ``bytes``, ``samples``, the settings.
``read(path, batch_size=64, workers=2, order="sequential", crop=None, epochs=5, ...) -> dict``
    Iterates ``Loader(path, batch_size, num_workers=workers, order=SEQUENTIAL|RANDOM, os_cache=True,
    drop_last=False, pipelines={"image": [decoder, ToTensor()], "label": [IntDecoder(), ToTensor()]})``
    with ``SimpleRGBImageDecoder()`` (``crop=None``) or ``CenterCropRGBImageDecoder((crop, crop),
    ratio=224/256)``. Epoch 0 includes numba's JIT compilation and is reported apart
    (``first_epoch_s``); ``images_per_s`` is the median of the ``epochs`` epochs after it. Also
    ``setup_s`` (Loader construction), the batch's shape/dtype/strides and the numba threading layer.
``pixels(path, indices, crop=None) -> tuple[np.ndarray, np.ndarray]``
    Decoded ``uint8`` images ``(N, H, W, 3)`` and ``int64`` labels ``(N,)`` of records ``indices``,
    through the same pipeline as ``read`` (copied out of FFCV's reused buffers).
``stored(path) -> dict``
    What the ``.beton`` holds per record: ``mode`` (``"jpg"``/``"raw"``), ``height``, ``width`` arrays.

FFCV's behaviour that matters when comparing with it:

* Batches are **BHWC** ``torch.uint8`` tensors, C-contiguous (channels last in memory, shape
  ``(B, H, W, 3)``), labels ``int64`` of shape ``(B, 1)``. ``ToTorchImage`` would permute them to
  BCHW (a channels-last view); we leave them as decoded.
* The tensors are views of a ring of ``batches_ahead + 2`` preallocated buffers that later batches
  overwrite: copy a batch to keep it (``pixels`` does).
* ``Loader`` defaults to ``drop_last=True``; we pass ``False`` so every record is read.
* ``num_workers`` is the number of numba threads (process-wide), and must not exceed the CPU count.
* ``max_resolution`` bounds the **long** side at write time (``cv2.INTER_AREA``, sizes floored; never
  upscales). ``jpg`` mode re-encodes with OpenCV at ``jpeg_quality``; decoding uses libjpeg-turbo with
  ``TJFLAG_FASTDCT``.
* ``CenterCropRGBImageDecoder(out, ratio)`` crops the centred square of side ``int(ratio * min(h, w))``
  at offset ``((h - c) // 2, (w - c) // 2)`` of the *stored* image, then resizes that square to
  ``out`` with ``cv2.INTER_AREA`` (upscaling when the square is smaller). Same region as torchvision's
  ``Resize(256) + CenterCrop(224)`` of the stored image for ``ratio=224/256`` (up to rounding), but
  crop-then-resize with area interpolation instead of bilinear resize-then-crop, and of an image
  already shrunk to ``max_resolution`` on its long side.
* ``SimpleRGBImageDecoder`` needs every record to have one size (CIFAR); it raises ``TypeError`` else.
* ``DatasetWriter`` forks ``workers`` processes and polls their progress every 0.1 s; if a worker
  dies (an unreadable image), the writer waits forever: run it under a timeout.
"""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch.utils.data as tud
from PIL import Image

RECIPE = (
    "apt-get install -y pkg-config libturbojpeg0-dev libopencv-dev && "
    "pip install -r benchmarks/requirements-ffcv.txt && pip install --no-deps ffcv==1.0.2"
)
CROP_RATIO = 224 / 256  # FFCV's ImageNet examples: crop 224 of a 256 short side


def unavailable() -> str | None:
    """``None`` if FFCV (and its compiled extension) imports, else why not and how to install it."""
    try:
        import ffcv.fields.decoders  # noqa: F401
        import ffcv.libffcv  # noqa: F401  (the C extension: libturbojpeg + OpenCV)
        import ffcv.loader  # noqa: F401
        import ffcv.writer  # noqa: F401
    except Exception as exc:  # ImportError, or a broken build raising OSError and the like
        return f"not installed (ffcv: {type(exc).__name__}: {exc}); benchmark-only recipe: {RECIPE}"
    return None


def version() -> str | None:
    """FFCV's installed distribution version (``ffcv.__version__`` says 0.0.3rc1 in 1.0.2), or None."""
    from importlib import metadata

    try:
        return metadata.version("ffcv")
    except metadata.PackageNotFoundError:
        return None


def samples(source_folder: str | os.PathLike[str]) -> list[tuple[str, int]]:
    """Absolute image paths and class indices in ImageFolder order (the order ``pack`` stores)."""
    from packload.core.scan import scan_folder

    scan = scan_folder(source_folder)
    root = Path(source_folder).resolve()
    return [(str(root / s.path), s.label) for s in scan.samples]


class FolderDataset(tud.Dataset):
    """Map-style dataset of ``(PIL RGB image, label)`` for FFCV's ``DatasetWriter``."""

    def __init__(self, items: Sequence[tuple[str, int]]) -> None:
        self.items = list(items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        path, label = self.items[i]
        im = Image.open(path)
        im.load()  # decodes and closes the file
        return (im if im.mode == "RGB" else im.convert("RGB")), int(label)


@contextlib.contextmanager
def _quiet_writer(progress: bool) -> Iterator[None]:
    """Silence ``DatasetWriter``'s tqdm bar (restored afterwards) unless ``progress``."""
    import ffcv.writer

    if progress:
        yield
        return
    original = ffcv.writer.tqdm
    ffcv.writer.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        ffcv.writer.tqdm = original


def write(
    source_folder: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    mode: str = "raw",
    max_resolution: int | None = None,
    quality: int = 90,
    workers: int | None = None,
    chunksize: int = 100,
    progress: bool = False,
) -> dict[str, Any]:
    """Write ``source_folder`` (ImageFolder layout) to the FFCV file ``out_path``; time it.

    ``mode`` is RGBImageField's ``write_mode`` (``"raw"`` pixels or ``"jpg"``); ``workers`` defaults
    to the CPU count (FFCV's default). ``out_path`` is overwritten.
    """
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    if mode not in ("raw", "jpg"):
        raise ValueError(f"mode must be 'raw' or 'jpg', not {mode!r}")
    items = samples(source_folder)
    if not items:
        raise ValueError(f"{source_folder}: no images")
    workers = workers or os.cpu_count() or 1
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fields = {
        "image": RGBImageField(write_mode=mode, max_resolution=max_resolution, jpeg_quality=quality),
        "label": IntField(),
    }
    with _quiet_writer(progress):
        start = time.perf_counter()
        writer = DatasetWriter(str(out), fields, num_workers=workers)
        writer.from_indexed_dataset(FolderDataset(items), chunksize=chunksize)
        seconds = time.perf_counter() - start
    fd = os.open(out, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    synced = time.perf_counter() - start
    return {
        "seconds": seconds,
        "seconds_fsync": synced,
        "bytes": out.stat().st_size,
        "samples": len(items),
        "files_per_s": len(items) / seconds,
        "mode": mode,
        "max_resolution": max_resolution,
        "quality": quality if mode == "jpg" else None,
        "workers": workers,
    }


def _loader(
    path: str | os.PathLike[str],
    batch_size: int,
    workers: int,
    order: str,
    crop: int | None,
    seed: int,
    os_cache: bool = True,
    drop_last: bool = False,
    indices: Sequence[int] | None = None,
) -> Any:
    """FFCV ``Loader`` with the benchmark's pipelines (BHWC uint8 images, int64 labels)."""
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import CenterCropRGBImageDecoder, SimpleRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import ToTensor

    orders = {"sequential": OrderOption.SEQUENTIAL, "random": OrderOption.RANDOM}
    if order not in orders:
        raise ValueError(f"order must be one of {sorted(orders)}, not {order!r}")
    decoder = SimpleRGBImageDecoder() if crop is None else CenterCropRGBImageDecoder((crop, crop), ratio=CROP_RATIO)
    return Loader(
        str(path),
        batch_size=batch_size,
        num_workers=workers,
        order=orders[order],
        os_cache=os_cache,
        drop_last=drop_last,
        seed=seed,
        indices=None if indices is None else np.asarray(indices, dtype=np.uint64),
        pipelines={"image": [decoder, ToTensor()], "label": [IntDecoder(), ToTensor()]},
    )


def read(
    path: str | os.PathLike[str],
    batch_size: int = 64,
    workers: int = 2,
    order: str = "sequential",
    crop: int | None = None,
    epochs: int = 5,
    seed: int = 0,
    os_cache: bool = True,
) -> dict[str, Any]:
    """Read every record of ``path`` ``1 + epochs`` times through FFCV's Loader; images/s per epoch.

    Epoch 0 warms up (numba compiles the pipeline on first use: ``first_epoch_s``); ``images_per_s``
    is the median of the following ``epochs``. The page cache is whatever the caller left it.
    """
    import numba

    start = time.perf_counter()
    loader = _loader(path, batch_size, workers, order, crop, seed, os_cache=os_cache)
    setup_s = time.perf_counter() - start
    times: list[float] = []
    counts: list[int] = []
    first: dict[str, Any] = {}
    for _ in range(1 + epochs):
        t0 = time.perf_counter()
        n = 0
        for images, labels in loader:
            n += images.shape[0]
            if not first:
                first = {
                    "batch_shape": list(images.shape),
                    "batch_dtype": str(images.dtype),
                    "batch_strides": list(images.stride()),
                    "batch_type": type(images).__name__,
                    "label_shape": list(labels.shape),
                    "label_dtype": str(labels.dtype),
                }
        times.append(time.perf_counter() - t0)
        counts.append(n)
    rates = [n / t for n, t in zip(counts[1:], times[1:], strict=True)]
    return {
        "images_per_s": statistics.median(rates) if rates else None,
        "epoch_images_per_s": rates,
        "epoch_s": times[1:],
        "images_per_epoch": counts[0],
        "first_epoch_s": times[0],
        "first_epoch_images_per_s": counts[0] / times[0],
        "setup_s": setup_s,
        "batch_size": batch_size,
        "workers": workers,
        "order": order,
        "crop": crop,
        "os_cache": os_cache,
        "numba_threading_layer": numba.threading_layer(),
        **first,
    }


def pixels(
    path: str | os.PathLike[str], indices: Sequence[int], crop: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Decoded ``uint8`` images ``(N, H, W, 3)`` and labels ``(N,)`` of records ``indices``, in that order."""
    if len(indices) == 0:
        raise ValueError("no indices")
    loader = _loader(path, len(indices), 1, "sequential", crop, seed=0, indices=indices)
    images, labels = [], []
    for batch_images, batch_labels in loader:
        images.append(batch_images.numpy().copy())  # FFCV reuses its batch buffers
        labels.append(batch_labels.numpy().reshape(-1).copy())
    return np.concatenate(images), np.concatenate(labels)


def stored(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Per-record storage of the ``image`` field: ``mode`` ("jpg"/"raw"), ``height``, ``width``."""
    from ffcv.reader import Reader

    reader = Reader(str(path))
    meta = reader.metadata[f"f{list(reader.handlers).index('image')}"]  # fields are stored as f0, f1, ...
    names = np.array(["jpg", "raw"])
    return {"mode": names[meta["mode"]], "height": meta["height"].copy(), "width": meta["width"].copy()}
