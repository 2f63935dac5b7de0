"""How the tuner measures one DataLoader configuration.

A trial starts a DataLoader, times its first batch apart (worker start-up), lets every worker
deliver once more (warm-up, not counted), waits for the GPU to be idle, then feeds batches to the
dummy GPU step in windows of one round of workers until its time is up and it has at least
``MIN_WINDOWS`` windows, and waits for the GPU again: the steady rate is the steps done between
the two idle points (so steps still queued never count), the spread of the windows its noise.
The samples come from ``Cycle``: the user's sampler epoch after epoch, never exhausted.
"""

from __future__ import annotations

import copy
import math
import os
import statistics
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from packload.diagnose.gpu_step import DummyStep
from packload.diagnose.loader_memory import MemoryGuard
from packload.diagnose.measure import cpu_seconds, loader_worker_pids, process_memory
from packload.diagnose.tune_trials import FAST_PATH, Trial, rate_text, trial_label

MIN_WINDOWS = 3


class Cycle(Sampler[int]):
    """Endless indices for a trial: the user's sampler epoch after epoch (a copy, so its state is
    untouched), or a fresh random permutation per epoch."""

    def __init__(self, base: Sampler[int] | None, size: int) -> None:
        try:
            self.base = copy.deepcopy(base)
        except Exception:  # an uncopyable sampler: use it as it is
            self.base = base
        self.size = size

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(0)
        epoch = 0
        while True:
            if self.base is None:
                yield from torch.randperm(self.size, generator=generator).tolist()
                continue
            if hasattr(self.base, "set_epoch"):
                self.base.set_epoch(epoch)
            count = 0
            for index in self.base:
                count += 1
                yield index
            if count == 0:
                raise ValueError("the sampler yields no indices")
            epoch += 1


class TrialRunner:
    """Measures one configuration: a DataLoader over an endless sampler, fed to the dummy step."""

    def __init__(self, dataset: Dataset, batch_size: int, sampler: Sampler[int] | None,
                 collate_fn: Callable[[Any], Any] | None, step: DummyStep, step_rate: float,
                 guard: MemoryGuard, tick: Callable[[str], None],
                 make_loader: Callable[[int, int | None, bool], Iterable[Any]] | None = None,
                 announce: Callable[[str], None] | None = None) -> None:
        """``make_loader(workers, prefetch, pin)`` builds another kind of loader (an endless iterable
        of batches) in place of the DataLoader: ``PackLoader``'s threads are measured so. ``tick``
        gets the status while a trial runs; ``announce`` one line per finished trial (``finished``)."""
        self.dataset, self.batch_size, self.sampler, self.collate_fn = dataset, batch_size, sampler, collate_fn
        self.step, self.step_rate, self.guard, self.tick = step, step_rate, guard, tick
        self.make_loader = make_loader
        self.announce = announce or (lambda text: None)

    def finished(self, number: int, trial: Trial) -> None:
        """Announce trial ``number`` (as the report's table numbers it) with its one figure."""
        figure = rate_text(trial.samples_per_s) if trial.valid else "no measurement"
        self.announce(f"#{number} {trial_label(trial)}: {figure}" + (f" ({trial.note})" if trial.note else ""))
        self.tick(f"#{number} {trial_label(trial)}: {figure}")

    def loader(self, workers: int, prefetch: int | None, pin: bool) -> Iterable[Any]:
        if self.make_loader is not None:
            return self.make_loader(workers, prefetch, pin)
        return DataLoader(self.dataset, batch_size=self.batch_size, sampler=Cycle(self.sampler, len(self.dataset)),
                          collate_fn=self.collate_fn, num_workers=workers, drop_last=True,
                          prefetch_factor=prefetch if workers else None, pin_memory=pin)

    def run(self, workers: int, prefetch: int | None, pin: bool, steady_s: float, deadline: float,
            phase: str) -> Trial:
        """Measure until ``steady_s`` of steady state and ``MIN_WINDOWS`` windows, or ``deadline``; the
        status names the configuration while it is measured (its figure is announced by ``finished``)."""
        bs, step = self.batch_size, self.step
        measuring = f"{trial_label((workers, prefetch if workers else None, pin), phase == FAST_PATH)}: measuring"
        window = max(2, workers)
        rates: list[float] = []
        note, memory = "", {"rss": 0, "pss": 0}
        start = time.perf_counter()
        with warnings.catch_warnings():  # more workers than cores is asked for on purpose (I/O-bound data)
            warnings.filterwarnings("ignore", message=".*DataLoader will create")
            iterator = iter(self.loader(workers, prefetch, pin))
        try:
            step(next(iterator))
            startup = time.perf_counter() - start
            for _ in range(window):  # warm-up: one more batch from every worker
                if time.perf_counter() >= deadline:
                    break
                step(next(iterator))
            pids = [os.getpid(), *loader_worker_pids(iterator)]
            step.synchronize()  # count from an idle GPU to an idle GPU: every counted step is done
            cpu_start = cpu_seconds(pids)
            steady_start = window_start = time.perf_counter()
            count = batches = 0
            while time.perf_counter() < deadline:
                step(next(iterator))
                count += 1
                if count < window:
                    continue
                now = time.perf_counter()
                rates.append(window * bs / (now - window_start))
                batches, count, window_start = batches + count, 0, now
                self.tick(measuring)
                if self.guard.low():
                    note = "stopped: free memory fell below the safety margin"
                    break
                if now - steady_start >= steady_s and len(rates) >= MIN_WINDOWS:
                    break
            else:
                note = "cut short by the time budget"
            step.synchronize()
            batches += count
            seconds = time.perf_counter() - steady_start
            cpu = (cpu_seconds(pids) - cpu_start) / seconds if seconds > 0 else 0.0
            memory = process_memory(pids[1:])
        finally:
            step.synchronize()
            shutdown = getattr(iterator, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            del iterator
        rate = batches * bs / seconds if rates else 0.0
        steady = rates[1:] if len(rates) > 2 else rates  # the first window refills the GPU's queue: not noise
        noise = statistics.stdev(steady) / statistics.fmean(steady) / math.sqrt(len(steady)) if len(steady) > 1 else 1.0
        return Trial(workers, prefetch if workers else None, pin, samples_per_s=rate, batches_per_s=rate / bs,
                     gpu_wait=max(0.0, 1.0 - rate / self.step_rate) if rate else 1.0, startup_s=startup,
                     worker_rss_mb=memory["rss"] / 2**20, worker_pss_mb=memory["pss"] / 2**20, noise=noise,
                     cpu_cores=cpu, batches=batches, seconds=seconds, phase=phase, note=note)
