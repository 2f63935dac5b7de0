"""Where the input pipeline stalls, measured by difference as DS-Analyzer does.

Three rates, each in samples/s: (1) the training step alone (``DummyStep.step_rate``: a real or
emulated GPU step); (2) the DataLoader with the samples already in the page cache, which is the cost
of *preparing* them (decode and transforms); (3) the DataLoader after the samples' files were
evicted from the page cache, which adds the cost of *fetching* them from storage. The training loop
is the one ``tune`` assumes too (``training_loop``): it waits for each step. With DataLoader workers
the loading still overlaps the step (the workers load ahead while the loop waits), so the time per
sample is the slower of the two; with none it is their sum. The difference says how long the GPU
would wait and which stage is to blame.
"""

from __future__ import annotations

import copy
import gc
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, TypedDict

from torch.utils.data import DataLoader, Dataset

from packload.core.errors import UsageError
from packload.core.format import MANIFEST_NAME
from packload.core.scan import Sample
from packload.diagnose.measure import LoaderTiming, time_loader
from packload.diagnose.page_cache import Eviction, evict, warm
from packload.loaders.collate import collate_uint8
from packload.loaders.dataset import PackedImageFolder
from packload.loaders.folder import FolderImages
from packload.loaders.transforms import ResizeCenterCrop
from packload.packer.encode import EncodeOptions, Skipped
from packload.packer.encode_stream import encoded_stream

Bottleneck = Literal["storage", "cpu_preparation", "gpu"]
BOTTLENECKS: tuple[str, ...] = ("storage", "cpu_preparation", "gpu")
GPU_BOUND_BELOW = 0.10  # the GPU is the bottleneck when it waits less than this share of the time


class Step(Protocol):
    """What the analysis needs of a training step (``packload.diagnose.gpu_step.DummyStep`` has it)."""

    description: str
    on_gpu: bool

    def step_rate(self, batch_size: int) -> float: ...


@dataclass
class StallPlan:
    """What to measure: a dataset with its transforms, the samples to read (in order), the files that
    hold them (to warm and to evict), and how batches are collated."""

    dataset: Dataset[Any]
    indices: list[int]
    files: list[str]
    collate_fn: Callable[[Any], Any] = collate_uint8
    skipped: list[dict[str, str]] = field(default_factory=list)  # broken files left out, with reasons


class LoaderRate(TypedDict):
    """One timed pass of the loader."""

    samples_per_s: float
    ms_per_batch: float
    first_batch_s: float
    samples: int
    gpu_wait_ms_per_step: float
    gpu_wait_share_of_step: float


class EvictionReport(TypedDict):
    """Whether the page cache was really emptied before the storage pass."""

    files: int
    failed: int
    cached_before: float | None
    cached_after: float | None
    verified: bool | None


class StallReport(TypedDict):
    """The stall analysis; ``shares`` are fractions of the training time and add up to 1."""

    batch_size: int
    workers: int
    max_batches: int
    repeats: int
    step: dict[str, Any]
    prepare: LoaderRate
    fetch: LoaderRate | None
    eviction: EvictionReport | None
    shares: dict[str, float]
    bottleneck: Bottleneck
    notes: list[str]


# -- plans -----------------------------------------------------------------------------------------
def samples_to_read(batch_size: int, max_batches: int, available: int) -> int:
    """Samples a bounded pass reads: ``max_batches`` timed batches plus the untimed first one."""
    return min(available, (max_batches + 1) * batch_size)


def folder_plan(root: str | os.PathLike[str], count: int, crop: int = 224, seed: int = 0) -> StallPlan:
    """A raw image folder read as training reads it: ``count`` files in shuffled order, decoded,
    resized and centre-cropped."""
    dataset = FolderImages(root, transform=ResizeCenterCrop(crop))
    indices = random.Random(seed).sample(range(len(dataset)), min(count, len(dataset)))
    kept, skipped = intact_files(dataset, indices)
    if not kept:
        first = skipped[0]
        raise UsageError(f"{root}: every image measured is broken (first: {first['path']}: {first['reason']}); "
                         "fix the files, or give another folder")
    return StallPlan(dataset, kept, [dataset.samples[i][0] for i in kept], skipped=skipped)


def intact_files(dataset: FolderImages, indices: list[int], check: str = "full",
                 workers: int = 1) -> tuple[list[int], list[dict[str, str]]]:
    """``indices`` less the files that fail pack's ``check`` (they would end a DataLoader with a
    traceback), and those files with pack's reasons; on ``workers`` threads or processes as pack uses."""
    root = Path(dataset.root)
    samples = [Sample(os.path.relpath(dataset.samples[i][0], root), 0) for i in indices]
    kept: list[int] = []
    skipped: list[dict[str, str]] = []
    for i, item in zip(indices, encoded_stream(root, samples, 0, EncodeOptions(check=check), workers), strict=True):
        if isinstance(item, Skipped):
            skipped.append({"path": item.path, "reason": item.reason})
        else:
            kept.append(i)
    return kept, skipped


def pack_files(path: str | os.PathLike[str]) -> list[str]:
    """The files a pack consists of: the LMDB file, or every file of the shards folder."""
    root = Path(path)
    if root.is_dir():
        return sorted(str(p) for p in root.iterdir() if p.is_file())
    return [str(root)]


def pack_plan(path: str | os.PathLike[str], count: int, crop: int = 224, seed: int = 0) -> StallPlan:
    """A pack read as docs/LOAD.md recommends: ``PackSampler`` order, decoded at reduced size, cropped."""
    transform = ResizeCenterCrop(crop)
    dataset = PackedImageFolder(path, transform=transform, decode_size=(transform.resize, transform.resize))
    order = dataset.sampler(seed=seed, rank=0, world_size=1).epoch_order()[:count].tolist()
    return StallPlan(dataset, order, pack_files(path))


def is_pack(path: str | os.PathLike[str]) -> bool:
    """True for an LMDB file or a shards folder (it holds a manifest); False for an image folder."""
    root = Path(path)
    return root.is_file() or (root / MANIFEST_NAME).is_file()


# -- measuring -------------------------------------------------------------------------------------
def _release(dataset: Dataset[Any]) -> None:
    """Close what the dataset opened in this process, so no mapping keeps the files cached."""
    if isinstance(dataset, PackedImageFolder):
        dataset.reader().close()
    gc.collect()


def time_plan(plan: StallPlan, batch_size: int, workers: int, max_batches: int, pin_memory: bool = False) -> LoaderTiming:
    """One bounded pass of a DataLoader over the plan's samples (``packload.diagnose.measure.time_loader``).

    The pass reads a copy of the dataset (``copy.copy`` goes through ``__getstate__``, which leaves
    open files behind), so what it opens in this process is closed after it and the next pass starts clean.
    """
    dataset = copy.copy(plan.dataset)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=plan.indices, num_workers=workers,
                        collate_fn=plan.collate_fn, pin_memory=pin_memory, persistent_workers=False)
    warmup = 1 if len(plan.indices) > batch_size else 0  # too few samples to leave the first batch out
    try:
        return time_loader(loader, max_batches=max_batches, warmup_batches=warmup)
    finally:
        del loader
        _release(dataset)


def _file_bytes(files: Sequence[str]) -> int:
    return sum(os.stat(f).st_size for f in files)


def warm_plan(plan: StallPlan, batch_size: int, workers: int, max_batches: int, budget: int | None) -> str:
    """Bring the plan's samples into the page cache: read its files when they fit ``budget`` bytes,
    else run one untimed pass (which reads exactly the samples timed). Returns how."""
    if plan.files and (budget is None or _file_bytes(plan.files) <= budget):
        warm(plan.files)
        return "read the files"
    time_plan(plan, batch_size, workers, max_batches)
    return "one untimed pass"


def loader_rate(timing: LoaderTiming, batch_size: int, step_ms: float, base_ms: float | None = None,
                overlapped: bool = True) -> LoaderRate:
    """A pass's rate, and how long the GPU would wait per step beyond ``base_ms`` (default: the step)
    when the loading overlaps the step; beyond ``base_ms`` (default: nothing) when it adds to it."""
    rate = timing.samples_per_s
    ms = batch_size * 1000.0 / rate if rate > 0 else float("inf")
    if overlapped:
        wait = max(0.0, ms - max(step_ms, base_ms if base_ms is not None else step_ms))
    else:
        wait = max(0.0, ms - (base_ms or 0.0))
    return {"samples_per_s": rate, "ms_per_batch": ms, "first_batch_s": timing.first_batch_s,
            "samples": timing.samples, "gpu_wait_ms_per_step": wait, "gpu_wait_share_of_step": wait / step_ms}


def stall_shares(step_rate: float, prepare_rate: float, fetch_rate: float | None,
                 overlapped: bool = True) -> dict[str, float]:
    """Fractions of the training time: the GPU busy, waiting for preparation, waiting for storage.

    Per sample, with the loading ``overlapped`` with the step (DataLoader workers): with the data
    cached a sample takes ``max(step, prepare)``, from storage ``max(that, fetch)``; loaded in the main
    process of a loop that waits for each step, ``step + prepare`` and ``step + fetch``. Each
    difference is a stall.
    """
    t_step = 1.0 / step_rate
    t_prepare = 1.0 / prepare_rate
    t_fetch = max(t_prepare, 1.0 / fetch_rate) if fetch_rate else t_prepare
    if overlapped:
        t_cached, t_total = max(t_step, t_prepare), max(t_step, t_prepare, t_fetch)
    else:
        t_cached, t_total = t_step + t_prepare, t_step + t_fetch
    return {"gpu_busy": t_step / t_total, "prep_stall": (t_cached - t_step) / t_total,
            "fetch_stall": (t_total - t_cached) / t_total}


def bottleneck(shares: dict[str, float], gpu_bound_below: float = GPU_BOUND_BELOW) -> Bottleneck:
    """The stage to fix first: the GPU when it rarely waits, else the larger stall."""
    if shares["prep_stall"] + shares["fetch_stall"] < gpu_bound_below:
        return "gpu"
    return "storage" if shares["fetch_stall"] > shares["prep_stall"] else "cpu_preparation"


def _eviction_report(eviction: Eviction) -> EvictionReport:
    return {"files": eviction.files, "failed": eviction.failed, "cached_before": eviction.before,
            "cached_after": eviction.after, "verified": eviction.verified}


def _notes(eviction: Eviction | None, warmed: str) -> list[str]:
    notes = [f"page cache warmed by: {warmed}",
             "the loader is timed alone; in training the main process needs some CPU too"]
    if eviction is None:
        notes.append("storage not measured: the dataset has no files to evict")
    elif eviction.verified is None:
        notes.append("could not check that the page cache was emptied (mincore unavailable for these files)")
    elif not eviction.verified:
        notes.append(f"the page cache was NOT emptied ({eviction.after:.0%} of the pages still cached: tmpfs, "
                     "a mapping held by another process, or a filesystem that ignores fadvise): the storage "
                     "pass read partly from memory and understates the fetch cost")
    if eviction is not None:
        notes.append("eviction drops file data, not the kernel's inode and directory caches: the metadata "
                     "lookups of a truly cold first epoch are not counted")
    return notes


def _best(timings: list[LoaderTiming]) -> LoaderTiming:
    """The fastest of repeated passes: interference from other processes only ever slows a pass down."""
    return max(timings, key=lambda t: t.samples_per_s)


def _worst(evictions: list[Eviction]) -> Eviction:
    """The eviction that left the most pages cached (unknown counts as worst)."""
    return max(evictions, key=lambda e: 2.0 if e.after is None else e.after)


def measure_stall(plan: StallPlan, step: Step, *, batch_size: int = 64, workers: int = 2, max_batches: int = 20,
                  repeats: int = 1, evict_cache: bool = True, warm_budget: int | None = None,
                  log: Callable[[str], None] | None = None) -> StallReport:
    """Time the step alone, the loader from the page cache and the loader from storage (the best of
    ``repeats`` passes each, alternated); name the bottleneck."""
    say = log or (lambda _: None)
    step_rate = step.step_rate(batch_size)
    step_ms = batch_size * 1000.0 / step_rate
    say(f"step alone: {step_rate:,.0f} samples/s ({step.description})")
    pin, cold = bool(step.on_gpu), evict_cache and bool(plan.files)
    warmed = warm_plan(plan, batch_size, workers, max_batches, warm_budget)
    cached: list[LoaderTiming] = []
    uncached: list[LoaderTiming] = []
    evictions: list[Eviction] = []
    for attempt in range(repeats):
        if attempt and warmed == "read the files":
            warm(plan.files)  # else the storage pass has just read the same samples back into the cache
        cached.append(time_plan(plan, batch_size, workers, max_batches, pin))
        say(f"loader, data in the page cache: {cached[-1].samples_per_s:,.0f} samples/s")
        if cold:
            evictions.append(evict(plan.files))
            uncached.append(time_plan(plan, batch_size, workers, max_batches, pin))
            say(f"loader, data from storage: {uncached[-1].samples_per_s:,.0f} samples/s")
    overlapped = workers > 0  # a loop that waits for each step: only workers load while the step runs
    prepare = loader_rate(_best(cached), batch_size, step_ms, overlapped=overlapped)
    fetch = (loader_rate(_best(uncached), batch_size, step_ms, base_ms=prepare["ms_per_batch"], overlapped=overlapped)
             if cold else None)
    eviction = _worst(evictions) if evictions else None
    shares = stall_shares(step_rate, prepare["samples_per_s"], fetch["samples_per_s"] if fetch else None,
                          overlapped=overlapped)
    notes = _notes(eviction, warmed) + ([f"each loader figure is the best of {repeats} passes"] if repeats > 1 else [])
    return {"batch_size": batch_size, "workers": workers, "max_batches": max_batches, "repeats": repeats,
            "step": {"description": step.description, "on_gpu": bool(step.on_gpu), "samples_per_s": step_rate,
                     "ms_per_batch": step_ms},
            "prepare": prepare, "fetch": fetch,
            "eviction": _eviction_report(eviction) if eviction else None,
            "shares": shares, "bottleneck": bottleneck(shares), "notes": notes}
