"""Measure how fast a DataLoader delivers batches: the one timing routine that the demo, the
benchmarks and the tuner share."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader


@dataclass(frozen=True)
class LoaderTiming:
    """Samples per second in the steady state, and the time to the first batch."""

    samples: int
    seconds: float
    first_batch_s: float

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("inf")


def batch_size_of(batch: Any) -> int:
    """Samples in a batch as DataLoader collates it (tensor pair, list of pairs, ...)."""
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], torch.Tensor):
        return len(batch[0])
    return len(batch)


def time_loader(loader: DataLoader, max_batches: int | None = None, warmup_batches: int = 1) -> LoaderTiming:
    """Iterate ``loader`` (one epoch, or ``max_batches``) and time it, excluding the first
    ``warmup_batches`` (worker start-up is reported apart as ``first_batch_s``)."""
    start = time.perf_counter()
    first_batch_s = 0.0
    counted = 0
    steady_start = start
    for n, batch in enumerate(loader):
        if n + 1 == warmup_batches:
            first_batch_s = time.perf_counter() - start
            steady_start = time.perf_counter()
            continue
        if n + 1 > warmup_batches:
            counted += batch_size_of(batch)
        if max_batches is not None and n + 1 >= max_batches + warmup_batches:
            break
    return LoaderTiming(counted, time.perf_counter() - steady_start, first_batch_s)
