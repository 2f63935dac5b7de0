"""Hugging Face Accelerate on two real CPU processes (gloo, spawned with the environment ``accelerate
launch`` sets): ``prepare()`` shards the batches of any sampler, so a PackSampler split by rank is
refused with SplitTwiceError, one built with ``world_size=1`` gives every image exactly once per epoch
across the processes in equal shares (DataLoader, ``batch_loader``; default, ``split_batches`` and
``dispatch_batches``), a loader left out of ``prepare()`` and ``PackLoader`` (which ``prepare()``
leaves alone) keep PackSampler's own split, and a prepared loader resumes mid-epoch from the state
saved with the global ``consumed``."""

from __future__ import annotations

import os
import socket
import sys
import traceback
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.framework_pack import NUM_IMAGES, check_epoch, ids_of, make_id_pack, read_seen, write_seen

accelerate = pytest.importorskip("accelerate", reason="accelerate is not installed (pip install packload[frameworks])")
from accelerate.utils import DataLoaderConfiguration  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from packload import PackedImageFolder, PackLoader, SplitTwiceError, UsageError, batch_loader  # noqa: E402
from packload.loaders.collate import collate_uint8  # noqa: E402

WORLD_SIZE = 2
BATCH = 6  # 60 images: 10 batches, 5 for each process, nothing padded
EPOCHS = 2
RESUME_EPOCH, RESUME_STEPS = 1, 2

pytestmark = pytest.mark.skipif(not torch.distributed.is_gloo_available(),
                                reason="torch.distributed with the gloo backend is not available")


def sampler(ds: PackedImageFolder, **options: object):
    return ds.sampler(block_size=8, window_blocks=2, **options)


def epochs(loader, set_epoch) -> dict[str, list[int]]:
    """The ids this process sees in each epoch, ``set_epoch(epoch)`` called before each."""
    seen = {}
    for epoch in range(EPOCHS):
        set_epoch(epoch)
        seen[str(epoch)] = [i for images, _labels in loader for i in ids_of(images)]
    return seen


def dataloader(ds: PackedImageFolder, batch: int = BATCH, **options: object) -> DataLoader:
    return DataLoader(ds, batch_size=batch, sampler=sampler(ds, **options), collate_fn=collate_uint8)


def run_cases(pack: Path) -> dict:
    """Every case on this process; returns ``{case: {epoch: ids}}`` (or the error's text)."""
    ds = PackedImageFolder(pack, output="numpy")
    plain = accelerate.Accelerator(cpu=True)
    seen: dict = {}
    try:  # the default: a sampler split by rank, sharded again by prepare()
        loader = plain.prepare(dataloader(ds))
        next(iter(loader))
        seen["refused"] = "not refused"
    except SplitTwiceError as error:
        seen["refused"] = str(error)

    loader = plain.prepare(dataloader(ds, world_size=1))
    seen["dataloader"] = epochs(loader, loader.set_epoch)
    loader = plain.prepare(dataloader(ds, batch=8, world_size=1))  # prepare() pads the last round
    seen["dataloader_padded"] = epochs(loader, loader.set_epoch)
    global_order = sampler(ds, world_size=1)
    loader = plain.prepare(batch_loader(ds, BATCH, sampler=global_order))
    seen["batch_loader"] = epochs(loader, global_order.set_epoch)

    for name, config in (("split_batches", DataLoaderConfiguration(split_batches=True)),
                         ("dispatch_batches", DataLoaderConfiguration(dispatch_batches=True))):
        loader = accelerate.Accelerator(cpu=True, dataloader_config=config).prepare(dataloader(ds, world_size=1))
        seen[name] = epochs(loader, loader.set_epoch)

    loader = dataloader(ds)  # not prepared: PackSampler's own split from the process group
    seen["unprepared"] = epochs(loader, loader.sampler.set_epoch)
    loader = plain.prepare(PackLoader(ds, BATCH, sampler=sampler(ds), threads=0))
    assert isinstance(loader, PackLoader)
    seen["pack_loader"] = epochs(loader, loader.set_epoch)
    seen["resume"] = resume(plain, ds)
    return seen


def resume(plain: accelerate.Accelerator, ds: PackedImageFolder) -> dict:
    """Stop a prepared loader after RESUME_STEPS steps, resume a new one from the saved state."""
    order = sampler(ds, world_size=1)
    loader = plain.prepare(DataLoader(ds, batch_size=BATCH, sampler=order, collate_fn=collate_uint8))
    loader.set_epoch(RESUME_EPOCH)
    full = [ids_of(images) for images, _labels in loader]
    loader.set_epoch(RESUME_EPOCH)
    batches = iter(loader)
    before = [ids_of(next(batches)[0]) for _ in range(RESUME_STEPS)]
    try:
        order.state_dict()
        refused = "not refused"
    except UsageError as error:
        refused = str(error)
    state = order.state_dict(consumed=RESUME_STEPS * BATCH * plain.num_processes)
    del batches
    again = sampler(ds, world_size=1)
    again.load_state_dict(state)
    loader = plain.prepare(DataLoader(ds, batch_size=BATCH, sampler=again, collate_fn=collate_uint8))
    loader.set_epoch(RESUME_EPOCH)
    after = [ids_of(images) for images, _labels in loader]
    return {"full": full, "resumed": before + after, "refused": refused}


def worker(rank: int, port: int, pack: str, out_dir: str) -> None:
    """One spawned process, with the environment ``accelerate launch`` gives it."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE),
                      LOCAL_WORLD_SIZE=str(WORLD_SIZE), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        write_seen(Path(out_dir), rank, run_cases(Path(pack)))
    except BaseException:
        Path(out_dir, f"error{rank}.txt").write_text(traceback.format_exc())
        raise
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """What each of the two processes saw, from one spawn."""
    tmp = tmp_path_factory.mktemp("accelerate")
    pack = make_id_pack(tmp)
    mp.spawn(worker, args=(free_port(), str(pack), str(tmp)), nprocs=WORLD_SIZE, join=True)
    return read_seen(tmp, WORLD_SIZE)


def test_a_sampler_split_by_rank_is_refused_with_the_fix(ranks: list[dict]) -> None:
    for rank in ranks:
        assert "split over 2 ranks" in rank["refused"] and "world_size=1" in rank["refused"]
        assert "\n" not in rank["refused"]


@pytest.mark.parametrize("case", ["dataloader", "batch_loader", "split_batches", "dispatch_batches",
                                  "unprepared", "pack_loader"])
def test_every_image_once_per_epoch(ranks: list[dict], case: str) -> None:
    orders = []
    for epoch in map(str, range(EPOCHS)):
        per_rank = [rank[case][epoch] for rank in ranks]
        assert [len(ids) for ids in per_rank] == [NUM_IMAGES // WORLD_SIZE] * WORLD_SIZE
        check_epoch(per_rank)
        orders.append(per_rank)
    assert orders[0] != orders[1], "both epochs in the same order"


def test_prepare_pads_the_last_round_to_equal_shares(ranks: list[dict]) -> None:
    # 60 images in batches of 8: 7 full and one of 4, which prepare() fills from the epoch's start.
    for epoch in map(str, range(EPOCHS)):
        check_epoch([rank["dataloader_padded"][epoch] for rank in ranks], padded=4)


def test_resume_mid_epoch_with_global_consumed(ranks: list[dict]) -> None:
    for rank in ranks:
        assert rank["resume"]["resumed"] == rank["resume"]["full"]
        assert "consumed=steps * batch_size * accelerator.num_processes" in rank["resume"]["refused"]
    check_epoch([sum(rank["resume"]["full"], []) for rank in ranks])
