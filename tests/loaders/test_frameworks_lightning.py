"""Lightning's Trainer on two real CPU ranks (``ddp_spawn``, gloo): every image of the pack exactly once
per epoch across the ranks, in equal shares, with ``use_distributed_sampler`` on (Lightning's default)
and off, for PackSampler in a DataLoader, ``batch_loader`` and ``PackLoader``, over two epochs whose
orders differ (Lightning calls each sampler's ``set_epoch``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.framework_pack import NUM_IMAGES, check_epoch, ids_of, make_id_pack, read_seen, write_seen

pl = pytest.importorskip("lightning.pytorch", reason="lightning is not installed (pip install packload[frameworks])")
from torch.utils.data import DataLoader  # noqa: E402

from packload import PackedImageFolder, PackLoader, batch_loader  # noqa: E402
from packload.loaders.collate import collate_uint8  # noqa: E402

WORLD_SIZE = 2
BATCH = 8
EPOCHS = 2
LOADERS = ("dataloader", "batch_loader", "pack_loader")

pytestmark = pytest.mark.skipif(not torch.distributed.is_gloo_available(),
                                reason="torch.distributed with the gloo backend is not available")


def loaders(pack: Path) -> dict[str, object]:
    """The three ways to read a pack, each with its own (default, rank-aware) sampler."""
    ds = PackedImageFolder(pack, output="numpy")
    return {
        "dataloader": DataLoader(ds, batch_size=BATCH, sampler=ds.sampler(block_size=8, window_blocks=2),
                                 collate_fn=collate_uint8),
        "batch_loader": batch_loader(ds, BATCH, sampler=ds.sampler(block_size=8, window_blocks=2)),
        "pack_loader": PackLoader(ds, BATCH, sampler=ds.sampler(block_size=8, window_blocks=2), threads=0),
    }


class RecordingModule(pl.LightningModule):
    """Trains nothing; records the ids of every image each loader hands this rank, per epoch."""

    def __init__(self, pack: str, out_dir: str) -> None:
        super().__init__()
        self.pack, self.out_dir = Path(pack), Path(out_dir)
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: dict[str, dict[str, list[int]]] = {name: {} for name in LOADERS}

    def train_dataloader(self) -> dict[str, object]:
        return loaders(self.pack)

    def training_step(self, batch: dict, batch_index: int) -> torch.Tensor:
        for name, (images, _labels) in batch.items():
            self.seen[name].setdefault(str(self.current_epoch), []).extend(ids_of(images))
        return (self.weight * 0.0).sum()

    def on_train_end(self) -> None:
        write_seen(self.out_dir, self.global_rank, self.seen)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_id_pack(tmp_path_factory.mktemp("lightning"))


@pytest.mark.parametrize("use_distributed_sampler", [True, False], ids=["default", "sampler-off"])
def test_every_image_once_per_epoch(pack: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    use_distributed_sampler: bool) -> None:
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    trainer = pl.Trainer(accelerator="cpu", devices=WORLD_SIZE, strategy="ddp_spawn", max_epochs=EPOCHS,
                         use_distributed_sampler=use_distributed_sampler, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0)
    trainer.fit(RecordingModule(str(pack), str(tmp_path)))
    ranks = read_seen(tmp_path, WORLD_SIZE)
    for name in LOADERS:
        orders = []
        for epoch in map(str, range(EPOCHS)):
            per_rank = [rank[name][epoch] for rank in ranks]
            assert [len(ids) for ids in per_rank] == [NUM_IMAGES // WORLD_SIZE] * WORLD_SIZE, name
            check_epoch(per_rank)
            orders.append(per_rank)
        assert orders[0] != orders[1], f"{name}: both epochs in the same order (set_epoch not called)"
