"""``packload tune PATH``: a pack or an image folder opened as training reads it (the built-in centre
crop, or the user's own transform), then tuned."""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from packload.core.cpus import usable_cores
from packload.core.errors import UsageError
from packload.core.format import MANIFEST_NAME, shard_number
from packload.diagnose.gpu_step import DummyStep
from packload.diagnose.stall import intact_files
from packload.diagnose.training_loop import DEFAULT_SYNC, resolve_step
from packload.diagnose.tune import TuneResult, tune
from packload.diagnose.tune_fast import tune_fast_path
from packload.loaders.collate import collate_uint8
from packload.loaders.dataset import PackedImageFolder
from packload.loaders.folder import FolderImages
from packload.loaders.transforms import ResizeCenterCrop


def load_transform(spec: str) -> Callable[[Any], Any]:
    """The callable named ``package.module:name`` (``--transform``): the user's own transform, timed
    in place of the built-in centre crop. One clear error when it cannot be imported."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise UsageError(f"--transform {spec!r}: give it as package.module:callable (for example "
                         "mytraining.data:train_transform)")
    try:
        value = getattr(importlib.import_module(module_name), name)
    except ImportError as exc:
        raise UsageError(f"--transform {spec!r}: cannot import {module_name} ({exc}); run from the folder that "
                         "holds it, or install it") from None
    except AttributeError:
        raise UsageError(f"--transform {spec!r}: {module_name} has no {name}") from None
    if not callable(value):
        raise UsageError(f"--transform {spec!r}: {name} is not callable")
    return value


def open_dataset(path: str | os.PathLike[str], image_size: int = 224,
                 transform: Callable[[Any], Any] | None = None) -> Dataset:
    """A pack (``.lmdb`` file or shards folder) or a raw image folder, decoded, resized and
    centre-cropped to ``image_size`` as a training pipeline would, or through ``transform``."""
    root = Path(path)
    crop = transform if transform is not None else ResizeCenterCrop(image_size)
    is_shards = root.is_dir() and any(shard_number(p.name) is not None for p in root.iterdir())
    if root.is_dir() and not (root / MANIFEST_NAME).exists() and not is_shards:
        dataset = FolderImages(root, transform=crop)
        if len(dataset) == 0:
            raise UsageError(f"{root}: no images found (and not a pack); give a pack or an image folder")
        return without_broken(dataset)
    return PackedImageFolder(root, transform=crop)


def without_broken(dataset: FolderImages) -> FolderImages:
    """``dataset`` less the files ``pack`` would skip as broken (its own check, on every file), which
    would otherwise end the search with a DataLoader traceback; they are listed in ``dataset.broken``."""
    kept, broken = intact_files(dataset, list(range(len(dataset))), check="fast", workers=usable_cores())
    if not kept:
        raise UsageError(f"{dataset.root}: every image is broken (first: {broken[0]['path']}: "
                         f"{broken[0]['reason']}); fix the files, or give another folder")
    dataset.samples = [dataset.samples[k] for k in kept]
    dataset.targets = [dataset.targets[k] for k in kept]
    dataset.broken = broken  # type: ignore[attr-defined]
    return dataset


FAST_PATH_SHARE = 0.25  # of the budget, for PackLoader's threads (a pack read through the built-in crop)


def tune_with_fast_path(dataset: PackedImageFolder, batch_size: int, image_size: int, step_ms: float | None = None,
                        model: str | None = None, budget_s: float = 60.0, max_workers: int | None = None,
                        progress: bool = True, device: str | None = None, sync: bool = DEFAULT_SYNC,
                        collate_fn: Callable[[Any], Any] = collate_uint8) -> TuneResult:
    """Tune the DataLoader over ``dataset`` (a pack cropped to ``image_size``) with most of ``budget_s``,
    then ``PackLoader``'s threads with the rest (``result.fast_path``), against the same step; the
    verdict is drawn once both are measured, so that it recommends the faster."""
    result = tune(dataset, batch_size, step_ms=step_ms, model=model, budget_s=budget_s * (1 - FAST_PATH_SHARE),
                  max_workers=max_workers, collate_fn=collate_fn, progress=progress, device=device, sync=sync)
    resolved, _ = resolve_step(step_ms, model)
    step = DummyStep(step_ms=resolved, model=model, device=device, sync=sync)
    started = time.perf_counter()
    result.fast_path = tune_fast_path(PackedImageFolder(dataset.root), batch_size, image_size, step,
                                      budget_s * FAST_PATH_SHARE, result.tolerance, progress=progress)
    result.budget_s, result.elapsed_s = budget_s, result.elapsed_s + time.perf_counter() - started  # both searches
    result.conclude()
    return result


def tune_path(path: str | os.PathLike[str], batch_size: int = 256, step_ms: float | None = None,
              model: str | None = None, budget_s: float = 60.0, max_workers: int | None = None,
              progress: bool = True, device: str | None = None, image_size: int = 224,
              sync: bool = DEFAULT_SYNC, transform: str | None = None) -> TuneResult:
    """``packload tune PATH``: tune reading a pack or an image folder into uint8 batches, through the
    built-in centre crop or the user's ``transform`` (``package.module:callable``). For a pack read
    through the built-in crop, ``PackLoader``'s threads are tuned too (``result.fast_path``). Without
    ``step_ms`` or ``model`` the step is ``training_loop.DEFAULT_STEP_MS``, as the verdict says."""
    if not budget_s > 0:  # checked here, before a share of it goes to the fast path
        raise UsageError(f"budget_s {budget_s} must be a positive number of seconds")
    chosen = load_transform(transform) if transform else ResizeCenterCrop(image_size)
    try:
        dataset = open_dataset(path, image_size, chosen)
        if isinstance(dataset, PackedImageFolder) and not transform:
            return tune_with_fast_path(dataset, batch_size, image_size, step_ms=step_ms, model=model,
                                       budget_s=budget_s, max_workers=max_workers, progress=progress,
                                       device=device, sync=sync)
        result = tune(dataset, batch_size, step_ms=step_ms, model=model, budget_s=budget_s, max_workers=max_workers,
                      collate_fn=collate_uint8, progress=progress, device=device, sync=sync)
        if transform:
            result.fast_path = {"pick": None, "code": None,
                                "note": "not measured: PackLoader crops with CenterCrop, not your transform"}
            result.conclude()
        return result
    except ValueError as exc:
        if isinstance(exc, UsageError):
            raise
        raise UsageError(str(exc)) from None
