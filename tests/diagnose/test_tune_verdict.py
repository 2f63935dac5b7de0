"""What a tune's measurements mean (``packload.diagnose.tune_verdict``): compute-bound when the GPU
hardly waits, else input-bound with the cause the figures point at (the CPU, storage, the main
process), what makes a sample cheaper, PackLoader when it was measured faster, and the step and
loop assumed, always last."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from packload.diagnose.tune_trials import Trial
from packload.diagnose.tune_verdict import verdict_of


def pick(workers: int, rate: float, gpu_wait: float, cpu_cores: float = 1.0) -> Trial:
    return Trial(workers, 2, False, samples_per_s=rate, batches_per_s=rate / 32, gpu_wait=gpu_wait, startup_s=1.0,
                 worker_rss_mb=0.0, worker_pss_mb=0.0, noise=0.01, cpu_cores=cpu_cores, batches=50, seconds=2.0,
                 phase="coarse")


@dataclass
class Figures:
    """What ``verdict_of`` reads of a tune's result, set here by hand."""

    winner: Trial
    stopped: str = "plateau"
    page_cache: dict[str, float | None] = field(default_factory=lambda: {"before": None, "after": None})
    fast_path: dict[str, Any] | None = None
    source: str = "pack"
    dataset: str = "train.shards"
    batch_size: int = 32
    step_samples_per_s: float = 3200.0
    worker_limit: str = "4 usable cores"
    machine: dict[str, Any] = field(default_factory=lambda: {"usable_cores": 4})
    cpu_others: float | None = 0.0
    step: dict[str, Any] = field(default_factory=lambda: {"on_gpu": False, "step_ms": 10.0, "given": True,
                                                           "model": None, "sync": True})

    def fast_path_wins(self) -> bool:
        fast = self.fast_path
        return bool(fast and fast["samples_per_s"] > 1.04 * self.winner.samples_per_s)


def test_a_gpu_that_hardly_waits_is_compute_bound() -> None:
    kind, message = verdict_of(Figures(pick(2, 3100.0, 0.03), stopped="saturated"))
    assert kind == "compute-bound"
    assert message.startswith("the loader keeps up with 2 workers (3,100 img/s): training is compute-bound and "
                              "the GPU waits 3% of the time")
    assert "; assumed a GPU step of 10 ms per batch of 32 (as given; emulated by a wait: " in message
    assert message.endswith("in a training loop that waits for each step (as loss.item() every step does)")


def test_data_read_from_the_page_cache_points_at_the_main_process_not_the_disk() -> None:
    kind, message = verdict_of(Figures(pick(4, 1000.0, 0.6), page_cache={"before": 0.97, "after": 0.99}))
    assert kind == "input-bound"
    assert "the data was in the page cache (99% of its pages): the limit is the main process" in message
    assert "storage" not in message


def test_data_missing_from_the_page_cache_points_at_storage() -> None:
    _, message = verdict_of(Figures(pick(4, 1000.0, 0.6), page_cache={"before": 0.1, "after": 0.3}))
    assert "only 30% of the data's pages were in the page cache: samples wait on storage" in message


def test_a_loader_that_keeps_the_cores_busy_is_limited_by_the_cpu() -> None:
    _, message = verdict_of(Figures(pick(4, 1000.0, 0.6, cpu_cores=3.8)))
    assert "the CPU is the limit (3.8 of 4 usable cores busy with the loader), so more CPU cores would help" in message


def test_a_folder_is_told_to_be_packed_by_its_own_path() -> None:
    _, message = verdict_of(Figures(pick(4, 1000.0, 0.6), source="folder", dataset="/data/my images"))
    assert "pack the folder (`pack '/data/my images' data.lmdb --encoding jpeg --max-side 256`)" in message


def test_packloader_measured_faster_is_recommended() -> None:
    fast = {"pick": 1, "threads": 4, "samples_per_s": 3000.0, "gpu_wait": 0.05}
    kind, message = verdict_of(Figures(pick(4, 1000.0, 0.6), fast_path=fast))
    assert kind == "compute-bound"
    assert message.startswith("PackLoader with 4 threads delivers 3,000 img/s, 3.00x the DataLoader pick, and keeps "
                              "up")
    slower = {**fast, "samples_per_s": 1010.0}
    kind, message = verdict_of(Figures(pick(4, 1000.0, 0.6), fast_path=slower))
    assert kind == "input-bound" and "(PackLoader, also measured: 1,010 img/s with 4 threads, no faster)" in message
