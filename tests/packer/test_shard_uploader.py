"""``ShardUploader``: shards handed over by the writer are uploaded on a thread of their own and
deleted locally; the upload bar counts every shard once, whenever it is attached."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from packload.packer.upload import ShardUploader


class GatedStore:
    """A store stand-in that keeps each upload's bytes and holds an upload until its gate opens."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.gates: dict[str, threading.Event] = {}

    def gate(self, name: str) -> threading.Event:
        return self.gates.setdefault(name, threading.Event())

    def upload(self, local: Path, name: str) -> None:
        self.gate(name).wait(10)
        self.objects[name] = Path(local).read_bytes()


def _shard(folder: Path, i: int, size: int) -> Path:
    path = folder / f"shard-{i:05d}.bin"
    path.write_bytes(bytes([i]) * size)
    return path


@pytest.mark.parametrize("attach_after", [0, 2, 5])
def test_the_bar_counts_every_shard_once_wherever_it_is_attached(tmp_path, attach_after):
    work, outbox = tmp_path / "work", tmp_path / "outbox"
    work.mkdir(), outbox.mkdir()
    store = GatedStore()
    uploader = ShardUploader(store, outbox, in_flight=2)
    sizes = [1000 + 37 * i for i in range(5)]
    counted: list[int] = []
    for i, size in enumerate(sizes):
        store.gate(f"shard-{i:05d}.bin").set() if i < attach_after else None
        uploader(_shard(work, i, size))
    assert uploader.given_bytes == sum(sizes)
    uploader.follow(counted.append)  # shards still uploading finish while (or after) the bar is attached
    for i in range(len(sizes)):
        store.gate(f"shard-{i:05d}.bin").set()
    uploader.wait()
    assert sum(counted) == sum(sizes)
    assert sorted(uploader.uploaded) == sorted(store.objects) == [f"shard-{i:05d}.bin" for i in range(5)]
    assert store.objects["shard-00003.bin"] == bytes([3]) * sizes[3]
    assert list(outbox.iterdir()) == [] and list(work.iterdir()) == []


def test_attaching_the_bar_while_uploads_finish_never_reads_a_deleted_shard(tmp_path):
    """The bar's total is the uploader's own count, not a listing of the outbox, where the upload
    thread deletes shards at any moment (a listing followed by a size read raced with it)."""
    outbox = tmp_path / "outbox"
    outbox.mkdir()
    store = GatedStore()
    for round_ in range(30):
        uploader = ShardUploader(store, outbox, in_flight=3)
        names = [f"shard-{round_ * 3 + i:05d}.bin" for i in range(3)]
        for i, name in enumerate(names):
            store.gate(name).set()
            path = tmp_path / name
            path.write_bytes(b"x" * (100 + i))
            uploader(path)
        counted: list[int] = []
        uploader.follow(counted.append)
        uploader.wait()
        assert sum(counted) == uploader.given_bytes == 303
