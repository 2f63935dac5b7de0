"""The fast path, tuned beside the DataLoader: ``PackLoader``'s threads measured against the same step,
so that ``packload tune`` can say which of the two to use, with the code to paste.

``PackLoader`` builds whole batches in threads of the training process (no worker processes, nothing
pickled), with ``CenterCrop``: the same square as the DataLoader path's ``ResizeCenterCrop`` up to
sub-pixel rounding. Its trials run through the tuner's own ``TrialRunner``; the threads tried are 0,
1, 2, 4, ... up to the usable cores, and the pick is the fewest within the tolerance of the fastest.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from packload.core.cpus import usable_cores
from packload.diagnose.gpu_step import DummyStep
from packload.diagnose.loader_memory import MemoryGuard
from packload.diagnose.tune_search import Trial, TrialRunner
from packload.loaders.crop import CenterCrop
from packload.loaders.dataset import PackedImageFolder
from packload.loaders.pack_loader import PackLoader


def _endless(loader: PackLoader) -> Iterator[Any]:
    """Epoch after epoch of ``loader`` (a trial may need more batches than one epoch has)."""
    epoch = 0
    while True:
        loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def tune_fast_path(dataset: PackedImageFolder, batch_size: int, image_size: int, step: DummyStep,
                   budget_s: float, tolerance: float, max_threads: int | None = None) -> dict[str, Any]:
    """Measure ``PackLoader(dataset, batch_size, crop=CenterCrop(image_size), threads=N)`` for a few N
    within ``budget_s``; returns the trials, the pick and the code that builds it."""
    crop = CenterCrop(image_size)
    step_rate = step.step_rate(batch_size, (3, image_size, image_size))
    guard = MemoryGuard(margin_bytes=0)

    def make(threads: int, prefetch: int | None, pin: bool) -> Iterator[Any]:
        return _endless(PackLoader(dataset, batch_size, crop=crop, threads=threads, drop_last=True,
                                   sampler=dataset.sampler(seed=0), pin_memory=pin))

    runner = TrialRunner(dataset, batch_size, None, None, step, step_rate, guard, lambda status: None, make)
    top = usable_cores() if max_threads is None else max_threads
    ladder = sorted({0, 1, *(2**k for k in range(1, 8) if 2**k < top), top})
    start = time.perf_counter()
    deadline = start + budget_s
    trials: list[Trial] = []
    for threads in ladder:
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        steady = max(0.1, min(3.0, left / max(1, len(ladder) - len(trials)) * 0.6))
        trial = runner.run(threads, None, step.on_gpu, steady, deadline, "fast path")
        trial.num_workers = threads  # the trial's "workers" are PackLoader's threads
        trials.append(trial)
        if trial.valid and trial.samples_per_s >= (1 - tolerance) * step_rate:
            break  # the step is fed: more threads cannot help
    valid = [t for t in trials if t.valid]
    if not valid:
        return {"trials": [t.as_dict() for t in trials], "pick": None, "code": None,
                "note": f"no PackLoader trial finished within {budget_s:.1f} s"}
    best = max(t.samples_per_s for t in valid)
    pick = min((t for t in valid if t.samples_per_s >= (1 - tolerance) * best), key=lambda t: t.num_workers)
    code = (f"loader = packload.PackLoader(ds, {batch_size}, crop=packload.CenterCrop({image_size}), "
            f"threads={pick.num_workers}" + (", pin_memory=True" if step.on_gpu else "") + ")")
    return {"trials": [t.as_dict() for t in trials], "pick": pick.as_dict(), "threads": pick.num_workers,
            "samples_per_s": pick.samples_per_s, "gpu_wait": pick.gpu_wait, "code": code}
