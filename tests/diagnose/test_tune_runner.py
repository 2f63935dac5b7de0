"""How the tuner measures one configuration (``packload.diagnose.tune_runner.TrialRunner``): a trial's
figures come from whole windows of batches fed to the step, a trial the deadline or low memory cuts
short says so, and another kind of loader (PackLoader's threads) is measured the same way."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Dataset

from packload.diagnose.gpu_step import DummyStep
from packload.diagnose.loader_memory import MemoryGuard
from packload.diagnose.tune_runner import MIN_WINDOWS, TrialRunner
from packload.diagnose.tune_trials import FAST_PATH

BATCH = 4


class Numbers(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.full((3,), float(index)), index % 2


class ShortOfMemory(MemoryGuard):
    def low(self) -> bool:
        return True


def runner(guard: MemoryGuard | None = None, **kwargs: Any) -> tuple[TrialRunner, list[str], list[str]]:
    step = DummyStep(step_ms=1.0, device="cpu")
    ticks: list[str] = []
    announced: list[str] = []
    made = TrialRunner(Numbers(), BATCH, None, None, step, step.step_rate(BATCH), guard or MemoryGuard(),
                       ticks.append, announce=announced.append, **kwargs)
    return made, ticks, announced


def test_a_trial_in_the_main_process_counts_whole_windows_of_batches() -> None:
    run, ticks, announced = runner()
    trial = run.run(0, 2, False, steady_s=0.05, deadline=time.perf_counter() + 30, phase="coarse")
    assert trial.valid and trial.note == "" and trial.phase == "coarse"
    assert trial.key == (0, None, False), "no workers: no prefetch queue"
    assert trial.batches >= MIN_WINDOWS * 2  # windows of at least two batches
    assert trial.samples_per_s == trial.batches * BATCH / trial.seconds
    assert trial.batches_per_s == trial.samples_per_s / BATCH
    assert 0.0 <= trial.gpu_wait <= 1.0
    assert trial.worker_rss_mb == 0.0 and trial.worker_pss_mb == 0.0
    assert ticks and all(tick == "workers=0 prefetch=- pin=no: measuring" for tick in ticks)
    run.finished(1, trial)
    assert announced == [f"#1 workers=0 prefetch=- pin=no: {trial.samples_per_s:,.0f} img/s"]


def test_a_trial_past_its_deadline_has_no_measurement_and_says_why() -> None:
    run, _, announced = runner()
    trial = run.run(0, 2, False, steady_s=1.0, deadline=time.perf_counter(), phase="coarse")
    assert not trial.valid and trial.samples_per_s == 0.0 and trial.gpu_wait == 1.0
    assert trial.note == "cut short by the time budget"
    run.finished(3, trial)
    assert announced == ["#3 workers=0 prefetch=- pin=no: no measurement (cut short by the time budget)"]


def test_low_memory_stops_a_trial_after_its_first_window() -> None:
    run, _, _ = runner(ShortOfMemory())
    trial = run.run(0, 2, False, steady_s=30.0, deadline=time.perf_counter() + 30, phase="coarse")
    assert trial.note == "stopped: free memory fell below the safety margin"
    assert trial.batches == 2, "one window of two batches, then it stopped"


def test_another_loader_is_measured_in_place_of_the_dataloader() -> None:
    asked: list[tuple[int, int | None, bool]] = []

    def threads(workers: int, prefetch: int | None, pin: bool) -> Iterator[Any]:
        asked.append((workers, prefetch, pin))
        return itertools.repeat((torch.zeros(BATCH, 3), torch.zeros(BATCH)))

    run, _, announced = runner(make_loader=threads)
    trial = run.run(3, 2, False, steady_s=0.05, deadline=time.perf_counter() + 30, phase=FAST_PATH)
    assert asked == [(3, 2, False)]
    assert trial.valid and trial.key == (3, 2, False) and trial.batches >= MIN_WINDOWS * 3
    run.finished(1, trial)
    assert announced[0].startswith("#1 PackLoader threads=3: ")
