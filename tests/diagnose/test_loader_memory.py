"""How much memory a loader's workers and queued batches take (``packload.diagnose.loader_memory``):
the guard's margin, its prediction before a trial, what it learns from the trials, and its watch during
one, on memory figures the test gives; the bytes of batches a real pack yields. The prediction's
arithmetic at one point is in ``tests/diagnose/test_tune_search.py``; these are its edges."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from packload import PackedImageFolder, pack
from packload.diagnose import loader_memory
from packload.diagnose.loader_memory import GUESS_WORKER_BYTES, MemoryGuard, batch_nbytes
from packload.loaders.collate import collate_uint8
from packload.loaders.transforms import ResizeCenterCrop
from tests.image_factory import make_image_folder

MIB, GIB = 1 << 20, 1 << 30


@dataclass
class Measured:
    """A trial's worker memory, as ``tune_trials.Trial`` carries it."""

    num_workers: int
    worker_pss_mb: float


class Memory:
    """The machine's memory as the guard reads it: set by the test."""

    def __init__(self, total: int, available: int) -> None:
        self.total, self.available = total, available

    def __call__(self) -> dict[str, int]:
        return {"total": self.total, "available": self.available}


@pytest.fixture
def memory(monkeypatch: pytest.MonkeyPatch) -> Memory:
    status = Memory(total=64 * GIB, available=32 * GIB)
    monkeypatch.setattr(loader_memory, "memory_status", status)
    return status


def test_the_margin_is_a_tenth_of_the_memory_and_at_least_one_gib(memory: Memory) -> None:
    assert MemoryGuard().margin == 64 * GIB // 10
    memory.total = 4 * GIB  # a tenth would be 0.4 GiB
    assert MemoryGuard().margin == GIB
    memory.total = 10 * GIB + 7
    assert MemoryGuard().margin == max(GIB, (10 * GIB + 7) // 10)
    assert MemoryGuard(margin_bytes=0).margin == 0  # given: taken as it is
    assert MemoryGuard(margin_bytes=5 * MIB).margin == 5 * MIB


def test_before_any_trial_each_worker_is_guessed_and_no_batch_is_queued(memory: Memory) -> None:
    guard = MemoryGuard()
    assert guard.per_worker == GUESS_WORKER_BYTES and guard.batch_bytes == 0
    assert guard.predicted(3, 2, True) == 3 * GUESS_WORKER_BYTES
    assert guard.predicted(0, None, False) == 0


def test_queued_batches_count_per_worker_and_prefetch_and_twice_when_pinned(memory: Memory) -> None:
    guard = MemoryGuard()
    guard.per_worker, guard.batch_bytes = 10 * MIB, 3 * MIB
    assert guard.predicted(2, 4, False) == 2 * 10 * MIB + 2 * 4 * 3 * MIB
    assert guard.predicted(2, 4, True) == 2 * 10 * MIB + 2 * 2 * 4 * 3 * MIB
    assert guard.predicted(2, None, False) == 2 * 10 * MIB  # no queue given: workers only
    assert guard.predicted(0, None, True) == 0  # the main process alone: nothing added


def test_a_configuration_is_allowed_while_the_margin_stays_free(memory: Memory) -> None:
    """Allowed exactly while the free memory less the prediction is at least the margin."""
    guard = MemoryGuard(margin_bytes=GIB)
    guard.per_worker, guard.batch_bytes = 100 * MIB, 0
    memory.available = GIB + 4 * 100 * MIB
    assert guard.allows(4, 2, False)  # exactly the margin left
    assert not guard.allows(5, 2, False)
    memory.available -= 1
    assert not guard.allows(4, 2, False)  # a byte short
    assert guard.allows(0, None, False)
    memory.available = GIB - 1
    assert not guard.allows(0, None, False)  # already below the margin: not even the main process


def test_low_means_below_the_margin_now(memory: Memory) -> None:
    guard = MemoryGuard(margin_bytes=2 * GIB)
    memory.available = 2 * GIB
    assert not guard.low()
    memory.available = 2 * GIB - 1
    assert guard.low()
    memory.available = 40 * GIB  # read afresh on every call
    assert not guard.low()


def test_the_first_measurement_replaces_the_guess_and_later_ones_only_raise_it(memory: Memory) -> None:
    guard = MemoryGuard()
    guard.learn(Measured(4, 40.0))  # 10 MiB a worker: far below the guess, taken anyway
    assert guard.per_worker == 10 * MIB
    guard.learn(Measured(2, 60.0))  # 30 MiB a worker: the largest seen
    assert guard.per_worker == 30 * MIB
    guard.learn(Measured(3, 30.0))  # 10 MiB: smaller, ignored
    assert guard.per_worker == 30 * MIB
    guard.learn(Measured(0, 500.0))  # no workers, or no measurement: nothing to learn
    guard.learn(Measured(5, 0.0))
    assert guard.per_worker == 30 * MIB
    assert guard.predicted(2, None, False) == 60 * MIB


def test_a_measurement_equal_to_the_guess_is_kept_as_the_largest_seen(memory: Memory) -> None:
    """The largest seen holds even when the first measurement happens to equal the guess: a later,
    smaller one does not replace it as if nothing had been measured yet."""
    guard = MemoryGuard()
    guard.learn(Measured(2, 2 * GUESS_WORKER_BYTES / MIB))  # exactly the guess a worker
    assert guard.per_worker == GUESS_WORKER_BYTES
    guard.learn(Measured(2, 20.0))  # 10 MiB a worker
    assert guard.per_worker == GUESS_WORKER_BYTES


def test_a_learnt_cost_decides_what_fits(memory: Memory) -> None:
    """Workers measured heavier than guessed: fewer fit in the same free memory."""
    guard = MemoryGuard(margin_bytes=GIB)
    memory.available = GIB + 8 * GUESS_WORKER_BYTES
    assert guard.allows(8, None, False)
    guard.learn(Measured(2, 2 * 2 * GUESS_WORKER_BYTES / MIB))  # twice the guess a worker
    assert guard.allows(4, None, False) and not guard.allows(5, None, False)


def test_the_bytes_of_a_real_packs_batches(tmp_path: Path) -> None:
    """Images and labels of a pack's batches, as the tuner's example batch gives them: B×3×S×S uint8
    and B int64; the last, short batch counts its own samples."""
    make_image_folder(tmp_path / "images", classes=("a", "b"), per_class=5, seed=1)
    pack(tmp_path / "images", tmp_path / "p.shards", workers=1, progress=False)
    dataset = PackedImageFolder(tmp_path / "p.shards", transform=ResizeCenterCrop(24))
    sizes = [batch_nbytes(batch) for batch in DataLoader(dataset, batch_size=4, collate_fn=collate_uint8)]
    assert sizes == [4 * (3 * 24 * 24 + 8)] * 2 + [2 * (3 * 24 * 24 + 8)]


def test_nothing_but_tensors_counts() -> None:
    assert batch_nbytes(None) == 0
    assert batch_nbytes(("a", 3, {"path": "x.jpg"})) == 0
    assert batch_nbytes([]) == 0
    half = torch.zeros(10, 4, dtype=torch.float16)
    assert batch_nbytes({"x": half[:2], "y": [half]}) == 2 * 4 * 2 + 10 * 4 * 2  # a slice counts its own size
