"""The GPU benchmark scripts (benchmarks/gpu_check.py, benchmarks/gpu_train.py) where no GPU is:
they say so and exit 0, and their training loop and epoch handling work on the CPU."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import gpu_check, gpu_train  # noqa: E402
from packload.diagnose.gpu_step import SmallCNN  # noqa: E402

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")


@NO_CUDA
def test_scripts_say_there_is_no_gpu_and_exit_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_check.main([]) == 0
    assert gpu_train.main([str(tmp_path / "images"), str(tmp_path / "keep"), str(tmp_path / "small")]) == 0
    out = capsys.readouterr().out
    assert out.count("no CUDA device here") == 2 and "Nothing was" in out


def test_epochs_remakes_a_spent_generator_and_reuses_a_loader() -> None:
    made: list[int] = []

    def generator():
        made.append(1)
        return (i for i in range(3))

    assert list(itertools.islice(gpu_train.epochs(generator), 8)) == [0, 1, 2, 0, 1, 2, 0, 1]
    assert len(made) == 3, "a new generator for each epoch"
    lists: list[int] = []

    def reusable():
        lists.append(1)
        return [5, 6]

    assert list(itertools.islice(gpu_train.epochs(reusable), 5)) == [5, 6, 5, 6, 5]
    assert len(lists) == 1, "a re-iterable loader is made once"


def test_trainer_steps_a_model_and_counts_images_on_the_cpu() -> None:
    torch.manual_seed(0)
    model = SmallCNN(num_classes=3, width=4)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = gpu_train.Trainer(model, torch.device("cpu"))
    batch = (torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8), torch.tensor([0, 1, 2, 0]))
    result = trainer.run(gpu_train.repeat(batch), seconds=0.2, warmup=2)
    assert result["batches"] >= 1 and result["images_per_s"] > 0
    assert result["images_per_s"] == pytest.approx(4 * result["batches"] / result["seconds"], rel=0.05)
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters(), strict=True)), \
        "the SGD steps changed the weights"


def test_the_gpu_decoded_rows_are_set_against_the_best_cpu_feed() -> None:
    results = {
        "ceiling: one batch already on the GPU": {"images_per_s": 9000.0},
        "keep pack, PackLoader + CenterCrop(224)": {"images_per_s": 1000.0},
        "max-side-256 pack, drop-in DataLoader": {"images_per_s": 1500.0},
        "max-side-256 pack, PackLoader(device='cuda') + CenterCrop(224), nvimgcodec": {"images_per_s": 4500.0},
        "keep pack, PackLoader(device='cuda') + RandomResizedCrop(224) + flip, nvimgcodec": {"images_per_s": 3000.0},
        "a contender that measured nothing": {"images_per_s": None},
    }
    best = gpu_train.versus_best_cpu_feed(results)
    assert best == {"gpu": "max-side-256 pack, PackLoader(device='cuda') + CenterCrop(224), nvimgcodec",
                    "cpu": "max-side-256 pack, drop-in DataLoader", "ratio": 3.0}
    assert gpu_train.versus_best_cpu_feed({k: v for k, v in results.items() if "cuda" not in k}) is None
