"""The tuner (packload/diagnose/tune.py) on workloads whose best settings are known by construction.

Each sample of ``Sleepy`` waits a fixed number of milliseconds, which uses no CPU, so throughput
grows with the number of workers even on a 2-core machine, and the emulated GPU step waits too
(``device="cpu"``: emulated even where CUDA is present, so the expected results hold on any
machine; the tests marked for CUDA check the real step). No wall-clock figure is asserted: the
searches whose pick is checked run on a virtual clock, each trial's figures given by ``Sleepy``'s
cost model (``_Modelled``; what ``TrialRunner`` really measures of the main process is checked
against that model on the same clock), and the searches that run for real are checked for what
holds whatever the machine's speed: verdicts agreeing with the figures shown, the budget, the report.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from packload import pack  # noqa: E402
from packload.core.errors import UsageError  # noqa: E402
from packload.diagnose import loader_memory, tune_runner, tune_search, tune_trials  # noqa: E402
from packload.diagnose import tune as tune_module  # noqa: E402
from packload.diagnose.gpu_step import DummyStep  # noqa: E402
from packload.diagnose.loader_config import LoaderConfigError, load_loader_config  # noqa: E402
from packload.diagnose.training_loop import loop_words  # noqa: E402
from packload.diagnose.tune import (  # noqa: E402
    TuneError,
    format_report,
    tune,
)
from packload.diagnose.tune_inputs import tune_path  # noqa: E402
from packload.diagnose.tune_runner import MIN_WINDOWS  # noqa: E402
from packload.diagnose.tune_trials import aggregate, cost  # noqa: E402
from tests.image_factory import make_image_folder  # noqa: E402

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")


class Sleepy(Dataset):
    """Each sample costs ``ms`` milliseconds of waiting and is a small tensor with a label."""

    def __init__(self, ms: float, size: int = 4096) -> None:
        self.ms, self.size = ms, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.ms / 1000)
        return torch.full((8,), float(index)), index % 10


class Stream(IterableDataset):
    def __iter__(self):
        yield from range(3)


class _VirtualClock:
    """The search's clock, moved on only by the trials (and, where it is the step's clock too, by the
    emulated step's waits)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


STARTUP_S = 0.3  # a modelled trial's start-up: its workers started and its first batch loaded


def modelled_rate(ms: float, batch_size: int, step_ms: float, sync: bool, workers: int) -> float:
    """Samples/s of ``Sleepy(ms)`` in batches of ``batch_size`` fed to a step of ``step_ms``: with no
    workers a batch is loaded in the main process, before a waiting loop's step or, in a loop that
    never waits, while the queued step runs; with workers each loads its own batches one after
    another while the step runs, so they deliver ``workers`` batches per batch's loading time."""
    load, step = batch_size * ms / 1000, step_ms / 1000
    if workers == 0:
        return batch_size / (load + step if sync else max(load, step))
    return batch_size / max(step, load / workers)


class _Modelled(tune_runner.TrialRunner):
    """``TrialRunner``'s stand-in in ``tune``: each trial's figures from ``modelled_rate`` for the
    tuned ``Sleepy``, its time taken from the virtual clock as TrialRunner takes it: start-up, then
    windows of one batch per worker (at least two) for the steady time asked for and at least
    ``MIN_WINDOWS`` windows, cut at the deadline (no whole window: no measurement). The workers wait
    rather than compute (``cpu_cores`` small); each takes 20 MB."""

    clock: _VirtualClock

    def run(self, workers, prefetch, pin, steady_s, deadline, phase):
        rate = modelled_rate(self.dataset.ms, self.batch_size, self.step.step_ms, self.step.sync, workers)
        window, batch_s = max(2, workers), self.batch_size / rate
        started = self.clock.now
        ends = started + STARTUP_S + max(steady_s, MIN_WINDOWS * window * batch_s)
        self.clock.now = min(deadline, ends)
        seconds = max(0.0, self.clock.now - started - STARTUP_S)
        batches = int(seconds / batch_s + 1e-9) // window * window
        note = "cut short by the time budget" if ends > deadline else ""
        if not batches:
            rate = 0.0
        return tune_trials.Trial(workers, prefetch if workers else None, pin, samples_per_s=rate,
                                 batches_per_s=rate / self.batch_size,
                                 gpu_wait=max(0.0, 1 - rate / self.step_rate) if rate else 1.0, startup_s=STARTUP_S,
                                 worker_rss_mb=60.0 * workers, worker_pss_mb=20.0 * workers, noise=0.01,
                                 cpu_cores=0.1 + 0.01 * workers, batches=batches if rate else 0, seconds=seconds,
                                 phase=phase, note=note)


@contextmanager
def modelled() -> Iterator[_VirtualClock]:
    """``tune`` searching with ``_Modelled`` trials on a virtual clock (its own and the search's)."""
    clock = _VirtualClock()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tune_module, "time", clock)
        patch.setattr(tune_search, "time", clock)
        patch.setattr(tune_module, "TrialRunner", _Modelled)
        patch.setattr(_Modelled, "clock", clock, raising=False)
        yield clock


@pytest.fixture(scope="module")
def input_bound():
    """4 ms per sample, batches of 16: one worker gives 250 samples/s, four 1000; the 8 ms step
    could take 2000. So the GPU waits whatever the settings, and 4 workers (the bound) are best."""
    with modelled():
        return tune(Sleepy(4), 16, step_ms=8, budget_s=8, max_workers=4, progress=False, device="cpu")


@pytest.fixture(scope="module")
def compute_bound():
    """0.2 ms per sample (3 ms a batch) against a 50 ms step, in a loop that never waits for the step:
    even the main process alone keeps up."""
    with modelled():
        return tune(Sleepy(0.2), 16, step_ms=50, budget_s=6, max_workers=4, progress=False, device="cpu",
                    sync=False)


def test_input_bound_verdict_and_the_cheapest_pick(input_bound):
    r = input_bound
    assert r.verdict == "input-bound"
    assert "input-bound" in r.message and "GPU waits" in r.message
    assert r.winner.num_workers == 4  # 3 workers give 75% of 4: outside any few-percent tolerance
    assert r.winner.gpu_wait == pytest.approx(0.5)  # 1000 of the step's 2000 samples/s
    merged = aggregate(r.trials)
    assert merged[(1, 2, False)].samples_per_s == pytest.approx(250)  # what each worker delivers
    assert merged[(3, 2, False)].samples_per_s == pytest.approx(750), "the bisection measured 3 workers"
    band = (1 - r.tolerance) * r.fastest.samples_per_s
    assert r.winner.samples_per_s >= band
    cheaper = [t for t in merged.values() if cost(t.key) < cost(r.winner.key)]
    assert all(t.samples_per_s < band for t in cheaper)
    assert sum(t.key == r.winner.key for t in r.trials) >= 2, "the pick is measured again"
    assert r.settings == {"num_workers": r.winner.num_workers, "prefetch_factor": r.winner.prefetch_factor,
                          "pin_memory": False, "persistent_workers": True}
    assert r.epoch_s == pytest.approx(4096 / r.winner.samples_per_s)
    assert r.winner in r.trials and r.fastest in r.trials, "the pick and the fastest are rows of the report"


def test_compute_bound_verdict_and_a_cheap_pick(compute_bound):
    r = compute_bound
    assert r.verdict == "compute-bound"
    assert r.winner.num_workers == 0 and [t.num_workers for t in r.trials][0] == 0
    assert r.winner.gpu_wait == 0.0
    assert r.stopped == "saturated"
    assert "compute-bound" in r.message
    assert r.step_samples_per_s == pytest.approx(16 / 0.050)


def test_the_search_respects_its_budget(monkeypatch):
    """On a virtual clock, each trial taking its start-up plus the steady time it is given (cut at the
    deadline, as TrialRunner cuts it): no trial starts once the budget is spent, none runs past it,
    and the search says the budget ended it."""
    clock = _VirtualClock()
    monkeypatch.setattr(tune_search, "time", clock)
    started: list[float] = []

    class _TimedRunner(_RatesRunner):
        def run(self, workers, prefetch, pin, steady_s, deadline, phase):
            started.append(clock.now)
            clock.now = min(deadline, clock.now + 0.4 + steady_s)  # 0.4 s of start-up, then the steady part
            trial = super().run(workers, prefetch, pin, steady_s, deadline, phase)
            trial.startup_s = 0.4
            return trial

    runner = _TimedRunner({w: 100.0 * (w + 1) for w in range(9)}, step_rate=10_000.0)
    start = clock.now
    search = tune_search.Search(runner, 8, 0.04, 3.0, start, False, False)
    search.run()
    assert search.stopped == "budget" and len(started) >= 2
    assert all(t < start + 3.0 for t in started), "no trial starts after the deadline"
    assert clock.now <= start + 3.0, "no trial runs past it"
    assert all(t.num_workers <= 8 for t in search.trials)


def test_a_real_search_ends_on_its_budget():
    r = tune(Sleepy(3), 32, step_ms=5, budget_s=3, max_workers=8, progress=False)
    assert r.stopped == "budget"
    assert r.trials and all(t.num_workers <= 8 for t in r.trials)


def test_workers_that_would_not_fit_in_memory_are_not_started(monkeypatch):
    monkeypatch.setattr(loader_memory, "GUESS_WORKER_BYTES", 1 << 50)  # each worker "needs" a petabyte
    r = tune(Sleepy(1), 8, step_ms=2, budget_s=4, max_workers=4, progress=False)
    assert {t.num_workers for t in r.trials} == {0}
    assert r.stopped == "memory" and r.max_workers == 0
    assert "safety margin" in r.skipped[0]
    assert "would not fit in memory" in r.message


def test_a_trial_stops_when_free_memory_runs_low(monkeypatch):
    monkeypatch.setattr(loader_memory.MemoryGuard, "low", lambda self: True)
    r = tune(Sleepy(1), 8, step_ms=2, budget_s=4, max_workers=4, progress=False)
    assert r.trials[0].note.startswith("stopped: free memory")
    assert all(t.num_workers == 0 for t in r.trials) and r.stopped == "memory"


@NO_CUDA
def test_pin_memory_is_reported_not_measured_without_cuda(input_bound):
    r = input_bound
    assert r.not_measured == {"pin_memory": "not measured (no CUDA)"}
    assert not any(t.pin_memory for t in r.trials)
    assert r.step["calibration"]["emulated"] is True
    assert "no CUDA" in r.message
    assert any("not measured (no CUDA)" in line for line in format_report(r))


def test_report_and_json(input_bound):
    lines = format_report(input_bound)
    assert len(lines) >= len(input_bound.trials) + 5
    assert any(line.strip().startswith("verdict: ") for line in lines)
    data = json.loads(input_bound.to_json())
    assert data["verdict"] == "input-bound" and len(data["trials"]) == len(input_bound.trials)
    assert data["loader"]["batch_size"] == 16 and "machine" in data


def test_save_and_load_round_trip(input_bound, tmp_path):
    path = input_bound.save(tmp_path / "loader.json")
    assert load_loader_config(path) == input_bound.loader_kwargs()
    saved = json.loads(path.read_text())
    assert {"cpu", "usable_cores", "torch", "cuda_device", "date"} <= set(saved["machine"])
    assert saved["not_measured"] == input_bound.not_measured


def _write(tmp_path: Path, name: str, content: object) -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


@pytest.mark.parametrize("content, message", [
    ("{not json", "not a JSON file"),
    ({"num_workers": 2}, "not a packload loader config"),
    ({"packload_loader_config": 9, "loader": {}}, "version 9"),
    ({"packload_loader_config": 1, "loader": []}, "'loader' must be an object"),
    ({"packload_loader_config": 1, "loader": {"batch_size": 8}}, "lacks num_workers"),
    ({"packload_loader_config": 1, "loader": {"batch_size": 8, "num_workers": 2, "prefetch_factor": 2,
                                              "pin_memory": False, "persistent_workers": True, "shuffle": 1}},
     "unknown shuffle"),
    ({"packload_loader_config": 1, "loader": {"batch_size": True, "num_workers": -1, "prefetch_factor": 2,
                                              "pin_memory": "no", "persistent_workers": True}},
     "batch_size True must be an integer"),
    ({"packload_loader_config": 1, "loader": {"batch_size": 8, "num_workers": 0, "prefetch_factor": 2,
                                              "pin_memory": False, "persistent_workers": False}},
     "prefetch_factor must be null"),
    ({"packload_loader_config": 1, "loader": {"batch_size": 8, "num_workers": 2, "prefetch_factor": 0,
                                              "pin_memory": False, "persistent_workers": True}},
     "prefetch_factor 0 must be"),
])
def test_bad_config_files_give_clear_errors(tmp_path, content, message):
    path = _write(tmp_path, "bad.json", content)
    with pytest.raises(LoaderConfigError, match=message) as info:
        load_loader_config(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_missing_config_file(tmp_path):
    with pytest.raises(LoaderConfigError, match="cannot read"):
        load_loader_config(tmp_path / "nothing.json")


def test_config_from_another_machine_warns(input_bound, tmp_path):
    path = input_bound.save(tmp_path / "loader.json")
    document = json.loads(path.read_text())
    document["machine"]["usable_cores"] = 999
    path.write_text(json.dumps(document))
    with pytest.warns(UserWarning, match="another machine"):
        assert load_loader_config(path)["num_workers"] == input_bound.settings["num_workers"]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 4 workers on 2 cores, asked for
def test_make_loader_uses_the_winning_settings(input_bound):
    loader = input_bound.make_loader(Sleepy(0, size=64))
    assert loader.num_workers == input_bound.settings["num_workers"]
    assert loader.prefetch_factor == input_bound.settings["prefetch_factor"]
    assert loader.persistent_workers is True and loader.batch_size == 16
    batches = list(loader)
    assert len(batches) == 4 and batches[0][0].shape == (16, 8)
    assert sorted(torch.cat([b[0][:, 0] for b in batches]).long().tolist()) == list(range(64))


class _Clock:
    """A virtual clock for the emulated step: ``sleep`` moves it on, nothing else does."""

    def __init__(self) -> None:
        self.now, self.slept = 100.0, 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds


def test_dummy_step_emulation_queues_steps_and_waits_without_cpu(monkeypatch):
    """Asynchronous: the first steps are queued (no wait), then each call waits for the oldest of
    ``max_in_flight``; the waiting is sleeping (no CPU), and the timeline is exact."""
    from packload.diagnose import gpu_step

    clock = _Clock()
    monkeypatch.setattr(gpu_step, "time", clock)
    step = DummyStep(step_ms=40, device="cpu")
    assert not step.on_gpu and step.calibration["emulated"] is True and step.sync is False
    step((torch.zeros(2, 3), torch.zeros(2)))
    step(None)
    assert clock.slept == 0, "two steps are queued, not waited for"
    step(None)
    assert clock.now == pytest.approx(100.04), "the third waits for the first"
    step.synchronize()
    assert clock.now == pytest.approx(100.12)  # three steps of 40 ms back to back
    assert step.step_rate(10) == pytest.approx(250.0)


def test_a_synchronous_step_waits_for_itself(monkeypatch):
    """``sync=True``: every call returns only once its own step is done, so time spent loading
    between calls adds to the step instead of overlapping it."""
    from packload.diagnose import gpu_step

    clock = _Clock()
    monkeypatch.setattr(gpu_step, "time", clock)
    step = DummyStep(step_ms=40, device="cpu", sync=True)
    step(None)
    assert clock.now == pytest.approx(100.04)
    clock.now += 0.03  # loading the next batch in the main process
    step(None)
    assert clock.now == pytest.approx(100.11)  # 40 + 30 + 40 ms: nothing overlapped


class _CostlyOnTheClock(Dataset):
    """Each sample costs ``ms`` of the virtual clock, loaded in the main process (``num_workers=0``)."""

    def __init__(self, ms: float, clock: _VirtualClock) -> None:
        self.ms, self.clock = ms, clock

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        self.clock.now += self.ms / 1000
        return torch.zeros(8), 0


@pytest.mark.parametrize("sync", [True, False])
def test_the_main_process_figures_the_model_gives_are_what_a_trial_measures(monkeypatch, sync):
    """``TrialRunner`` on the virtual clock, the samples and the emulated step moving it: in a loop that
    waits for each step, 19.2 ms of loading adds to each 20 ms step (408 samples/s, as modelled); in
    one that never waits the loading hides behind the queued step (all but the first batch's)."""
    from packload.diagnose import gpu_step, tune_runner

    clock = _VirtualClock()
    monkeypatch.setattr(tune_runner, "time", clock)
    monkeypatch.setattr(gpu_step, "time", clock)
    step = DummyStep(step_ms=20, device="cpu", sync=sync)
    runner = tune_runner.TrialRunner(_CostlyOnTheClock(1.2, clock), 16, None, None, step, step.step_rate(16),
                                     loader_memory.MemoryGuard(margin_bytes=0), lambda status: None)
    trial = runner.run(0, None, False, steady_s=1.0, deadline=clock.now + 30, phase="coarse")
    model = modelled_rate(1.2, 16, 20, sync, 0)
    if sync:
        assert trial.samples_per_s == pytest.approx(model) == pytest.approx(16 / 0.0392)
    else:
        assert model == 800.0  # the step's own rate: the loading is hidden
        assert trial.samples_per_s == pytest.approx(trial.batches * 16 / (0.0192 + trial.batches * 0.020))
        assert trial.samples_per_s == pytest.approx(model, rel=0.03)


def test_a_loop_that_synchronises_gets_workers_where_loading_would_stall_it():
    """Loading a batch in the main process costs about as much as the step: a loop that never waits
    hides it behind the queued step (0 workers do), one that waits every step does not, and there
    the pick has workers and is far faster than loading in the main process."""
    data = Sleepy(1.2, size=4096)  # 19.2 ms of waiting per batch of 16
    with modelled():
        waits = tune(data, 16, step_ms=20, budget_s=10, max_workers=2, progress=False, device="cpu", sync=True)
        never = tune(data, 16, step_ms=20, budget_s=10, max_workers=2, progress=False, device="cpu", sync=False)
    assert waits.winner.num_workers >= 1, format_report(waits)
    merged = aggregate(waits.trials)
    assert merged[(0, None, False)].samples_per_s < 0.8 * waits.winner.samples_per_s
    assert loop_words(True) in waits.message and waits.step["sync"] is True
    assert never.winner.num_workers == 0 and never.stopped == "saturated", format_report(never)
    assert loop_words(False) in never.message and never.step["sync"] is False
    assert aggregate(never.trials)[(0, None, False)].samples_per_s > merged[(0, None, False)].samples_per_s


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tune_on_cuda_steps_the_gpu_and_tries_pin_memory():
    r = tune(Sleepy(4), 16, step_ms=8, budget_s=12, max_workers=4, progress=False)
    calibration = r.step["calibration"]
    assert calibration["emulated"] is False and calibration["requested_ms"] == 8.0
    assert calibration["ok"] is (abs(calibration["error_pct"]) <= 10)  # said, not timed here
    assert "pin_memory" not in r.not_measured
    assert {t.pin_memory for t in r.trials} == {False, True}, "both pin_memory settings are measured"
    assert r.winner in r.trials and r.settings["pin_memory"] is r.winner.pin_memory


@NO_CUDA
def test_small_cnn_needs_cuda():
    with pytest.raises(ValueError, match="needs a CUDA GPU.*step_ms"):
        DummyStep(model="small-cnn")
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        tune(Sleepy(0), 4, model="small-cnn", budget_s=2, progress=False)


def test_a_budget_too_small_for_one_trial_says_so():
    with pytest.raises(TuneError, match="give a larger budget_s"):
        tune(Sleepy(1), 8, step_ms=5, budget_s=0.001, progress=False)


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="step_ms .* or model"):
        DummyStep()
    with pytest.raises(ValueError, match="not both"):
        DummyStep(step_ms=10, model="small-cnn")
    with pytest.raises(ValueError, match="unknown model"):
        DummyStep(model="resnet")
    with pytest.raises(ValueError, match="map-style"):
        tune(Stream(), 4, step_ms=10, progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        tune(Sleepy(0), 0, step_ms=10, progress=False)


def test_plot_writes_a_png_with_integer_ticks_spreads_and_a_title(input_bound, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    figures = []
    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda figure: figures.append(figure))  # keep it to look at
    path = input_bound.plot(tmp_path / "tune.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    [figure] = figures
    axes = figure.axes[0]
    assert all(float(tick).is_integer() for tick in axes.get_xticks())
    title = axes.get_title()
    assert "Sleepy" in title and "batch 16" in title and "8 ms step" in title and "sync loop" in title
    repeated = [k for k in {t.key for t in input_bound.trials} if sum(t.key == k for t in input_bound.trials) > 1]
    assert repeated and any(container.has_yerr for container in axes.containers)
    real_close(figure)


def test_plot_without_matplotlib_says_so(input_bound, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(RuntimeError, match="pip install matplotlib"):
        input_bound.plot(tmp_path / "tune.png")


def test_the_command_refuses_plot_without_matplotlib_before_searching(tmp_path, monkeypatch, capsys):
    from packload import cli
    from packload.diagnose import tune_inputs

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setattr(tune_inputs, "tune_path", lambda *a, **k: pytest.fail("the search ran"))
    assert cli.main(["tune", str(tmp_path), "--step-ms", "5", "--plot", str(tmp_path / "t.png")]) != 0
    assert "--plot needs matplotlib" in capsys.readouterr().err


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    make_image_folder(root, classes=("a", "b"), per_class=16, seed=3)
    return root


@pytest.mark.parametrize("kind", ["pack", "folder"])
def test_tune_path_reads_a_pack_or_a_folder(image_folder, tmp_path, kind):
    path = image_folder
    if kind == "pack":
        path = tmp_path / "p.lmdb"
        pack(image_folder, path, workers=1, progress=False)
    r = tune_path(path, batch_size=8, step_ms=5, budget_s=3, max_workers=1, progress=False, image_size=32)
    assert r.samples_per_epoch == 32 and r.trials
    batch = next(iter(r.make_loader(_dataset_of(path))))
    assert batch[0].shape == (8, 3, 32, 32) and batch[0].dtype == torch.uint8
    if kind == "folder":
        assert r.fast_path is None  # PackLoader reads packs only
        return
    fast = r.fast_path  # PackLoader's threads, tuned beside the DataLoader
    assert fast["pick"] is not None and fast["threads"] in {t["num_workers"] for t in fast["trials"]}
    assert fast["code"] == f"loader = packload.PackLoader(ds, 8, crop=packload.CenterCrop(32), threads={fast['threads']})"
    assert any(line.startswith("  fast path: PackLoader with") for line in format_report(r))
    import packload

    ds = packload.PackedImageFolder(path)
    namespace = {"packload": packload, "ds": ds}
    exec(fast["code"], namespace)  # the code the report gives runs as it is
    images, labels = next(iter(namespace["loader"]))
    assert images.shape == (8, 3, 32, 32) and labels.shape == (8,)


def _dataset_of(path: Path):
    from packload.diagnose.tune_inputs import open_dataset

    return open_dataset(path, image_size=32)


class _RatesRunner:
    """A stand-in for TrialRunner: each worker count has a known rate; records what was measured."""

    def __init__(self, rates: dict[int, float], step_rate: float = 10_000.0) -> None:
        self.rates, self.step_rate, self.batch_size = rates, step_rate, 16
        self.guard = loader_memory.MemoryGuard(margin_bytes=0)
        self.measured: list[int] = []

    def finished(self, number, trial):  # TrialRunner announces each trial; nothing to show here
        pass

    def run(self, workers, prefetch, pin, steady_s, deadline, phase):
        self.measured.append(workers)
        rate = self.rates[workers]
        return tune_trials.Trial(workers, prefetch, pin, samples_per_s=rate, batches_per_s=rate / 16,
                                 gpu_wait=0.5, startup_s=0.0, worker_rss_mb=0.0, worker_pss_mb=0.0, noise=0.0,
                                 cpu_cores=1.0, batches=10, seconds=1.0, phase=phase)


def test_many_cores_skip_one_worker_in_the_ladder_but_the_bisection_still_finds_it():
    assert tune_search.Search(_RatesRunner({}), 4, 0.04, 60, time.perf_counter(), False, False).ladder == [0, 1, 2, 4]
    # 1 worker is as good as any: 0 falls short, 2 and more add nothing
    runner = _RatesRunner({0: 100.0, 1: 400.0, 2: 400.0, 4: 400.0, 8: 400.0, 16: 400.0})
    search = tune_search.Search(runner, 16, 0.04, 60, time.perf_counter(), False, False)
    assert search.ladder == [0, 2, 4, 8, 16]
    search.coarse()
    assert 1 not in runner.measured and runner.measured[:2] == [0, 2]
    search.fine()
    assert runner.measured[-1] == 1, "the bisection between 0 and 2 measures 1"
    pick, _ = tune_trials.select(search.trials, 0.04)
    assert pick.num_workers == 1


def test_report_shows_the_workers_proportional_memory_not_their_rss():
    from packload.diagnose.tune_report import _worker_memory

    runner = _RatesRunner({2: 100.0})
    trial = runner.run(2, 2, False, 1.0, 0.0, "coarse")
    trial.worker_rss_mb, trial.worker_pss_mb = 2400.0, 310.0  # forked workers map the parent's libraries
    assert _worker_memory(trial) == "310 MB"
    trial.worker_pss_mb = 0.0
    assert _worker_memory(trial) == "2400 MB RSS"
    trial.worker_rss_mb = 0.0
    assert _worker_memory(trial) == "-"


class _WaitingRunner(_RatesRunner):
    """Rates per worker count, with the CPU each trial keeps busy given per worker count too."""

    def __init__(self, rates: dict[int, float], cpu: dict[int, float], step_rate: float = 100_000.0) -> None:
        super().__init__(rates, step_rate)
        self.cpu = cpu

    def run(self, workers, prefetch, pin, steady_s, deadline, phase):
        trial = super().run(workers, prefetch, pin, steady_s, deadline, phase)
        trial.cpu_cores = self.cpu[workers]
        return trial


def _search(runner, cores=2, climb_to=64):
    search = tune_search.Search(runner, cores, 0.04, 600, time.perf_counter(), False, False, climb_to=climb_to,
                                cores=cores)
    return search


def test_the_ladder_climbs_past_the_cores_while_the_workers_wait():
    """Workers that wait (the cores mostly idle) are added past the 2 usable cores until the rate stops
    rising; the climb never starts when the workers keep the cores busy."""
    ladder = [0, 1, 2, 4, 8, 16, 32, 64]
    waiting = _WaitingRunner({w: 100.0 * max(w, 0.5) if w <= 16 else 1600.0 for w in ladder},
                             {w: 0.1 + 0.01 * w for w in ladder})
    search = _search(waiting)
    assert search.coarse() == "plateau"
    assert max(waiting.measured) > 2 and 16 in waiting.measured
    assert tune_trials.select(search.trials, 0.04)[0].num_workers == 16
    busy = _WaitingRunner({w: 100.0 * max(w, 0.5) for w in ladder}, {w: min(2.0, 0.9 * max(w, 1)) for w in ladder})
    search = _search(busy)
    assert search.coarse() == "cores" and max(busy.measured) == 2
    rising = _WaitingRunner({w: 100.0 * max(w, 0.5) for w in ladder}, {w: 0.1 for w in ladder})
    search = _search(rising)
    assert search.coarse() == "the cap of 64 workers" and max(rising.measured) == 64


def test_an_explicit_max_workers_is_never_passed():
    runner = _WaitingRunner({w: 100.0 * max(w, 0.5) for w in (0, 1, 2, 4)}, {w: 0.1 for w in (0, 1, 2, 4)})
    search = tune_search.Search(runner, 4, 0.04, 600, time.perf_counter(), False, False)
    assert search.coarse() == "worker bound" and max(runner.measured) == 4


def test_the_open_file_limit_bounds_the_climb(monkeypatch):
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda which: (64 + 10 * tune_search.FDS_PER_WORKER, 1 << 20))
    assert tune_search.descriptor_workers() == 10
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert tune_search.descriptor_workers() == tune_search.WAITING_CAP


def test_tune_adds_workers_past_the_cores_when_samples_wait_on_storage():
    """A search of 25 s on the virtual clock: every sample waits 4 ms without using the CPU (as on a
    network disk) and the step could take far more. The pick has more workers than the machine has
    usable cores."""
    from packload.core.cpus import usable_cores

    cores = usable_cores()
    with modelled():
        result = tune(Sleepy(4, size=8192), 16, step_ms=1, budget_s=25, progress=False, device="cpu")
    assert max(t.num_workers for t in result.trials) > cores
    assert result.winner.num_workers > cores, format_report(result)


def test_the_users_own_transform_is_timed_and_named(image_folder, tmp_path, monkeypatch, capsys):
    """``--transform module:callable`` times the user's transform instead of the built-in crop, and the
    report says which; a name that cannot be imported is one clear error."""
    from packload import cli

    (tmp_path / "my_pipeline.py").write_text(
        "import numpy as np\n"
        "CALLS = []\n"
        "def small(image):\n"
        "    CALLS.append(1)\n"
        "    return np.asarray(image.convert('RGB').resize((24, 24)))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code = cli.main(["tune", str(image_folder), "--batch-size", "4", "--step-ms", "5", "--budget", "3",
                     "--max-workers", "0", "--transform", "my_pipeline:small", "--quiet"])
    out = capsys.readouterr().out
    assert code == 0 and "transform timed: my_pipeline.small" in out
    import my_pipeline

    assert my_pipeline.CALLS, "the transform ran"
    for spec, message in (("my_pipeline", "package.module:callable"), ("no_such_module:f", "cannot import"),
                          ("my_pipeline:missing", "has no missing"), ("my_pipeline:CALLS", "not callable")):
        assert cli.main(["tune", str(image_folder), "--step-ms", "5", "--transform", spec]) != 0
        assert message in capsys.readouterr().err


def test_a_folder_with_broken_files_tunes_and_names_them(tmp_path):
    """A raw folder with broken files is tuned on its intact images; the broken ones are left out as
    ``pack`` would skip them, and named in the result and the report."""
    root = tmp_path / "images"
    make_image_folder(root, classes=("a", "b"), per_class=6, seed=4)
    (root / "a" / "cut.jpg").write_bytes(b"\xff\xd8\xff\xe0" + b"\0" * 40)  # a JPEG cut short
    (root / "b" / "text.png").write_bytes(b"not an image")
    r = tune_path(root, batch_size=4, step_ms=5, budget_s=3, max_workers=1, progress=False, image_size=32)
    assert sorted(b["path"] for b in r.broken) == ["a/cut.jpg", "b/text.png"]
    assert r.samples_per_epoch == 12 and r.trials
    assert any("left out 2 broken files" in line and "a/cut.jpg" in line for line in format_report(r))
    for name in ("cut.jpg", "text.png"):
        (root / ("a" if name == "cut.jpg" else "b") / name).unlink()
    (root / "a" / "only.jpg").write_bytes(b"x")
    for image in list(root.rglob("*.png")) + list(root.rglob("*.jpg")):
        if image.name != "only.jpg":
            image.unlink()
    with pytest.raises(UsageError, match="every image is broken"):
        tune_path(root, batch_size=4, step_ms=5, budget_s=3, progress=False)
