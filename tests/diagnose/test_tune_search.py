"""How the tuner merges and picks measurements, and what it feeds a trial
(``packload.diagnose.tune_search``): a configuration's median trial, the cheapest configuration within the
tolerance, endless sampler epochs, the memory guard's prediction, and batch sizes in bytes."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

from packload.diagnose import loader_memory
from packload.diagnose.loader_memory import MemoryGuard, batch_nbytes
from packload.diagnose.tune_runner import Cycle
from packload.diagnose.tune_trials import (
    FAST_PATH,
    Trial,
    aggregate,
    cost,
    median_trial,
    rate_text,
    select,
    trial_label,
)


def trial(workers: int, prefetch: int | None, pin: bool, rate: float, **fields: Any) -> Trial:
    values: dict[str, Any] = {"batches_per_s": rate / 16, "gpu_wait": 0.1, "startup_s": 1.0, "worker_rss_mb": 100.0,
                              "worker_pss_mb": 50.0, "noise": 0.02, "cpu_cores": 1.0, "batches": 40,
                              "seconds": 2.0, "phase": "coarse"}
    values.update(fields)
    return Trial(workers, prefetch, pin, samples_per_s=rate, **values)


def test_repeats_are_represented_by_their_median_trial_and_failed_trials_dropped() -> None:
    """A configuration measured several times stands as its median trial (the lower of two), the
    trial itself: its figure is a row of the report, never a blend that no row shows."""
    low = trial(2, 2, False, 100.0, noise=0.04, startup_s=1.0)
    high = trial(2, 2, False, 300.0, noise=0.02, startup_s=3.0, phase="confirm")
    merged = aggregate([high, low, trial(2, 2, False, 0.0, batches=0),  # cut off before any window: no measurement
                        trial(4, 2, False, 500.0)])
    assert set(merged) == {(2, 2, False), (4, 2, False)}
    assert merged[(2, 2, False)] is low, "the lower of two: a lucky outlier never wins"
    middle = trial(2, 2, False, 200.0, phase="confirm")
    assert aggregate([high, low, middle])[(2, 2, False)] is middle
    assert median_trial([high]) is high


def test_the_pick_and_the_fastest_are_trials_as_measured() -> None:
    trials = [trial(2, 2, False, 900.0), trial(4, 2, False, 1000.0), trial(2, 2, False, 960.0, phase="confirm"),
              trial(4, 2, False, 980.0, phase="confirm")]
    pick, fastest = select(trials, tolerance=0.1)
    assert pick is trials[0] and fastest is trials[3]  # (2, 2): 900 and 960 -> 900; (4, 2): 1000 and 980 -> 980
    assert rate_text(pick.samples_per_s) == "900 img/s"
    assert trial_label(pick) == "workers=2 prefetch=2 pin=no" and trial_label((0, None, True)) == "workers=0 prefetch=- pin=yes"
    assert trial_label(trial(3, None, False, 10.0, phase=FAST_PATH)) == "PackLoader threads=3"


def test_the_pick_is_the_cheapest_configuration_within_the_tolerance() -> None:
    trials = [trial(8, 2, False, 1000.0), trial(4, 2, False, 970.0), trial(4, 4, False, 975.0),
              trial(2, 2, False, 900.0), trial(4, 2, True, 990.0)]
    pick, fastest = select(trials, tolerance=0.04)
    assert fastest.key == (8, 2, False) and pick.key == (4, 2, False)  # fewest workers, then shallowest queue
    assert select(trials, tolerance=0.15)[0].key == (2, 2, False)
    assert cost((0, None, False)) < cost((1, 2, False)) < cost((1, 4, False)) < cost((1, 4, True))
    tied = [trial(2, 2, False, 500.0, worker_pss_mb=90.0), trial(2, 2, False, 500.0, worker_pss_mb=40.0)]
    assert select(tied, 0.0)[0] is tied[0]  # one configuration: its median trial, the earlier on a tie
    with pytest.raises(RuntimeError, match="no trial completed"):
        select([trial(1, 2, False, 0.0, batches=0)], 0.04)


class EpochSampler:
    """Yields ``epoch * 10 + k`` for k < 3; notes every ``set_epoch``."""

    def __init__(self) -> None:
        self.epoch = 0
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.epochs.append(epoch)

    def __iter__(self) -> Any:
        return iter([self.epoch * 10 + k for k in range(3)])


def test_cycle_runs_the_samplers_epochs_on_a_copy() -> None:
    base = EpochSampler()
    assert list(itertools.islice(Cycle(base, 3), 8)) == [0, 1, 2, 10, 11, 12, 20, 21]
    assert base.epochs == [] and base.epoch == 0, "the user's sampler is left as it was"
    indices = list(itertools.islice(Cycle(None, 5), 15))
    assert [sorted(indices[k : k + 5]) for k in (0, 5, 10)] == [list(range(5))] * 3  # a permutation per epoch
    with pytest.raises(ValueError, match="yields no indices"):
        next(iter(Cycle([], 3)))  # type: ignore[arg-type]


def test_the_memory_guard_predicts_from_what_the_workers_took(monkeypatch: pytest.MonkeyPatch) -> None:
    gib = 1 << 30
    monkeypatch.setattr(loader_memory, "memory_status", lambda: {"total": 20 * gib, "available": 4 * gib})
    guard = MemoryGuard()
    assert guard.margin == 2 * gib  # a tenth of the memory, at least 1 GiB
    guard.batch_bytes = 1 << 20
    assert guard.predicted(4, 2, False) == 4 * loader_memory.GUESS_WORKER_BYTES + 8 * (1 << 20)
    assert guard.predicted(4, 2, True) == 4 * loader_memory.GUESS_WORKER_BYTES + 16 * (1 << 20)  # pinned copies
    guard.learn(trial(4, 2, False, 100.0, worker_pss_mb=400.0))
    assert guard.per_worker == 100 << 20
    guard.learn(trial(2, 2, False, 100.0, worker_pss_mb=100.0))  # less per worker: the larger is kept
    guard.learn(trial(0, None, False, 100.0, worker_pss_mb=900.0))  # no workers: nothing to learn
    assert guard.per_worker == 100 << 20
    assert guard.allows(16, 2, False) and not guard.allows(21, 2, False)
    assert not guard.low()
    monkeypatch.setattr(loader_memory, "memory_status", lambda: {"total": 20 * gib, "available": gib})
    assert guard.low()


def test_batch_nbytes_counts_every_tensor() -> None:
    batch = (torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.zeros(2, dtype=torch.int64))
    assert batch_nbytes(batch) == 96 + 16
    assert batch_nbytes({"x": [torch.zeros(3, dtype=torch.float32)], "name": "a"}) == 12
