"""torchdata's ``StatefulDataLoader`` over a PackSampler: its ``state_dict`` taken mid-epoch (with and
without workers) resumes a new loader at the next unseen batch, so the epoch is seen exactly once;
the sampler of each of two ranks (given explicitly) resumes its own share."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.framework_pack import NUM_IMAGES, check_epoch, ids_of, make_id_pack

stateful = pytest.importorskip("torchdata.stateful_dataloader",
                               reason="torchdata is not installed (pip install packload[frameworks])")

from packload import PackedImageFolder  # noqa: E402
from packload.loaders.collate import collate_uint8  # noqa: E402

BATCH = 6
STEPS = 3  # batches used before the state is saved
EPOCH = 1


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_id_pack(tmp_path_factory.mktemp("torchdata"))


def loader(ds: PackedImageFolder, rank: int, workers: int) -> stateful.StatefulDataLoader:
    sampler = ds.sampler(block_size=8, window_blocks=2, rank=rank, world_size=2)
    sampler.set_epoch(EPOCH)
    return stateful.StatefulDataLoader(ds, batch_size=BATCH, sampler=sampler, collate_fn=collate_uint8,
                                       num_workers=workers)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_sees_each_image_once(pack: Path, workers: int) -> None:
    ds = PackedImageFolder(pack, output="numpy")
    per_rank = []
    for rank in range(2):
        full = [i for images, _labels in loader(ds, rank, workers) for i in ids_of(images)]
        first = loader(ds, rank, workers)
        batches = iter(first)
        before = [i for _ in range(STEPS) for i in ids_of(next(batches)[0])]
        state = first.state_dict()
        del batches
        second = loader(ds, rank, workers)
        second.load_state_dict(state)
        after = [i for images, _labels in second for i in ids_of(images)]
        assert len(before) == STEPS * BATCH
        assert before + after == full, f"rank {rank}: the resumed epoch differs from the uninterrupted one"
        per_rank.append(before + after)
    check_epoch(per_rank)
    assert sum(map(len, per_rank)) == NUM_IMAGES
