"""PackLoader's threads tuned beside the DataLoader (``packload.diagnose.tune_fast``): which thread
counts are tried and when the ladder stops, the pick and the code to paste, the budget on a virtual
clock, and the loader each trial reads: real batches of a real pack, epoch after epoch. The trials'
figures come from a stand-in for ``TrialRunner`` that gives each thread count a known rate, so the
decisions are checked exactly, with no time measured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from packload import PackedImageFolder, pack
from packload.diagnose import tune_fast
from packload.diagnose.gpu_step import DummyStep
from packload.diagnose.tune_fast import tune_fast_path
from packload.diagnose.tune_trials import FAST_PATH, Trial
from tests.image_factory import make_image_folder

BATCH, SIZE = 4, 16


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pack of 10 records (two and a half batches of 4) and one of 3 (less than a batch)."""
    root = tmp_path_factory.mktemp("tune_fast")
    make_image_folder(root / "ten", classes=("a", "b"), per_class=5, seed=7)
    make_image_folder(root / "three", classes=("a",), per_class=3, seed=8)
    pack(root / "ten", root / "ten.lmdb", workers=1, progress=False)
    pack(root / "three", root / "three.shards", workers=1, progress=False)
    return root


class Clock:
    """``time`` for tune_fast: moved on only by the stand-in's trials."""

    def __init__(self) -> None:
        self.now = 500.0

    def perf_counter(self) -> float:
        return self.now


class Runner:
    """A stand-in for ``TrialRunner``: each thread count has a known rate (None: no measurement); a
    trial takes ``trial_s`` of the virtual clock, cut at the deadline as TrialRunner cuts it, and
    ``pull`` batches are drawn from the loader the tuner built for it."""

    def __init__(self, clock: Clock, rates: dict[int, float | None], trial_s: float = 1.0, pull: int = 0) -> None:
        self.clock, self.rates, self.trial_s, self.pull = clock, rates, trial_s, pull
        self.args: tuple[Any, ...] = ()
        self.runs: list[dict[str, Any]] = []
        self.announced: list[int] = []
        self.batches: dict[int, list[Any]] = {}

    def __call__(self, *args: Any) -> Runner:  # built as TrialRunner(dataset, batch_size, ...)
        self.args = args
        return self

    def run(self, workers: int, prefetch: int | None, pin: bool, steady_s: float, deadline: float,
            phase: str) -> Trial:
        self.runs.append({"threads": workers, "prefetch": prefetch, "pin": pin, "steady_s": steady_s,
                          "started": self.clock.now, "deadline": deadline, "phase": phase})
        if self.pull:
            make = self.args[8]
            loader = make(workers, prefetch, pin)
            self.batches[workers] = [next(loader) for _ in range(self.pull)]
        self.clock.now = min(deadline, self.clock.now + self.trial_s)
        rate = self.rates[workers]
        return Trial(workers, prefetch, pin, samples_per_s=rate or 0.0, batches_per_s=(rate or 0.0) / BATCH,
                     gpu_wait=0.5, startup_s=0.1, worker_rss_mb=0.0, worker_pss_mb=0.0, noise=0.01, cpu_cores=1.0,
                     batches=10 if rate else 0, seconds=self.trial_s, phase=phase)

    def finished(self, number: int, trial: Trial) -> None:
        self.announced.append(number)

    @property
    def tried(self) -> list[int]:
        return [r["threads"] for r in self.runs]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    virtual = Clock()
    monkeypatch.setattr(tune_fast, "time", virtual)
    return virtual


def tuned(monkeypatch: pytest.MonkeyPatch, runner: Runner, dataset: PackedImageFolder, step: Any = None,
          budget_s: float = 30.0, tolerance: float = 0.05, max_threads: int | None = 8) -> dict[str, Any]:
    monkeypatch.setattr(tune_fast, "TrialRunner", runner)
    return tune_fast_path(dataset, BATCH, SIZE, step or DummyStep(step_ms=100, device="cpu"), budget_s, tolerance,
                          max_threads=max_threads)


def test_a_pack_with_less_than_a_batch_is_not_measured(packs: Path, clock: Clock,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    runner = Runner(clock, {})
    result = tuned(monkeypatch, runner, PackedImageFolder(packs / "three.shards"))
    assert result == {"trials": [], "pick": None, "code": None,
                      "note": "not measured: the pack holds 3 records, fewer than a batch of 4"}
    assert runner.runs == [] and runner.args == ()  # no trial was even prepared


def test_the_ladder_the_pick_and_the_code(packs: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """0, 1, 2, 4 and the cap (8) are tried while none feeds the 40 img/s step; the pick is the fewest
    threads within the tolerance of the fastest (4 threads: 30.5 is within 5 % of 32), as measured."""
    rates = {0: 10.0, 1: 18.0, 2: 25.0, 4: 30.5, 8: 32.0}
    runner = Runner(clock, rates)
    dataset = PackedImageFolder(packs / "ten.lmdb")
    result = tuned(monkeypatch, runner, dataset)
    assert runner.tried == [0, 1, 2, 4, 8] and runner.announced == [1, 2, 3, 4, 5]
    assert all(r["prefetch"] is None and r["pin"] is False and r["phase"] == FAST_PATH for r in runner.runs)
    assert result["threads"] == 4 and result["pick_index"] == 3
    assert result["pick"] == result["trials"][3] and result["pick"]["num_workers"] == 4
    assert result["samples_per_s"] == 30.5 and result["gpu_wait"] == 0.5
    assert [t["samples_per_s"] for t in result["trials"]] == [10.0, 18.0, 25.0, 30.5, 32.0]
    assert result["code"] == "loader = packload.PackLoader(ds, 4, crop=packload.CenterCrop(16), threads=4)"
    # what the runner was built with: the pack, the batch, no sampler or collate, the step's own rate
    dataset_arg, batch, sampler, collate, _, step_rate, guard = runner.args[:7]
    assert dataset_arg is dataset and batch == BATCH and sampler is None and collate is None
    assert step_rate == 40.0 and guard.margin == 0
    assert tuned(monkeypatch, Runner(clock, rates), dataset, tolerance=0.01)["threads"] == 8  # 30.5 is not within 1 %


def test_the_ladder_stops_once_the_step_is_fed(packs: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """2 threads deliver 38.5 img/s, within 5 % of the step's 40: more threads cannot help."""
    runner = Runner(clock, {0: 10.0, 1: 20.0, 2: 38.5, 4: 40.0, 8: 40.0})
    result = tuned(monkeypatch, runner, PackedImageFolder(packs / "ten.lmdb"))
    assert runner.tried == [0, 1, 2] and result["threads"] == 2


@pytest.mark.parametrize("max_threads, cores, ladder", [
    (6, 2, [0, 1, 2, 4, 6]),
    (1, 2, [0, 1]),
    (0, 2, [0]),  # none beyond the main thread: never more than asked
    (None, 3, [0, 1, 2, 3]),  # by default up to the usable cores
    (None, 1, [0, 1]),
])
def test_threads_are_tried_up_to_the_cap(packs: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch,
                                         max_threads: int | None, cores: int, ladder: list[int]) -> None:
    monkeypatch.setattr(tune_fast, "usable_cores", lambda: cores)
    runner = Runner(clock, dict.fromkeys(range(9), 5.0))
    tuned(monkeypatch, runner, PackedImageFolder(packs / "ten.lmdb"), max_threads=max_threads)
    assert runner.tried == ladder


def test_the_budget_shares_its_time_among_the_trials_left_and_ends_the_ladder(
        packs: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each trial is given 60 % of its share of the time left (at most 3 s); one that runs to the
    deadline ends the ladder, and the pick is among the trials measured."""
    start = clock.now
    runner = Runner(clock, {0: 10.0, 1: 20.0, 2: 30.0, 4: 40.0, 8: 40.0}, trial_s=4.0)
    result = tuned(monkeypatch, runner, PackedImageFolder(packs / "ten.lmdb"), budget_s=10.0)
    assert runner.tried == [0, 1, 2]
    assert [r["started"] - start for r in runner.runs] == [0.0, 4.0, 8.0]
    assert [r["steady_s"] for r in runner.runs] == pytest.approx([10 / 5 * 0.6, 6 / 4 * 0.6, 2 / 3 * 0.6])
    assert all(r["deadline"] == start + 10.0 for r in runner.runs)
    assert clock.now == start + 10.0 and result["threads"] == 2
    long = Runner(clock, dict.fromkeys(range(9), 5.0), trial_s=0.5)
    tuned(monkeypatch, long, PackedImageFolder(packs / "ten.lmdb"), budget_s=100.0)
    assert long.runs[0]["steady_s"] == 3.0  # 100 / 5 * 0.6 = 12, capped
    short = Runner(clock, dict.fromkeys(range(9), 5.0), trial_s=0.01)
    tuned(monkeypatch, short, PackedImageFolder(packs / "ten.lmdb"), budget_s=0.2)
    assert short.runs[0]["steady_s"] == 0.1  # 0.2 / 5 * 0.6 = 0.024, raised to the least


def test_nothing_measured_says_so(packs: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = Runner(clock, dict.fromkeys(range(9)))
    result = tuned(monkeypatch, runner, PackedImageFolder(packs / "ten.lmdb"), budget_s=12.0)
    assert runner.tried == [0, 1, 2, 4, 8]
    assert result["pick"] is None and result["code"] is None and len(result["trials"]) == 5
    assert result["note"] == "no PackLoader trial finished within 12.0 s"
    spent = Runner(clock, {})
    result = tuned(monkeypatch, spent, PackedImageFolder(packs / "ten.lmdb"), budget_s=0.0)
    assert spent.runs == [] and result == {"trials": [], "pick": None, "code": None,
                                           "note": "no PackLoader trial finished within 0.0 s"}


class GpuStep:
    """A step on a GPU, as far as the tuner asks: pinned batches are what it is fed."""

    on_gpu = True

    def step_rate(self, batch_size: int, image_shape: tuple[int, ...] | None = None) -> float:
        assert image_shape == (3, SIZE, SIZE)
        return 1000.0


def test_a_step_on_the_gpu_gets_pinned_batches_and_code_that_pins(packs: Path, clock: Clock,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    runner = Runner(clock, {0: 990.0})
    result = tuned(monkeypatch, runner, PackedImageFolder(packs / "ten.lmdb"), step=GpuStep())
    assert runner.tried == [0] and runner.runs[0]["pin"] is True
    assert result["code"] == ("loader = packload.PackLoader(ds, 4, crop=packload.CenterCrop(16), threads=0, "
                              "pin_memory=True)")


def test_each_trial_reads_real_batches_epoch_after_epoch(packs: Path, clock: Clock,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The loader a trial reads is PackLoader over the pack with the trial's threads, centre-cropped to
    the image size: whole batches only (10 records: 2 a pass), and endless, so that a trial may read
    more than one pass."""
    runner = Runner(clock, dict.fromkeys(range(3), 1.0), pull=5)
    tuned(monkeypatch, runner, PackedImageFolder(packs / "ten.lmdb"), max_threads=2)
    assert sorted(runner.batches) == [0, 1, 2]
    for batches in runner.batches.values():
        assert len(batches) == 5
        for images, labels in batches:
            assert images.shape == (BATCH, 3, SIZE, SIZE) and images.dtype == torch.uint8
            assert labels.shape == (BATCH,) and set(labels.tolist()) <= {0, 1}
        for k in (0, 2):  # each pass: 8 different records of the 10, the short batch dropped
            assert len({image.numpy().tobytes() for images, _ in batches[k : k + 2] for image in images}) == 8
