"""PackSampler across two real processes (gloo): equal counts, full coverage, no overlap, same resume."""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from packload.loaders.sampler import PackSampler

WORLD_SIZE = 2
NUM_RECORDS = 1001  # odd, so "pad" and "drop" differ
CONSUMED = 137  # mid-epoch resume point, in samples of each rank
EPOCH = 2

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="torch.distributed with the gloo backend is not available in this torch build",
)


def gather(values: list[int]) -> list[list[int]]:
    """all_gather a list of ints whose length is the same on every rank."""
    tensor = torch.tensor(values, dtype=torch.int64)
    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(out, tensor)
    return [t.tolist() for t in out]


def run_uneven(uneven: str) -> dict:
    """One epoch on this rank, then a resume from this rank's own state and from rank 0's state."""
    sampler = PackSampler(NUM_RECORDS, seed=5, block_size=16, window_blocks=4, uneven=uneven)
    sampler.set_epoch(EPOCH)
    indices = list(sampler)
    counts = gather([len(indices), len(sampler)])

    iterator = iter(sampler)
    list(itertools.islice(iterator, CONSUMED))  # training consumed CONSUMED samples, then stopped
    state = json.loads(json.dumps(sampler.state_dict()))
    shared = [state if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(shared, src=0)  # the common pattern: save on rank 0, load everywhere

    remaining = {}
    for name, saved in (("own", state), ("rank0", shared[0])):
        resumed = PackSampler(NUM_RECORDS, block_size=16, window_blocks=4, uneven=uneven)
        resumed.load_state_dict(saved)
        resumed.set_epoch(EPOCH)
        remaining[name] = gather(list(resumed))
    return {
        "rank": sampler.rank,
        "world_size": sampler.world_size,
        "counts": counts,
        "indices": gather(indices),
        "remaining": remaining,
    }


def worker(rank: int, init_file: str, out_dir: str) -> None:
    """Spawned process: join the gloo group, run both uneven modes, write the results as JSON."""
    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # no network needed on a sandboxed host
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE)
    try:
        results = {uneven: run_uneven(uneven) for uneven in ("pad", "drop")}
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Results of both ranks, from one spawn of two real processes."""
    tmp = tmp_path_factory.mktemp("dist")
    mp.spawn(worker, args=(str(tmp / "init"), str(tmp)), nprocs=WORLD_SIZE, join=True)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(WORLD_SIZE)]


@pytest.mark.parametrize("uneven", ["pad", "drop"])
def test_ranks_from_process_group(results: list[dict], uneven: str) -> None:
    assert [r[uneven]["rank"] for r in results] == [0, 1]
    assert {r[uneven]["world_size"] for r in results} == {WORLD_SIZE}


@pytest.mark.parametrize(("uneven", "per_rank"), [("pad", 501), ("drop", 500)])
def test_equal_counts_and_coverage(results: list[dict], uneven: str, per_rank: int) -> None:
    res = results[0][uneven]
    assert res["counts"] == [[per_rank, per_rank]] * WORLD_SIZE
    assert res["indices"] == results[1][uneven]["indices"]  # both ranks gathered the same thing
    union = [i for rank_indices in res["indices"] for i in rank_indices]
    if uneven == "pad":
        assert set(union) == set(range(NUM_RECORDS))
    else:
        assert len(set(union)) == len(union) == WORLD_SIZE * per_rank


@pytest.mark.parametrize("uneven", ["pad", "drop"])
def test_resume_mid_epoch_on_both_ranks(results: list[dict], uneven: str) -> None:
    res = results[0][uneven]
    expected = [rank_indices[CONSUMED:] for rank_indices in res["indices"]]
    assert res["remaining"]["own"] == expected
    assert res["remaining"]["rank0"] == expected
