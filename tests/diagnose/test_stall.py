"""Where an input pipeline stalls (``packload.diagnose.stall``), on datasets of known cost: preparation
bound, step bound, close calls, and the shares that name the bottleneck. No time is measured: the
main process's loading runs on a virtual clock that the samples move, and the passes with workers
report the rates the test gives them."""

from __future__ import annotations

import numpy as np
import pytest
from torch.utils.data import Dataset

from packload.diagnose import doctor as doctor_module
from packload.diagnose import measure as measure_module
from packload.diagnose import stall as stall_module
from packload.diagnose.gpu_step import DummyStep
from packload.diagnose.measure import LoaderTiming
from packload.diagnose.stall import StallPlan, bottleneck, measure_stall, stall_shares


# -- stall analysis --------------------------------------------------------------------------------
class VirtualTime:
    """``time`` for the loader's timing: the clock stands still but for what the samples cost."""

    def __init__(self) -> None:
        self.now = 50.0

    def perf_counter(self) -> float:
        return self.now


class CostlyImages(Dataset):
    """Images whose preparation costs a known time: ``__getitem__`` moves the virtual clock on by
    ``seconds`` (read in this process: ``workers=0``)."""

    def __init__(self, count: int, seconds: float, clock: VirtualTime) -> None:
        self.count, self.seconds, self.clock = count, seconds, clock

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int):
        self.clock.now += self.seconds
        return np.zeros((8, 8, 3), np.uint8), 0


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> VirtualTime:
    virtual = VirtualTime()
    monkeypatch.setattr(measure_module, "time", virtual)
    return virtual


def costly_plan(clock: VirtualTime, count=72, seconds=0.01):
    return StallPlan(CostlyImages(count, seconds, clock), list(range(count)), files=[])


def timed_as(monkeypatch: pytest.MonkeyPatch, samples_per_s: float) -> list[int]:
    """Every loader pass of the analysis reports ``samples_per_s`` (the figures two workers preparing
    a sample in 10 ms each would give), as if measured; returns the workers each pass was asked for."""
    asked: list[int] = []

    def timed(plan, batch_size, workers, max_batches, pin_memory=False):
        asked.append(workers)
        samples = batch_size * max_batches
        return LoaderTiming(samples, samples / samples_per_s, first_batch_s=0.2)

    monkeypatch.setattr(stall_module, "time_plan", timed)
    return asked


def test_stall_prep_bound_in_the_main_process_is_measured_and_named(clock):
    """Loading in the main process of a waiting loop: the rate is the samples' own cost, exactly (10 ms
    each: 100 samples/s), and its whole time per batch (80 ms) adds to each 1 ms step."""
    report = measure_stall(costly_plan(clock), DummyStep(step_ms=1.0, device="cpu"), batch_size=8, workers=0,
                           max_batches=8)
    assert report["prepare"]["samples_per_s"] == pytest.approx(100)
    assert report["prepare"]["samples"] == 64 and report["prepare"]["ms_per_batch"] == pytest.approx(80)
    assert report["step"]["samples_per_s"] == pytest.approx(8000)
    assert report["fetch"] is None and report["eviction"] is None
    assert report["prepare"]["gpu_wait_share_of_step"] == pytest.approx(80)
    assert report["shares"] == pytest.approx({"gpu_busy": 1 / 81, "prep_stall": 80 / 81, "fetch_stall": 0.0})
    assert report["bottleneck"] == "cpu_preparation"
    assert any("storage not measured" in note for note in report["notes"])


def test_stall_prep_bound_with_workers_names_cpu_preparation(monkeypatch):
    """Two workers delivering 200 samples/s (40 ms a batch of 8) against a 1 ms step: they load while
    the step runs, so 39 ms of each batch are the GPU waiting."""
    asked = timed_as(monkeypatch, 200.0)
    report = measure_stall(StallPlan(None, list(range(72)), files=[]), DummyStep(step_ms=1.0, device="cpu"),
                           batch_size=8, workers=2, max_batches=8)
    assert asked == [2, 2]  # the untimed pass that warms the cache, then the timed one
    assert report["prepare"]["samples_per_s"] == pytest.approx(200)
    assert report["prepare"]["gpu_wait_share_of_step"] == pytest.approx(39)
    assert report["shares"] == pytest.approx({"gpu_busy": 1 / 40, "prep_stall": 39 / 40, "fetch_stall": 0.0})
    assert report["bottleneck"] == "cpu_preparation"


def test_stall_slow_step_names_the_gpu(monkeypatch):
    """The same workers against a 2 s step (4 samples/s): the loading hides behind it entirely."""
    timed_as(monkeypatch, 200.0)
    report = measure_stall(StallPlan(None, list(range(72)), files=[]), DummyStep(step_ms=2000.0, device="cpu"),
                           batch_size=8, workers=2, max_batches=8)
    assert report["step"]["samples_per_s"] == pytest.approx(4)
    assert report["prepare"]["gpu_wait_share_of_step"] == 0.0
    assert report["shares"] == pytest.approx({"gpu_busy": 1.0, "prep_stall": 0.0, "fetch_stall": 0.0})
    assert report["bottleneck"] == "gpu"


def test_stall_slow_step_in_the_main_process_still_names_the_gpu(clock):
    """Loaded in the main process, the 80 ms a batch adds to each 2 s step: a 4 % wait, the GPU still
    the bottleneck."""
    report = measure_stall(costly_plan(clock), DummyStep(step_ms=2000.0, device="cpu"), batch_size=8, workers=0,
                           max_batches=8)
    assert report["shares"] == pytest.approx({"gpu_busy": 2000 / 2080, "prep_stall": 80 / 2080, "fetch_stall": 0.0})
    assert report["bottleneck"] == "gpu"


def test_close_stalls_are_called_close():
    shares = stall_shares(step_rate=1000, prepare_rate=500, fetch_rate=350)
    [line] = doctor_module.stall_checks({"shares": shares, "bottleneck": bottleneck(shares), "eviction": None})
    assert line["status"] == "warn" and "about equally" in line["message"]
    clear = stall_shares(step_rate=1000, prepare_rate=900, fetch_rate=100)
    [line] = doctor_module.stall_checks({"shares": clear, "bottleneck": bottleneck(clear), "eviction": None}, "pack")
    assert "about equally" not in line["message"] and "local SSD" in line["fix"] and "pack the" not in line["fix"]


def test_stall_shares_and_bottleneck():
    prep = stall_shares(step_rate=1000, prepare_rate=100, fetch_rate=None)
    assert prep == pytest.approx({"gpu_busy": 0.1, "prep_stall": 0.9, "fetch_stall": 0.0})
    fetch = stall_shares(step_rate=100, prepare_rate=1000, fetch_rate=50)
    assert fetch == pytest.approx({"gpu_busy": 0.5, "prep_stall": 0.0, "fetch_stall": 0.5})
    assert bottleneck(prep) == "cpu_preparation" and bottleneck(fetch) == "storage"
    assert bottleneck(stall_shares(100, 1000, 1000)) == "gpu"
    assert bottleneck(stall_shares(100, 95, 95)) == "gpu"  # a 5 % wait is not worth chasing
    for shares in (prep, fetch):
        assert sum(shares.values()) == pytest.approx(1.0)


def test_loading_in_the_main_process_of_a_waiting_loop_adds_to_each_step():
    """The loop doctor assumes, as tune does, waits for each step: DataLoader workers load while the
    step runs (the slower of the two counts), but with no workers the loading adds to every step."""
    overlapped = stall_shares(step_rate=1000, prepare_rate=1000, fetch_rate=500)
    assert overlapped == pytest.approx({"gpu_busy": 0.5, "prep_stall": 0.0, "fetch_stall": 0.5})
    serial = stall_shares(step_rate=1000, prepare_rate=1000, fetch_rate=500, overlapped=False)
    # 1 ms of step, 1 ms to prepare, 1 ms more to fetch: a third each
    assert serial == pytest.approx({"gpu_busy": 1 / 3, "prep_stall": 1 / 3, "fetch_stall": 1 / 3})
    assert bottleneck(stall_shares(100, 1000, 1000, overlapped=False)) == "gpu"  # 10x faster loading: a 9% wait
    assert sum(serial.values()) == pytest.approx(1.0)
