"""Where an input pipeline stalls (``packload.diagnose.stall``), on datasets of known cost: preparation
bound, step bound, close calls, and the shares that name the bottleneck."""

from __future__ import annotations

import time

import numpy as np
import pytest
from torch.utils.data import Dataset

from packload.diagnose import doctor as doctor_module
from packload.diagnose.gpu_step import DummyStep
from packload.diagnose.stall import StallPlan, bottleneck, measure_stall, stall_shares


# -- stall analysis --------------------------------------------------------------------------------
class SleepyImages(Dataset):
    """Images whose preparation costs a known time: ``__getitem__`` sleeps ``seconds``."""

    def __init__(self, count: int, seconds: float) -> None:
        self.count, self.seconds = count, seconds

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int):
        time.sleep(self.seconds)
        return np.zeros((8, 8, 3), np.uint8), 0


def sleepy_plan(count=72, seconds=0.01):
    return StallPlan(SleepyImages(count, seconds), list(range(count)), files=[])


def test_stall_prep_bound_names_cpu_preparation():
    report = measure_stall(sleepy_plan(), DummyStep(step_ms=1.0, device="cpu"), batch_size=8, workers=2,
                           max_batches=8)
    # two workers sleeping 10 ms per sample deliver at most 200 samples/s
    assert 0 < report["prepare"]["samples_per_s"] <= 200 * 1.1  # sleeps bound it from above only
    assert report["step"]["samples_per_s"] == pytest.approx(8000)
    assert report["fetch"] is None and report["eviction"] is None
    assert report["bottleneck"] == "cpu_preparation" and report["shares"]["prep_stall"] > 0.5
    assert report["prepare"]["gpu_wait_share_of_step"] > 1
    assert any("storage not measured" in note for note in report["notes"])


def test_stall_slow_step_names_the_gpu():
    report = measure_stall(sleepy_plan(), DummyStep(step_ms=2000.0, device="cpu"), batch_size=8, workers=2,
                           max_batches=8)
    assert report["step"]["samples_per_s"] == pytest.approx(4)
    assert report["bottleneck"] == "gpu" and report["shares"]["gpu_busy"] > 0.9


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
