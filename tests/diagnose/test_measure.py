"""Timing a loader (``packload.diagnose.measure``): what is counted, what is left out as warm-up, and
the size of each kind of batch."""

from __future__ import annotations

import os

import torch
from torch.utils.data import DataLoader

from packload.diagnose.measure import batch_size_of, loader_worker_pids, process_memory, time_loader


def test_batch_sizes_of_each_kind_of_batch() -> None:
    assert batch_size_of((torch.zeros(5, 3, 2, 2), torch.zeros(5))) == 5
    assert batch_size_of((torch.zeros(30), torch.zeros(4), torch.zeros(3))) == 3  # data, offsets, labels
    assert batch_size_of([("a", 0), ("b", 1)]) == 2


def test_time_loader_counts_the_batches_after_the_warm_up() -> None:
    loader = DataLoader(list(range(23)), batch_size=5)  # batches of 5, 5, 5, 5, 3
    whole = time_loader(loader)
    assert whole.samples == 18 and whole.seconds >= 0 and whole.first_batch_s >= 0  # the first 5 are warm-up
    assert time_loader(loader, max_batches=2).samples == 10
    assert time_loader(loader, warmup_batches=0).samples == 23


def test_workers_of_a_loader_and_their_memory() -> None:
    loader = DataLoader(list(range(8)), batch_size=2, num_workers=2)
    iterator = iter(loader)
    next(iterator)
    pids = loader_worker_pids(iterator)
    assert len(pids) == 2 and os.getpid() not in pids
    memory = process_memory(pids)
    assert memory["rss"] > 0 and memory["pss"] > 0
    del iterator
    assert loader_worker_pids(iter(DataLoader(list(range(4))))) == []
