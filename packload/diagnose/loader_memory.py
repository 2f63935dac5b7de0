"""How much memory a loader's workers and queued batches take: predicted before a trial (learning the
per-worker cost from the trials so far) and watched during it, so the tuner never starts more
workers than fit, nor lets free memory fall below a safety margin."""

from __future__ import annotations

from typing import Any, Protocol

from packload.core.memory import memory_status
from packload.diagnose.gpu_step import iter_tensors

GUESS_WORKER_BYTES = 256 << 20  # before any worker has been measured


class MeasuredWorkers(Protocol):
    """What the guard learns from a measured trial (``tune_trials.Trial`` has it): named here so that
    this module does not import the search, which imports it."""

    num_workers: int
    worker_pss_mb: float


class MemoryGuard:
    """Keeps free memory above a safety margin: predicts what a configuration's workers and queued
    batches will take (learning the per-worker cost from the trials) and watches it during trials."""

    def __init__(self, margin_bytes: int | None = None) -> None:
        total = memory_status()["total"]
        self.margin = margin_bytes if margin_bytes is not None else max(1 << 30, total // 10)
        self.per_worker = GUESS_WORKER_BYTES
        self.measured = False  # whether per_worker is a trial's measurement yet, not the guess
        self.batch_bytes = 0

    def predicted(self, workers: int, prefetch: int | None, pin: bool) -> int:
        queued = workers * (prefetch or 0) * self.batch_bytes * (2 if pin else 1)
        return workers * self.per_worker + queued

    def allows(self, workers: int, prefetch: int | None, pin: bool) -> bool:
        return memory_status()["available"] - self.predicted(workers, prefetch, pin) >= self.margin

    def low(self) -> bool:
        return memory_status()["available"] < self.margin

    def learn(self, trial: MeasuredWorkers) -> None:
        """Take the per-worker cost from a trial's measured worker memory (the largest seen)."""
        if trial.num_workers and trial.worker_pss_mb:
            measured = int(trial.worker_pss_mb * 2**20 / trial.num_workers)
            self.per_worker = max(self.per_worker, measured) if self.measured else measured
            self.measured = True


def batch_nbytes(batch: Any) -> int:
    return sum(t.nelement() * t.element_size() for t in iter_tensors(batch))
