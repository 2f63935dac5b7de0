"""The fast path, tuned beside the DataLoader: ``PackLoader``'s threads measured against the same step,
so that ``packload tune`` can say which of the two to use, with the code to paste.

``PackLoader`` builds whole batches in threads of the training process (no worker processes, nothing
pickled), with ``CenterCrop``: the same square as the DataLoader path's ``ResizeCenterCrop`` up to
sub-pixel rounding. Its trials run through the tuner's own ``TrialRunner``; the threads tried are 0,
1, 2, 4, ... up to the usable cores, each measured once, and the pick is the trial with the fewest
threads within the tolerance of the fastest: one of the rows the report shows, with its figure.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from packload.core.cpus import usable_cores
from packload.core.display import plural
from packload.core.progress import progress_bar, progress_line
from packload.diagnose.gpu_step import DummyStep
from packload.diagnose.loader_memory import MemoryGuard
from packload.diagnose.tune_runner import TrialRunner
from packload.diagnose.tune_trials import FAST_PATH, Trial
from packload.loaders.crop import CenterCrop
from packload.loaders.dataset import PackedImageFolder
from packload.loaders.pack_loader import PackLoader


def _endless(loader: PackLoader) -> Iterator[Any]:
    """Epoch after epoch of ``loader`` (a trial may need more batches than one epoch has); an epoch
    with no whole batch ends it rather than looping for ever."""
    epoch = 0
    while True:
        loader.sampler.set_epoch(epoch)
        batches = 0
        for batch in loader:
            batches += 1
            yield batch
        if not batches:
            raise ValueError(f"an epoch of {loader!r} holds no whole batch")
        epoch += 1


def tune_fast_path(dataset: PackedImageFolder, batch_size: int, image_size: int, step: DummyStep,
                   budget_s: float, tolerance: float, max_threads: int | None = None,
                   progress: bool = False) -> dict[str, Any]:
    """Measure ``PackLoader(dataset, batch_size, crop=CenterCrop(image_size), threads=N)`` for a few N
    within ``budget_s``; returns the trials, the pick (``pick_index``: which of the trials) and the code
    that builds it. Progress shows each trial's figure as the report does."""
    if len(dataset) < batch_size:  # PackLoader drops the last, short batch: an epoch would hold none
        return {"trials": [], "pick": None, "code": None,
                "note": f"not measured: the pack holds {plural(len(dataset), 'record')}, fewer than a batch of "
                        f"{batch_size}"}
    crop = CenterCrop(image_size)
    step_rate = step.step_rate(batch_size, (3, image_size, image_size))
    guard = MemoryGuard(margin_bytes=0)

    def make(threads: int, prefetch: int | None, pin: bool) -> Iterator[Any]:
        return _endless(PackLoader(dataset, batch_size, crop=crop, threads=threads, drop_last=True,
                                   sampler=dataset.sampler(seed=0), pin_memory=pin))

    start = time.perf_counter()
    bar = progress_bar(total=round(budget_s), desc="tune PackLoader", unit="s", disable=not progress, leave=False,
                       bar_format="{desc}: {bar} {n:.0f}/{total} s{postfix}")

    def tick(status: str) -> None:
        bar.n = min(bar.total, time.perf_counter() - start)
        bar.set_postfix_str(status, refresh=True)

    runner = TrialRunner(dataset, batch_size, None, None, step, step_rate, guard, tick, make,
                         lambda text: progress_line(bar, f"tune PackLoader: {text}"))
    top = usable_cores() if max_threads is None else max_threads
    ladder = sorted(t for t in {0, 1, *(2**k for k in range(1, 8) if 2**k < top), top} if t <= top)
    deadline = start + budget_s
    trials: list[Trial] = []
    try:
        for threads in ladder:
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            steady = max(0.1, min(3.0, left / max(1, len(ladder) - len(trials)) * 0.6))
            trial = runner.run(threads, None, step.on_gpu, steady, deadline, FAST_PATH)  # its "workers": threads
            trials.append(trial)
            runner.finished(len(trials), trial)
            if trial.valid and trial.samples_per_s >= (1 - tolerance) * step_rate:
                break  # the step is fed: more threads cannot help
    finally:
        bar.close()
    valid = [t for t in trials if t.valid]
    if not valid:
        return {"trials": [t.as_dict() for t in trials], "pick": None, "code": None,
                "note": f"no PackLoader trial finished within {budget_s:.1f} s"}
    best = max(t.samples_per_s for t in valid)
    pick = min((t for t in valid if t.samples_per_s >= (1 - tolerance) * best), key=lambda t: t.num_workers)
    code = (f"loader = packload.PackLoader(ds, {batch_size}, crop=packload.CenterCrop({image_size}), "
            f"threads={pick.num_workers}" + (", pin_memory=True" if step.on_gpu else "") + ")")
    return {"trials": [t.as_dict() for t in trials], "pick": pick.as_dict(), "pick_index": trials.index(pick),
            "threads": pick.num_workers,
            "samples_per_s": pick.samples_per_s, "gpu_wait": pick.gpu_wait, "code": code}
