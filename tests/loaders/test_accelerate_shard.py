"""``sharded_by_accelerate``: True exactly when Accelerate's batch sharding iterates the sampler, so a
PackSampler split by rank is refused there (SplitTwiceError) and a global one (``world_size=1``) is
not, in one process, with Accelerate's own BatchSamplerShard."""

from __future__ import annotations

import pytest
from torch.utils.data import BatchSampler

from packload import PackSampler, SplitTwiceError, UsageError
from packload.loaders.accelerate_shard import sharded_by_accelerate

data_loader = pytest.importorskip("accelerate.data_loader", reason="accelerate is not installed")


def test_nothing_sharding_outside_accelerate() -> None:
    assert not sharded_by_accelerate()
    sampler = PackSampler(60, rank=1, world_size=2)
    assert len(list(BatchSampler(sampler, 6, False))) == 5  # a plain batch sampler: nothing refused


def test_a_sampler_split_by_rank_is_refused_under_the_shard() -> None:
    shard = data_loader.BatchSamplerShard(BatchSampler(PackSampler(60, rank=0, world_size=2), 6, False),
                                          num_processes=2, process_index=0)
    with pytest.raises(SplitTwiceError, match=r"split over 2 ranks .* world_size=1"):
        list(shard)


@pytest.mark.parametrize("split_batches", [False, True])
def test_a_global_sampler_is_sharded_once(split_batches: bool) -> None:
    seen = []
    for process in range(2):
        sampler = PackSampler(60, world_size=1, seed=3)
        shard = data_loader.BatchSamplerShard(BatchSampler(sampler, 6, False), num_processes=2,
                                              process_index=process, split_batches=split_batches)
        seen.append([i for batch in shard for i in batch])
        with pytest.raises(UsageError, match="pass consumed="):
            sampler.state_dict()  # the sampler cannot know what the processes used together
        assert sampler.state_dict(consumed=12)["position"] == 12
    assert len(seen[0]) == len(seen[1]) == 30
    assert sorted(seen[0] + seen[1]) == list(range(60))


def test_detection_ends_when_iterated_directly_again() -> None:
    sampler = PackSampler(60, world_size=1)
    list(data_loader.BatchSamplerShard(BatchSampler(sampler, 6, False), num_processes=2, process_index=1))
    list(sampler)
    assert sampler.state_dict()["position"] == 60
