"""benchmarks/bench_gil.py: its quick mode runs on a tiny JPEG pack and reports every case; its
measurement (images and held time per window, the step's calibrated slices) is checked exactly with
a clock that advances a fixed tick a call, over the real loaders; and the GIL-holding libc is shown
to hold the GIL. The figures of a real run are not checked: they depend on the machine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import bench_gil  # noqa: E402
from packload import EncodeOptions, pack  # noqa: E402
from tests.image_factory import make_image_folder  # noqa: E402


@pytest.fixture(scope="module")
def jpeg_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gil")
    make_image_folder(root / "images", classes=("a", "b"), per_class=8, seed=3)
    pack(root / "images", root / "p.shards", options=EncodeOptions(encoding="jpeg"), workers=1, progress=False)
    return root / "p.shards"


def test_quick_mode_reports_every_contender_fraction_and_switch_interval(jpeg_pack: Path, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "gil.json"
    assert bench_gil.main([str(jpeg_pack), "--quick", "--batch-size", "4", "--crop", "24", "--workers", "2",
                           "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["fractions"] == [0.0, 0.5] and result["switch_ms"] == [5.0, 0.5]
    assert result["workers"] == 2 and result["step_ms"] > 0 and result["alone"]["images_per_s"] > 0
    cases = {(row["contender"], row["switch_ms"], row["fraction"]) for row in result["rows"]}
    assert cases == {("packloader", 5.0, 0.0), ("packloader", 5.0, 0.5), ("packloader", 0.5, 0.0),
                     ("packloader", 0.5, 0.5), ("batch_loader", 5.0, 0.0), ("batch_loader", 5.0, 0.5)}
    for row in result["rows"]:
        assert row["images_per_s"] > 0 and len(row["images_per_s_runs"]) == 1
        assert 0 <= row["gil_held"] <= 1
        if row["fraction"] == 0.0:
            assert row["vs_fraction_0"] == 1.0 and row["gil_held"] == 0.0
        else:
            assert row["gil_held"] > 0, "the step held the GIL"
    text = capsys.readouterr().out
    assert "| PackLoader (threads) | 5 ms |" in text and "| PackLoader (threads) | 0.5 ms |" in text
    assert "| batch_loader (processes) | 5 ms |" in text and "f = 50%" in text


class FakeClock:
    """``time`` for bench_gil alone: ``perf_counter`` advances by ``tick`` seconds at each call."""

    def __init__(self, tick: float = 1.0) -> None:
        self.now, self.tick = 0.0, tick

    def perf_counter(self) -> float:
        self.now += self.tick
        return self.now


class FakeLibc:
    """Stands in for libc in a ``Step``: records each ``usleep`` call instead of sleeping."""

    def __init__(self, calls: list[tuple[str, int]], name: str) -> None:
        self.usleep = lambda us: calls.append((name, us))


def test_measure_counts_images_and_the_held_part_of_each_step(jpeg_pack: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``measure`` over the real loaders, with a clock that advances one second a call and a step that
    reports 0.25 s held: 3 clock calls per batch, so 4 batches fill a 12 s window (the pack's 16
    images make 4 batches of 4: the last one comes from the second epoch, after the warm-up batch)."""
    clock = FakeClock()
    monkeypatch.setattr(bench_gil, "time", clock)
    steps: list[int] = []

    def step() -> float:
        steps.append(len(steps))
        return 0.25

    for name in ("packloader", "batch_loader"):
        steps.clear()
        result = bench_gil.measure(name, str(jpeg_pack), 4, 24, 0, step, seconds=12, warmup=1)  # type: ignore[arg-type]
        assert len(steps) == result["batches"] == 4, name
        assert result["seconds"] == 12 and result["images_per_s"] == 16 / 12, name
        assert result["gil_held"] == 1.0 / 12 and result["held_ms"] == 250.0, name
        assert result["step_ms"] == 1000.0, name  # two clock calls around each step: one tick
    result = bench_gil.measure("packloader", str(jpeg_pack), 4, 24, 0, None, seconds=5, warmup=0)
    assert result["batches"] == 5 and result["images_per_s"] == 20 / 5  # one clock call a batch, across epochs
    assert result["gil_held"] == 0 and result["held_ms"] == 0


def test_step_runs_its_calibrated_slices_holding_the_gil(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step is calibrated (50 slices timed: one tick of the clock, so 1/200 s a slice) into the
    number of slices that fill its fraction of the step, then runs exactly that many slices through
    the GIL-holding libc, and waits out the rest of the step through the releasing one."""
    clock = FakeClock(tick=0.25)
    monkeypatch.setattr(bench_gil, "time", clock)
    for hold in ("gil", "gil-ops"):
        step = bench_gil.Step(1.0, 0.5, hold, slice_us=100)
        assert step.slices == 100, hold  # 0.5 s held out of 1 s, in slices of 1/200 s
        calls: list[tuple[str, int]] = []
        step._held, step._released = FakeLibc(calls, "held"), FakeLibc(calls, "released")
        assert step() == 0.25  # the held part: one tick of the clock
        held = 2 * step.slices if hold == "gil-ops" else step.slices
        if hold == "gil-ops":  # the GIL let go for an instant after each slice, as torch ops do
            assert calls[:held] == [("held", 100), ("released", 0)] * step.slices
        else:
            assert calls[:held] == [("held", 100)] * step.slices
        # the rest of the step: the clock reads 0.5 and 0.75 s (each below the 1 s step), then 1 s
        assert calls[held:] == [("released", 100)] * 2, hold
    idle = bench_gil.Step(1.0, 0.0)
    assert idle.slices == 0
    calls = []
    idle._held, idle._released = FakeLibc(calls, "held"), FakeLibc(calls, "released")
    idle()
    assert calls == [("released", 100)] * 2, "no held work at fraction 0"
    with pytest.raises(ValueError):
        bench_gil.Step(0.01, 1.5)


def test_pydll_usleep_keeps_the_gil_held() -> None:
    """What the step's held part rests on: a ``usleep`` through the libc of ``_libc(held=True)`` keeps
    the GIL, so a thread counting in Python makes no progress during it. The counting thread lets go
    of the GIL at each count and the switch interval is long, so this thread is never made to let go
    between its two reads of the count: only the call could let the other thread in."""
    import threading

    counter, stop, started = [0], threading.Event(), threading.Event()

    def count() -> None:
        started.set()
        while not stop.wait(0.0001):
            counter[0] += 1

    held = bench_gil._libc(held=True)
    before = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    thread = threading.Thread(target=count, daemon=True)
    try:
        thread.start()
        started.wait()
        first = counter[0]
        held.usleep(50_000)
        second = counter[0]
    finally:
        sys.setswitchinterval(before)
        stop.set()
    thread.join()
    assert second == first
