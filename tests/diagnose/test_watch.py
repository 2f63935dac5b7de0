"""``packload.watch``: where a training loop's time goes, on loops whose share of waiting is known by
construction (a virtual clock: the loader and the step each move it on by a set amount)."""

from __future__ import annotations

import pytest
import torch

import packload
from packload.diagnose import watch as watch_module


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class SlowLoader:
    """Batches of ``size`` samples; fetching each one takes ``fetch_s`` on the clock."""

    def __init__(self, clock: Clock, batches: int, fetch_s: float, size: int = 8) -> None:
        self.clock, self.batches, self.fetch_s, self.size = clock, batches, fetch_s, size

    def __len__(self) -> int:
        return self.batches

    def __iter__(self):
        for k in range(self.batches):
            self.clock.now += self.fetch_s
            yield torch.zeros(self.size, 3), torch.full((self.size,), k)


@pytest.fixture()
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(watch_module, "time", clock)
    return clock


def run(clock: Clock, fetch_s: float, step_s: float, batches: int = 10, **options) -> tuple[watch_module.Watch, list]:
    lines: list[str] = []
    watched = packload.watch(SlowLoader(clock, batches, fetch_s), report=lines.append, cuda=False, **options)
    for images, _ in watched:
        assert images.shape == (8, 3)
        clock.now += step_s  # the training step
    return watched, lines


def test_an_input_bound_loop_is_called_so_with_the_command_to_run(clock: Clock) -> None:
    watched, lines = run(clock, fetch_s=0.030, step_s=0.010)
    s = watched.summary()
    assert s["batches"] == 10 and s["samples"] == 80 and s["batch_size"] == 8
    assert s["wait_share"] == pytest.approx(0.75) and s["kind"] == "input-bound"
    assert s["step_ms"] == pytest.approx(10 * 10 / 9)  # the last step is counted when the epoch ends
    [line] = lines
    assert "75% of the time waiting for data" in line and "input-bound" in line
    assert "packload tune PATH_OF_YOUR_PACK --batch-size 8 --step-ms 11" in line  # no dataset to name


def test_the_command_names_the_pack_the_loop_read(tmp_path) -> None:
    """The suggested command names the pack (or folder) the watched loader reads, through a
    DataLoader and a Subset, quoted for the shell when its path needs it."""
    from PIL import Image
    from torch.utils.data import DataLoader, Subset

    from packload.loaders.folder import FolderImages

    images = tmp_path / "my images"
    for name in ("cat", "dog"):
        (images / name).mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", (8, 6), (60 * i, 20, 90)).save(images / name / f"{i}.png")
    pack_path = tmp_path / "my images.lmdb"
    packload.pack(images, pack_path, workers=1, progress=False)
    dataset = packload.PackedImageFolder(pack_path)
    loaders = {str(pack_path): DataLoader(dataset, batch_size=2, collate_fn=list),
               f"{pack_path} (subset)": DataLoader(Subset(dataset, [0, 1, 2]), collate_fn=list),
               str(images): DataLoader(FolderImages(images), collate_fn=list)}
    for name, loader in loaders.items():
        watched = packload.watch(loader, report=None, cuda=False)
        assert len(list(watched)) > 0
        watched.wait_s, watched.step_s = 3.0, 1.0  # three quarters of the time waiting: input-bound
        path = name.removesuffix(" (subset)")
        assert watch_module.watched_source(loader) == path
        assert f"packload tune '{path}' --batch-size" in watched.line(), watched.line()


def test_a_loop_the_data_keeps_up_with_is_compute_bound(clock: Clock) -> None:
    watched, lines = run(clock, fetch_s=0.001, step_s=0.040)
    assert watched.summary()["kind"] == "compute-bound" and watched.summary()["wait_share"] < 0.05
    assert "compute-bound" in lines[0] and "packload tune" not in lines[0]


def test_a_report_every_n_batches_and_at_the_end(clock: Clock) -> None:
    _, lines = run(clock, fetch_s=0.02, step_s=0.02, batches=10, every=4)
    assert len(lines) == 3  # after batches 4 and 8, then the end
    assert "(4 batches" in lines[0] and "(10 batches" in lines[-1]


def test_no_report_when_asked_for_none_and_an_empty_loader(clock: Clock) -> None:
    watched = packload.watch(SlowLoader(clock, 0, 0.01), report=None, cuda=False)
    assert list(watched) == [] and watched.summary()["batches"] == 0 and len(watched) == 0
    with pytest.raises(ValueError, match="every=0"):
        packload.watch([], every=0)


def test_a_large_peak_with_a_small_batch_is_memory_bound(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the device's memory nearly full at a small batch (the CUDA figures given by the test)."""
    watched, _ = run(clock, fetch_s=0.001, step_s=0.040)
    watched.cuda = True
    watched.gpu_wait_ms = 0.0
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 75 << 30)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: type("Props", (), {"total_memory": 80 << 30})())
    s = watched.summary()
    assert s["kind"] == "memory-bound" and s["measured_on"] == "cuda events"
    assert "memory-bound: 75.0 of 80.0 GiB at batch 8" in watched.line()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_the_gpus_own_waiting_is_measured() -> None:
    torch.cuda.init()
    a = torch.randn(2048, 2048, device="cuda")
    watched = packload.watch(SlowLoader(Clock(), 5, 0.0), report=None)
    import time

    for _ in watched:
        time.sleep(0.02)  # the loader "waits" here, as the next() of a slow loader would
        (a @ a).sum().item()
    assert watched.summary()["measured_on"] == "cuda events" and 0 <= watched.summary()["wait_share"] <= 1
