"""The tuner's picture (``packload.diagnose.tune_plot``), drawn from trials the test gives: one line per
prefetch_factor and pin_memory setting, each point a configuration's median trial with its repeats'
spread, the GPU step's rate, the pick, PackLoader's measured threads, and a title that says what was
tuned. The file is read back (SVG with its text kept as text) and the figure's lines are looked at.
That a PNG is written with integer ticks is in ``tests/diagnose/test_tune.py``."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from packload.core.errors import PackloadError
from packload.diagnose.tune_plot import PlotUnavailableError, plot_result, require_matplotlib
from packload.diagnose.tune_trials import Trial

matplotlib = pytest.importorskip("matplotlib")
import matplotlib.pyplot as plt  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"


def trial(workers: int, prefetch: int | None, pin: bool, rate: float, batches: int = 20) -> Trial:
    return Trial(workers, prefetch, pin, samples_per_s=rate, batches_per_s=rate / 16, gpu_wait=0.2, startup_s=0.5,
                 worker_rss_mb=0.0, worker_pss_mb=0.0, noise=0.01, cpu_cores=1.0, batches=batches, seconds=1.0,
                 phase="coarse")


@dataclass
class Tuned:
    """What the plot reads of a ``TuneResult``."""

    trials: list[Trial]
    winner: Trial
    step_samples_per_s: float = 400.0
    step: dict[str, Any] = field(default_factory=lambda: {"step_ms": 8.0, "model": None, "sync": True})
    dataset: str = "/data/p.lmdb"
    batch_size: int = 16
    verdict: str = "input-bound"
    fast_path: dict[str, Any] | None = None


def drawn(result: Tuned, path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[str]]:
    """Plot ``result`` to ``path``; the figure's axes (kept from being closed) and the texts of the file."""
    figures: list[Any] = []
    monkeypatch.setattr(plt, "close", figures.append)
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text as text, to be read back
        assert plot_result(result, path) == path
    [figure] = figures
    texts = ["".join(element.itertext()) for element in ET.parse(path).iter(f"{SVG}text")]
    axes = figure.axes[0]
    plt.close(figure)
    return axes, texts


def lines_by_label(axes: Any) -> dict[str, Any]:
    return {line.get_label(): line for line in axes.get_lines() if not line.get_label().startswith("_")}


def errorbars(axes: Any) -> dict[str, dict[str, list[float]]]:
    """Each error-bar series by its label: x, y, and how far its bars reach below and above y."""
    series = {}
    for container in axes.containers:
        data, _, (bars,) = container.lines
        ys = list(data.get_ydata())
        segments = bars.get_segments()
        series[container.get_label()] = {
            "x": list(data.get_xdata()), "y": ys,
            "below": [y - seg[0][1] for y, seg in zip(ys, segments, strict=True)],
            "above": [seg[1][1] - y for y, seg in zip(ys, segments, strict=True)],
            "linestyle": data.get_linestyle(), "marker": data.get_marker()}
    return series


@pytest.fixture
def searched() -> Tuned:
    """A search on a machine without CUDA: the ladder with prefetch 2, the pick measured three times
    (300, 340, 320: median 320), a deeper queue tried once, a trial cut off before any measurement,
    and PackLoader measured at 0 and 2 threads (1 thread: no measurement)."""
    pick = trial(2, 2, False, 320.0)
    trials = [trial(0, None, False, 100.0), trial(1, 2, False, 180.0), trial(2, 2, False, 300.0),
              trial(4, 2, False, 330.0), trial(3, 2, False, 0.0, batches=0), trial(2, 4, False, 335.0),
              trial(2, 2, False, 340.0), pick]
    fast = {"trials": [{"num_workers": 0, "batches": 5, "samples_per_s": 150.0},
                       {"num_workers": 1, "batches": 0, "samples_per_s": 0.0},
                       {"num_workers": 2, "batches": 8, "samples_per_s": 390.0}]}
    return Tuned(trials=trials, winner=pick, fast_path=fast)


def test_each_configuration_is_its_median_trial_with_its_repeats_spread(searched: Tuned, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    axes, _ = drawn(searched, tmp_path / "tune.svg", monkeypatch)
    series = errorbars(axes)
    assert set(series) == {"prefetch_factor=2", "prefetch_factor=4"}
    main = series["prefetch_factor=2"]  # the searched series, from the main process's point on
    assert main["x"] == [0, 1, 2, 4] and main["y"] == [100.0, 180.0, 320.0, 330.0]  # 3 workers: no measurement
    assert main["below"] == pytest.approx([0, 0, 20.0, 0]) and main["above"] == pytest.approx([0, 0, 20.0, 0])
    assert main["linestyle"] == "-" and main["marker"] == "o"
    deeper = series["prefetch_factor=4"]  # a single check beside it: dotted, square markers
    assert deeper["x"] == [2] and deeper["y"] == [335.0] and deeper["linestyle"] == ":" and deeper["marker"] == "s"


def test_the_step_the_pick_and_packloader_are_drawn_with_the_figures_given(searched: Tuned, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    axes, _ = drawn(searched, tmp_path / "tune.svg", monkeypatch)
    lines = lines_by_label(axes)
    assert set(lines) == {"GPU step alone (400/s)", "pick", "PackLoader (threads)"}
    assert list(lines["GPU step alone (400/s)"].get_ydata()) == [400.0, 400.0]  # a horizontal line
    assert list(lines["pick"].get_xdata()) == [2] and list(lines["pick"].get_ydata()) == [320.0]
    packloader = lines["PackLoader (threads)"]  # the thread count with no measurement is left out
    assert list(packloader.get_xdata()) == [0, 2] and list(packloader.get_ydata()) == [150.0, 390.0]
    assert axes.get_xlabel() == "num_workers (PackLoader: threads)"
    assert axes.get_ylim()[0] == 0


def test_the_file_says_what_was_tuned_and_names_every_line(searched: Tuned, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _, texts = drawn(searched, tmp_path / "tune.svg", monkeypatch)
    assert "packload tune: /data/p.lmdb, batch 16, 8 ms step (sync loop): input-bound" in texts
    for label in ("prefetch_factor=2", "prefetch_factor=4", "PackLoader (threads)", "GPU step alone (400/s)", "pick",
                  "num_workers (PackLoader: threads)", "samples/s (loader + GPU step)"):
        assert label in texts, label


def test_with_pinned_memory_each_line_starts_from_its_own_main_process_point(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA the ladder is pinned and the unpinned setting is tried at the pick: the unpinned line
    holds its own trial only, not the pinned main-process point, and each line keeps its spread."""
    pick = trial(2, 2, True, 300.0)
    trials = [trial(0, None, True, 100.0), trial(0, None, True, 120.0), trial(1, 2, True, 200.0), pick,
              trial(2, 2, False, 290.0)]
    axes, _ = drawn(Tuned(trials=trials, winner=pick), tmp_path / "tune.svg", monkeypatch)
    series = errorbars(axes)
    pinned, unpinned = series["prefetch_factor=2, pinned"], series["prefetch_factor=2"]
    assert pinned["x"] == [0, 1, 2] and pinned["y"] == [100.0, 200.0, 300.0]
    assert pinned["above"] == pytest.approx([20.0, 0, 0])  # 100 and 120: the lower is the median
    assert unpinned["x"] == [2] and unpinned["y"] == [290.0]


def test_a_search_of_the_main_process_alone_is_one_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``max_workers=0``: no prefetch series, the main process's point as a line of its own; a model's
    step is named, in the loop that never waits; no PackLoader, so the axis names workers alone."""
    pick = trial(0, None, False, 110.0)
    result = Tuned(trials=[trial(0, None, False, 90.0), pick, trial(0, None, False, 130.0)], winner=pick,
                   step={"step_ms": None, "model": "small-cnn", "sync": False}, verdict="compute-bound",
                   dataset="/data/images", batch_size=32, step_samples_per_s=1000.0)
    axes, texts = drawn(result, tmp_path / "tune.svg", monkeypatch)
    assert axes.containers == []  # no error-bar series
    lines = lines_by_label(axes)
    assert list(lines["num_workers=0"].get_xdata()) == [0] and list(lines["num_workers=0"].get_ydata()) == [110.0]
    assert "PackLoader (threads)" not in lines and axes.get_xlabel() == "num_workers"
    assert "packload tune: /data/images, batch 32, small-cnn (async loop): compute-bound" in texts
    assert "GPU step alone (1,000/s)" in texts


def test_the_format_follows_the_suffix(searched: Tuned, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plt, "close", lambda figure: None)
    assert plot_result(searched, tmp_path / "t.pdf").read_bytes().startswith(b"%PDF")
    assert plot_result(searched, str(tmp_path / "t.png")).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # a str path too


def test_without_matplotlib_the_refusal_is_a_packload_error(monkeypatch: pytest.MonkeyPatch) -> None:
    require_matplotlib()  # installed here: nothing to refuse
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(PlotUnavailableError) as info:
        require_matplotlib()
    assert isinstance(info.value, PackloadError) and isinstance(info.value, RuntimeError)
    assert "pip install matplotlib" in str(info.value) and "leave out --plot" in str(info.value)
