"""How the tuner measures one DataLoader configuration, and which ones it measures.

A trial starts a DataLoader, times its first batch apart (worker start-up), lets every worker
deliver once more (warm-up, not counted), waits for the GPU to be idle, then feeds batches to the
dummy GPU step in windows of one round of workers until its time is up and it has at least
``MIN_WINDOWS`` windows, and waits for the GPU again: the steady rate is the steps done between
the two idle points (so steps still queued never count), the spread of the windows its noise.

The search is coarse to fine, never a full grid: workers 0, 1, 2, 4, 8... (without 1 where 8 or
more may be tried: the bisection measures it if it matters) until the GPU is
saturated, the rate stops rising, the budget runs out or memory would get short. The ladder stops at
the usable cores while the workers keep them busy; where they wait instead (a network disk: the
cores idle while the loader starves), it climbs past them, up to ``WAITING_CAP`` workers or what the
process's file-descriptor limit allows. Then a bisection
for the fewest workers within ``tolerance`` of the best rate; then a deeper prefetch queue and
(on CUDA) ``pin_memory`` at that point; then the pick is measured again so that no lucky outlier
wins. The pick is the cheapest configuration (fewest workers, shallowest queue, no pinning)
within ``tolerance`` of the best.
"""

from __future__ import annotations

import copy
import math
import os
import statistics
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from packload.diagnose.gpu_step import DummyStep
from packload.diagnose.loader_memory import MemoryGuard
from packload.diagnose.measure import cpu_seconds, loader_worker_pids, process_memory

MIN_WINDOWS = 3
PREFETCH_DEFAULT = 2
PREFETCH_DEEPER = (4, 8)
WAITING_CAP = 64  # workers at most where they wait rather than compute (stated in the report)
WAITING_SHARE = 0.75  # with less than this share of the usable cores busy, the workers are waiting
FDS_PER_WORKER = 16  # descriptors a DataLoader worker may hold (its pipes, queues, the pack's files)
# What ended a climb past the cores that was still gaining: the cap, or the open-file limit below it.
CAP_REACHED = f"the cap of {WAITING_CAP} workers"
DESCRIPTORS_REACHED = "file descriptors"
Key = tuple[int, int | None, bool]
FAST_PATH = "fast path"  # the phase of PackLoader's trials (their "workers" are its threads)


@dataclass
class Trial:
    """One measured configuration: its settings, steady rate, GPU idle share, start-up and memory."""

    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    samples_per_s: float
    batches_per_s: float
    gpu_wait: float  # share of the time the GPU step waited for data (0..1)
    startup_s: float  # from iter(loader) to the first batch: worker start-up plus one batch
    worker_rss_mb: float
    worker_pss_mb: float  # the workers' proportional share of memory: what they really add
    noise: float  # relative standard error of the steady rate, from its windows
    cpu_cores: float  # CPU used by the main process and the workers, in cores, during the steady phase
    batches: int
    seconds: float
    phase: str
    note: str = ""

    @property
    def key(self) -> Key:
        return (self.num_workers, self.prefetch_factor, self.pin_memory)

    @property
    def valid(self) -> bool:
        return self.batches > 0 and self.samples_per_s > 0

    def settings(self) -> dict[str, Any]:
        return {"num_workers": self.num_workers, "prefetch_factor": self.prefetch_factor,
                "pin_memory": self.pin_memory}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def cost(key: Key) -> tuple[int, int, bool]:
    """Cheaper first: fewer workers, a shallower queue, no pinned memory."""
    return (key[0], key[1] or 0, key[2])


def aggregate(trials: list[Trial]) -> dict[Key, Trial]:
    """One trial per configuration: the median of its measurements (the lower one of two, so a lucky
    outlier never wins), as measured: each configuration's figure is one trial's, a row of the
    report, never a blend of several."""
    groups: dict[Key, list[Trial]] = {}
    for trial in trials:
        if trial.valid:
            groups.setdefault(trial.key, []).append(trial)
    return {key: median_trial(group) for key, group in groups.items()}


def median_trial(group: list[Trial]) -> Trial:
    """The trial of ``group`` whose rate is the (lower) median; the earlier one on a tie."""
    ordered = sorted(group, key=lambda t: t.samples_per_s)
    return ordered[(len(ordered) - 1) // 2]


def rate_text(samples_per_s: float) -> str:
    """A trial's rate as every part of the report writes it (progress, table, pick, verdict)."""
    return f"{samples_per_s:,.0f} img/s"


def trial_label(trial: Trial | Key, fast_path: bool = False) -> str:
    """The configuration of a trial as the progress lines name it."""
    workers, prefetch, pin = trial.key if isinstance(trial, Trial) else trial
    if fast_path or (isinstance(trial, Trial) and trial.phase == FAST_PATH):
        return f"PackLoader threads={workers}"
    return f"workers={workers} prefetch={prefetch or '-'} pin={'yes' if pin else 'no'}"


def select(trials: list[Trial], tolerance: float) -> tuple[Trial, Trial]:
    """(pick, fastest): the cheapest configuration within ``tolerance`` of the fastest one."""
    merged = aggregate(trials)
    if not merged:
        raise RuntimeError("no trial completed a measurement; give a larger budget_s")
    fastest = max(merged.values(), key=lambda t: t.samples_per_s)
    band = (1 - tolerance) * fastest.samples_per_s
    pick = min((t for t in merged.values() if t.samples_per_s >= band), key=lambda t: (cost(t.key), t.worker_pss_mb))
    return pick, fastest


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


def descriptor_workers() -> int:
    """Workers the process's open-file limit leaves room for (``RLIMIT_NOFILE``, soft)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX
        return WAITING_CAP
    return WAITING_CAP if soft == resource.RLIM_INFINITY else max(1, (soft - 64) // FDS_PER_WORKER)


class Search:
    """The coarse-to-fine search over num_workers, prefetch_factor and (on CUDA) pin_memory.

    ``max_workers`` bounds the ladder while workers compute (the usable cores, by default); past it
    the ladder goes on to ``climb_to`` only while the workers wait rather than compute, with fewer
    than ``WAITING_SHARE`` of ``cores`` busy (``climb_to`` defaults to ``max_workers``: no climb)."""

    def __init__(self, runner: TrialRunner, max_workers: int, tolerance: float, budget_s: float,
                 start: float, pin_default: bool, try_pin: bool, trial_s: float | None = None,
                 climb_to: int | None = None, cores: float | None = None) -> None:
        self.bound = max_workers
        self.cores = float(cores if cores is not None else max(1, max_workers))
        self.climb_to = max(max_workers, climb_to if climb_to is not None else max_workers)
        self.limit = CAP_REACHED if self.climb_to >= WAITING_CAP else DESCRIPTORS_REACHED
        max_workers = self.climb_to
        self.runner, self.max_workers, self.tolerance = runner, max_workers, tolerance
        self.deadline = start + budget_s
        self.pin_default, self.try_pin = pin_default, try_pin
        self.trials: list[Trial] = []
        self.skipped: list[str] = []
        self.stopped = ""
        # 1 worker is rarely the pick where many are possible, and a slow trial; the bisection
        # still measures it when 0 falls short and 2 is within tolerance.
        low = {0} if max_workers >= 8 else {0, 1}
        ladder = sorted({*low, *(2**k for k in range(1, 12) if 2**k < max_workers), self.bound, max_workers})
        self.ladder = [w for w in ladder if w <= max_workers]
        steps = len([w for w in self.ladder if w <= self.bound])  # the climb past the cores is rarely taken
        expected = steps + math.ceil(math.log2(max(2, self.bound))) + 2 + int(try_pin) + 1
        self.trial_s = trial_s if trial_s is not None else min(5.0, max(0.25, 0.8 * budget_s / expected - 0.3))

    # -- measuring -----------------------------------------------------------------------------
    def remaining(self) -> float:
        return self.deadline - time.perf_counter()

    def estimate_s(self, workers: int) -> float:
        """A guess of a minimal trial's length (start-up, warm-up, ``MIN_WINDOWS`` windows), from the
        nearest trial with fewer workers, its rate scaled up linearly (at most to the step's rate)."""
        done = [t for t in self.trials if t.valid]
        if not done:
            return 0.0
        near = max((t for t in done if t.num_workers <= workers), key=lambda t: t.num_workers, default=done[0])
        rate = min(self.runner.step_rate, near.samples_per_s * max(1, workers) / max(1, near.num_workers))
        batches = max(2, workers) * (1 + MIN_WINDOWS)
        return max(t.startup_s for t in done) + 1.5 * batches * self.runner.batch_size / rate

    def measure(self, workers: int, prefetch: int | None, pin: bool, phase: str) -> Trial | None:
        """Run one trial if the budget and memory allow it; None (and a reason) if not."""
        prefetch = prefetch if workers else None
        if not self.runner.guard.allows(workers, prefetch, pin):
            self.skipped.append(f"workers={workers} prefetch={prefetch}: would leave less free memory than "
                                f"the {self.runner.guard.margin / 2**30:.1f} GiB safety margin")
            if prefetch in (None, PREFETCH_DEFAULT):  # a deeper queue not fitting says nothing of workers
                self.stopped = self.stopped or "memory"
                self.max_workers = min(self.max_workers, max(0, workers - 1))
            return None
        left = self.remaining()
        if left <= 0 or self.estimate_s(workers) > left:
            self.stopped = self.stopped or "budget"
            return None
        steady = min(self.trial_s, max(0.05, left - self.estimate_s(workers)))
        trial = self.runner.run(workers, prefetch, pin, steady, self.deadline, phase)
        self.trials.append(trial)
        self.runner.finished(len(self.trials), trial)
        self.runner.guard.learn(trial)
        if trial.note.startswith("stopped: free memory"):
            self.stopped = self.stopped or "memory"
            self.max_workers = min(self.max_workers, max(0, workers - 1))
        return trial if trial.valid else None

    def saturated(self, trial: Trial) -> bool:
        return trial.samples_per_s >= (1 - self.tolerance) * self.runner.step_rate

    # -- phases --------------------------------------------------------------------------------
    def run(self) -> str:
        """Run every phase the budget allows; returns why the worker search ended."""
        reason = self.coarse()
        if any(t.valid for t in self.trials):
            self.fine()
            self.deeper_queue()
            if self.try_pin:
                self.pin_memory()
            self.confirm()
        return reason

    def waiting(self, trial: Trial) -> bool:
        """Whether the workers of ``trial`` wait rather than compute: the cores are mostly idle."""
        return trial.cpu_cores < WAITING_SHARE * self.cores

    def coarse(self) -> str:
        """Climb the ladder; returns what ended it: ``saturated`` (the GPU is fed), ``plateau`` (more
        workers stopped helping), ``cores`` (the workers keep the usable cores busy), ``memory``,
        ``budget``, or the limit of the climb (``max_workers``, ``file descriptors``, the cap)."""
        best, flat = 0.0, 0
        last: Trial | None = None
        for workers in self.ladder:
            if workers > self.max_workers:
                return "memory"
            if workers > self.bound and last is not None and not self.waiting(last):
                return "cores"
            trial = self.measure(workers, PREFETCH_DEFAULT, self.pin_default, "coarse")
            if trial is None:
                return self.stopped or "no measurement"
            if self.saturated(trial):
                return "saturated"
            if workers > 1:
                threshold = max(self.tolerance, 2 * trial.noise)
                flat = flat + 1 if trial.samples_per_s <= best * (1 + threshold) else 0
                if flat >= 2:
                    return "plateau"
            best = max(best, trial.samples_per_s)
            last = trial
        if flat:
            return "plateau"
        if self.climb_to > self.bound:
            return self.limit
        return "worker bound"

    def fine(self) -> None:
        """Bisect for the fewest workers within tolerance of the best rate (default queue and pin)."""
        while self.remaining() > 0:
            series = {k[0]: t.samples_per_s for k, t in aggregate(self.trials).items()
                      if k[2] == self.pin_default and k[1] in (None, PREFETCH_DEFAULT)}
            if not series:
                return
            band = (1 - self.tolerance) * max(series.values())
            high = min(w for w, r in series.items() if r >= band)
            low = max((w for w, r in series.items() if w < high), default=None)
            if low is None or high - low <= 1:
                return
            if self.measure((low + high) // 2, PREFETCH_DEFAULT, self.pin_default, "fine") is None:
                return

    def deeper_queue(self) -> None:
        """A deeper prefetch queue at the pick, kept only if it is faster beyond tolerance."""
        pick, _ = select(self.trials, self.tolerance)
        if pick.num_workers == 0 or self.saturated(pick):
            return
        base = pick.samples_per_s
        for depth in PREFETCH_DEEPER:
            trial = self.measure(pick.num_workers, depth, pick.pin_memory, "prefetch")
            if trial is None or trial.samples_per_s <= base * (1 + self.tolerance):
                return
            base = trial.samples_per_s

    def pin_memory(self) -> None:
        """The other pin_memory setting at the pick (CUDA only)."""
        pick, _ = select(self.trials, self.tolerance)
        self.measure(pick.num_workers, pick.prefetch_factor or PREFETCH_DEFAULT, not pick.pin_memory, "pin")

    def confirm(self) -> None:
        """Measure the pick (and the fastest, if another) again; a third time when the two
        measurements disagree beyond twice the tolerance (the median then wins over an outlier)."""
        for _ in range(4):
            pick, fastest = select(self.trials, self.tolerance)
            todo = [k for k in dict.fromkeys((pick.key, fastest.key)) if self.needs_repeat(k)]
            if not todo:
                return
            for key in todo:
                if self.measure(key[0], key[1], key[2], "confirm") is None:
                    return

    def needs_repeat(self, key: Key) -> bool:
        rates = [t.samples_per_s for t in self.trials if t.key == key and t.valid]
        if len(rates) < 2:
            return True
        return len(rates) == 2 and abs(rates[0] - rates[1]) > 2 * self.tolerance * max(rates)
