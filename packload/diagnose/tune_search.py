"""Which DataLoader configurations the tuner measures (each one by ``tune_runner.TrialRunner``).

The search is coarse to fine, never a full grid: workers 0, 1, 2, 4, 8... (without 1 where 8 or
more may be tried: the bisection measures it if it matters) until the GPU is
saturated, the rate stops rising, the budget runs out or memory would get short. The ladder stops at
the usable cores while the workers keep them busy; where they wait instead (a network disk: the
cores idle while the loader starves), it climbs past them, up to ``WAITING_CAP`` workers or what the
process's file-descriptor limit allows. Then a bisection
for the fewest workers within ``tolerance`` of the best rate; then a deeper prefetch queue and
(on CUDA) ``pin_memory`` at that point; then the pick is measured again so that no lucky outlier
wins. The pick is the cheapest configuration (fewest workers, shallowest queue, no pinning)
within ``tolerance`` of the best (``tune_trials.select``).
"""

from __future__ import annotations

import math
import time

from packload.diagnose.tune_runner import MIN_WINDOWS, TrialRunner
from packload.diagnose.tune_trials import Key, Trial, aggregate, select

__all__ = ["CAP_REACHED", "DESCRIPTORS_REACHED", "FDS_PER_WORKER", "PREFETCH_DEEPER", "PREFETCH_DEFAULT", "WAITING_CAP",
           "WAITING_SHARE", "Search", "descriptor_workers"]

PREFETCH_DEFAULT = 2
PREFETCH_DEEPER = (4, 8)
WAITING_CAP = 64  # workers at most where they wait rather than compute (stated in the report)
WAITING_SHARE = 0.75  # with less than this share of the usable cores busy, the workers are waiting
FDS_PER_WORKER = 16  # descriptors a DataLoader worker may hold (its pipes, queues, the pack's files)
# What ended a climb past the cores that was still gaining: the cap, or the open-file limit below it.
CAP_REACHED = f"the cap of {WAITING_CAP} workers"
DESCRIPTORS_REACHED = "file descriptors"


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
