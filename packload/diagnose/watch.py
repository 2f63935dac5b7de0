"""``packload.watch(loader)``: is slow training the GPU's fault? Measured in the user's own loop.

Wrap any iterable of batches::

    for images, labels in packload.watch(loader):
        ...  # the training step, unchanged

Each batch costs two clock readings (and, with CUDA, two recorded events). ``Watch`` adds up the
time the loop waited for its next batch and the time it spent between batches (the step), and at
the end of the epoch (or every ``every`` batches) reports in one line how much of the time went to
waiting for data, which kind of slow this is, and what to try:

* **input-bound**: the loop waits for data a large share of the time: tune the loader
  (``packload tune PATH --step-ms`` with the step time measured here, which the line prints, and the
  pack or folder the loader reads: its dataset's ``root``);
* **memory-bound**: the GPU's peak memory is close to all it has while the batch is small: a larger
  batch does not fit, so the GPU runs below its speed (mixed precision, activation checkpointing);
* **compute-bound**: the data keeps up: only a faster step helps.

With CUDA the share is what the GPU itself waited: an event is recorded on the current stream when
the loop asks for a batch and another when it has it; the GPU time between the two is time it had
nothing to do, whether or not the loop synchronises.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from packload.core.display import plural

INPUT_BOUND_SHARE = 0.10  # waiting for data more than this share of the time: input-bound
MEMORY_BOUND_SHARE = 0.90  # peak GPU memory above this share of the device's ...
SMALL_BATCH = 32  # ... with batches of at most this many samples: memory-bound


def _batch_size(batch: Any) -> int | None:
    """Samples in a batch: the first dimension of its first tensor (None when it has none)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else None
    if isinstance(batch, (list, tuple)):
        return next((size for size in map(_batch_size, batch) if size is not None), None)
    if isinstance(batch, dict):
        return next((size for size in map(_batch_size, batch.values()) if size is not None), None)
    return None


def watched_source(loader: Any) -> str | None:
    """The pack or image folder ``loader`` reads: the ``root`` of its dataset (a DataLoader's, a
    PackLoader's, through a ``Subset``), or of the loader itself; None when it has none."""
    seen: set[int] = set()
    item = loader
    while item is not None and id(item) not in seen:
        seen.add(id(item))
        root = getattr(item, "root", None)
        if isinstance(root, (str, os.PathLike)) and str(root):
            return str(root)
        item = getattr(item, "dataset", None)
    return None


class Watch:
    """An iterable over ``loader``'s batches that measures where the training loop's time goes.

    ``every``: also report every that many batches (default: at the end of each epoch only).
    ``report``: where the line goes (``print`` by default; None: nowhere, read ``summary()``).
    ``cuda``: measure the GPU's own waiting with CUDA events (default: when CUDA is initialised).
    """

    def __init__(self, loader: Iterable[Any], every: int | None = None,
                 report: Callable[[str], Any] | None = print, cuda: bool | None = None) -> None:
        if every is not None and every < 1:
            raise ValueError(f"every={every}: give a number of batches, at least 1")
        self.loader, self.every, self.report = loader, every, report
        self.cuda = (torch.cuda.is_available() and torch.cuda.is_initialized()) if cuda is None else cuda
        self.batches = self.samples = 0
        self.wait_s = self.step_s = 0.0
        self.gpu_wait_ms = 0.0
        self._events: list[tuple[Any, Any]] = []  # (asked, got) pairs not resolved yet
        self.batch_size: int | None = None

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        iterator = iter(self.loader)
        handed: float | None = None  # when the last batch went to the loop
        while True:
            asked = time.perf_counter()
            if handed is not None:
                self.step_s += asked - handed
            marks = self._mark() if self.cuda else None
            try:
                batch = next(iterator)
            except StopIteration:
                break
            got = time.perf_counter()
            if marks is not None:
                marks[1].record()
                self._events.append(marks)
            self.wait_s += got - asked
            self.batches += 1
            size = _batch_size(batch)
            self.samples += size or 0
            self.batch_size = max(self.batch_size or 0, size or 0) or None
            handed = time.perf_counter()
            yield batch
            if self.every and self.batches % self.every == 0 and self.report is not None:
                self.report(self.line())
        if self.report is not None and self.batches:
            self.report(self.line())

    def _mark(self) -> tuple[Any, Any]:
        asked, got = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        asked.record()
        return asked, got

    def _resolve(self, wait: bool) -> None:
        """Add up the GPU's idle time of every event pair that has completed (all of them: ``wait``)."""
        pending = []
        for asked, got in self._events:
            if wait:
                got.synchronize()
            if got.query():
                self.gpu_wait_ms += asked.elapsed_time(got)
            else:
                pending.append((asked, got))
        self._events = pending

    def summary(self) -> dict[str, Any]:
        """What was measured so far, and the verdict: ``kind`` is input-bound, memory-bound or compute-bound."""
        if self.cuda:
            self._resolve(wait=True)
        total = self.wait_s + self.step_s
        share = self.wait_s / total if total > 0 else 0.0
        if self.cuda and total > 0:
            share = min(1.0, self.gpu_wait_ms / 1000.0 / total)
        step_ms = 1000.0 * self.step_s / max(1, self.batches - 1) if self.batches > 1 else None
        peak = device_total = None
        if self.cuda:
            peak = torch.cuda.max_memory_allocated()
            device_total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        if share > INPUT_BOUND_SHARE:
            kind = "input-bound"
        elif peak is not None and device_total and peak > MEMORY_BOUND_SHARE * device_total \
                and (self.batch_size or 0) <= SMALL_BATCH:
            kind = "memory-bound"
        else:
            kind = "compute-bound"
        return {"batches": self.batches, "samples": self.samples, "batch_size": self.batch_size,
                "wait_s": self.wait_s, "step_s": self.step_s, "wait_share": share,
                "measured_on": "cuda events" if self.cuda else "the loop's clock", "step_ms": step_ms,
                "peak_gpu_bytes": peak, "gpu_bytes": device_total, "kind": kind}

    def line(self) -> str:
        """The one-line verdict, with what to try."""
        s = self.summary()
        waited = f"{s['wait_share']:.0%} of the time waiting for data ({plural(s['batches'], 'batch')}"
        waited += f", step {s['step_ms']:.1f} ms)" if s["step_ms"] is not None else ")"
        if s["kind"] == "input-bound":
            step = f"{max(1, round(s['step_ms']))}" if s["step_ms"] is not None else "STEP_MS"  # > 0, as tune needs
            source = watched_source(self.loader)
            path = shlex.quote(source) if source else "PATH_OF_YOUR_PACK"
            advice = (f"input-bound: tune the loader with `packload tune {path} --batch-size {s['batch_size'] or 'B'} "
                      f"--step-ms {step}`, or pack at training resolution (--max-side 256)")
        elif s["kind"] == "memory-bound":
            advice = (f"memory-bound: {s['peak_gpu_bytes'] / 2**30:.1f} of {s['gpu_bytes'] / 2**30:.1f} GiB at batch "
                      f"{s['batch_size']}: mixed precision or activation checkpointing would let a larger batch fit")
        else:
            advice = "compute-bound: the data keeps up; only a faster step helps (mixed precision, channels_last)"
        return f"packload.watch: {waited}: {advice}"


def watch(loader: Iterable[Any], every: int | None = None, report: Callable[[str], Any] | None = print,
          cuda: bool | None = None) -> Watch:
    """Wrap ``loader`` to measure, in the real training loop, how long it waits for data (see ``Watch``)."""
    return Watch(loader, every=every, report=report, cuda=cuda)
