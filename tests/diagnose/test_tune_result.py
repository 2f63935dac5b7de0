"""What ``tune`` returns (``packload.diagnose.tune_result.TuneResult``), built here from trials set by
hand: the pick's DataLoader arguments, a file that ``load_loader_config`` reads back, a JSON form
that names the pick and the fastest by their row, and a DataLoader made with the pick."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.utils.data import RandomSampler, SequentialSampler, TensorDataset

from packload.diagnose.loader_config import load_loader_config
from packload.diagnose.measure import machine_info
from packload.diagnose.tune_result import TuneResult
from packload.diagnose.tune_trials import Trial


def trial(workers: int, rate: float, gpu_wait: float = 0.5) -> Trial:
    return Trial(workers, 2 if workers else None, False, samples_per_s=rate, batches_per_s=rate / 8,
                 gpu_wait=gpu_wait, startup_s=0.8, worker_rss_mb=100.0, worker_pss_mb=30.0, noise=0.01,
                 cpu_cores=1.0, batches=30, seconds=2.0, phase="coarse")


def result(fast_path: dict | None = None) -> TuneResult:
    trials = [trial(0, 400.0), trial(2, 980.0), trial(4, 1000.0)]
    return TuneResult(
        batch_size=8, samples_per_epoch=800, step={"description": "emulated GPU step: a 4 ms wait per batch",
                                                   "step_ms": 4.0, "model": None, "sync": True, "given": True,
                                                   "device": "cpu", "on_gpu": False},
        step_samples_per_s=2000.0, trials=trials, winner=trials[1], fastest=trials[2],
        settings={"num_workers": 2, "prefetch_factor": 2, "pin_memory": False, "persistent_workers": True},
        verdict="", message="", epoch_s=800 / 980.0, not_measured={"pin_memory": "not measured (no CUDA)"},
        stopped="plateau", skipped=[], notes=[], elapsed_s=5.0, budget_s=6.0, max_workers=4, tolerance=0.04,
        machine=machine_info(), fast_path=fast_path, collate_fn=lambda batch: batch)


def test_the_json_form_names_the_pick_and_the_fastest_by_their_row() -> None:
    tuned = result()
    document = json.loads(tuned.to_json())
    assert document["winner_index"] == 1 and document["fastest_index"] == 2
    assert document["winner"] == document["trials"][1] and document["fastest"] == document["trials"][2]
    assert document["loader"] == {"batch_size": 8, "num_workers": 2, "prefetch_factor": 2, "pin_memory": False,
                                  "persistent_workers": True}
    assert "collate_fn" not in document and "sampler" not in document


def test_the_saved_settings_are_read_back_as_dataloader_arguments(tmp_path: Path) -> None:
    saved = result().save(tmp_path / "loader.json")
    assert saved == tmp_path / "loader.json" and [p.name for p in tmp_path.iterdir()] == ["loader.json"]
    assert load_loader_config(saved) == result().loader_kwargs()
    measured = json.loads(saved.read_text())["measured"]
    assert measured["samples_per_s"] == 980.0 and measured["step"].startswith("emulated GPU step")


def test_the_loader_uses_the_pick_a_shuffle_and_the_collate_function_tuned_with() -> None:
    tuned = result()
    data = TensorDataset(torch.arange(32))
    loader = tuned.make_loader(data)
    assert loader.batch_size == 8 and loader.num_workers == 2 and loader.persistent_workers
    assert isinstance(loader.sampler, RandomSampler) and loader.collate_fn is tuned.collate_fn
    ordered = tuned.make_loader(data, sampler=SequentialSampler(data), num_workers=0, persistent_workers=False,
                                prefetch_factor=None)
    assert isinstance(ordered.sampler, SequentialSampler) and ordered.num_workers == 0


def test_packloader_wins_only_beyond_the_tolerance_and_the_verdict_follows() -> None:
    assert not result().fast_path_wins()
    close = {"pick": 0, "threads": 2, "samples_per_s": 1010.0, "gpu_wait": 0.5}
    assert not result(close).fast_path_wins()
    faster = result({**close, "samples_per_s": 1990.0, "gpu_wait": 0.01})
    assert faster.fast_path_wins()
    faster.conclude()
    assert faster.verdict == "compute-bound" and faster.message.startswith("PackLoader with 2 threads")
