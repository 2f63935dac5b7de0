"""The shards writer (``packload.packer.write_shards``): records in shards of at most ``shard_size``
bytes, the manifest naming each shard's size and sha256 and the index's, published last; the same
files record by record and many at once; a checkpoint that survives the process; resuming after a
cut that keeps every intact record."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from packload.core.format import decode_shard_header
from packload.core.scan import scan_folder
from packload.loaders.read import PackReader
from packload.packer.encode import Encoded, EncodeOptions, encode_file
from packload.packer.write_shards import ShardsWriter, write_file_atomic
from tests.image_factory import write_image

SHARD = 64 << 10


@pytest.fixture(scope="module")
def items(tmp_path_factory: pytest.TempPathFactory) -> list[Encoded]:
    root = tmp_path_factory.mktemp("write-shards")
    for k in range(10):  # PNGs of tens of KB each: several shards
        write_image(root / "ab"[k % 2] / f"img{k}.png", size=(100 + 4 * k, 90), seed=k)
    scan = scan_folder(root)
    out = [encode_file(str(root), sample, EncodeOptions()) for sample in scan.samples]
    assert all(isinstance(item, Encoded) for item in out)
    return out  # type: ignore[return-value]


def manifest(items: list[Encoded]) -> dict:
    return {"format": "packload", "version": 1, "backend": "shards", "encoding": "keep", "records": len(items),
            "classes": ["a", "b"], "skipped": [], "labelled": True,
            "class_counts": {c: sum(i.label == k for i in items) for k, c in enumerate("ab")},
            "payload_bytes": sum(len(i.payload) for i in items)}


def records(pack: Path) -> list[tuple[str, int, bytes]]:
    with PackReader(pack, check_index=True) as reader:
        return [(reader.path_of(i), int(reader.entries["label"][i]), bytes(reader.payload(i, verify=True)))
                for i in range(reader.records)]


def test_shards_index_and_manifest(items: list[Encoded], tmp_path: Path) -> None:
    folder = tmp_path / "p.shards"
    folder.mkdir()
    writer = ShardsWriter(folder, SHARD)
    for item in items:
        writer.write(item)
    assert not (folder / "manifest.json").exists()  # not a pack until finished
    written = writer.finish(manifest(items))
    assert records(folder) == [(i.path, i.label, i.payload) for i in items]
    parts = written["parts"]
    assert len(parts) >= 3 and sum(p["records"] for p in parts) == len(items)
    for k, part in enumerate(parts):
        data = (folder / part["name"]).read_bytes()
        assert part["size"] == len(data) <= SHARD and part["sha256"] == hashlib.sha256(data).hexdigest()
        assert decode_shard_header(data[:16]) == (1, k)
    index = (folder / "index.bin").read_bytes()
    assert written["index"] == {"name": "index.bin", "size": len(index), "sha256": hashlib.sha256(index).hexdigest()}
    assert json.loads((folder / "manifest.json").read_text())["parts"] == parts
    assert sorted(p.name for p in folder.iterdir()) == sorted(["index.bin", "manifest.json",
                                                               *(p["name"] for p in parts)])


def test_many_at_once_writes_the_same_files(items: list[Encoded], tmp_path: Path) -> None:
    packs = {}
    for how in ("one", "many"):
        folder = tmp_path / how
        folder.mkdir()
        writer = ShardsWriter(folder, SHARD)
        if how == "one":
            for item in items:
                writer.write(item)
        else:
            writer.write_many(items[:3])
            writer.write_many(items[3:])
        writer.finish(manifest(items))
        packs[how] = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert packs["one"] == packs["many"]


def test_resume_keeps_every_intact_record_and_finishes(items: list[Encoded], tmp_path: Path) -> None:
    folder = tmp_path / "p.shards.partial"
    folder.mkdir()
    writer = ShardsWriter(folder, SHARD)
    assert ShardsWriter.resume(folder, SHARD) is None  # never checkpointed: nothing to keep
    for item in items[:7]:
        writer.write(item)
    writer.checkpoint({"next": 7})
    writer.close()  # the process dies here
    last = sorted(folder.glob("shard-*.bin"))[-1]
    os.truncate(last, last.stat().st_size - 10)  # the last record cut short
    (folder / "shard-00099.bin").write_bytes(b"stale")  # a shard past the intact ones
    resumed = ShardsWriter.resume(folder, SHARD)
    assert resumed is not None
    writer, kept, progress = resumed
    assert progress == {"next": 7} and [m.path for m in kept] == [i.path for i in items[:6]]
    assert not (folder / "shard-00099.bin").exists()
    for item in items[6:]:
        writer.write(item)
    writer.finish(manifest(items))
    assert not (folder / "progress.json").exists()
    folder.rename(tmp_path / "p.shards")  # published, as pack does
    assert records(tmp_path / "p.shards") == [(i.path, i.label, i.payload) for i in items]


def test_write_file_atomic_replaces_whole_files(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    write_file_atomic(path, b"first")
    write_file_atomic(path, b"second, longer")
    assert path.read_bytes() == b"second, longer" and [p.name for p in tmp_path.iterdir()] == ["manifest.json"]
