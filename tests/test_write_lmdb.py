"""The LMDB writer (``packload.packer.write_lmdb``): records in chunks of at most ``chunk_size``
bytes (a larger record alone in its chunk), index and manifest stored last in one transaction; the
same file record by record and many at once; a map that grows; resuming from a checkpoint with
every intact chunk kept."""

from __future__ import annotations

from pathlib import Path

import lmdb
import pytest

from packload.core.format import (
    LMDB_INDEX_KEY,
    LMDB_MANIFEST_KEY,
    PROGRESS_KEY,
    decode_record_header,
    lmdb_chunk_key,
)
from packload.core.scan import scan_folder
from packload.loaders.read import PackReader
from packload.packer.encode import Encoded, EncodeOptions, encode_file
from packload.packer.write_lmdb import LmdbWriter
from tests.image_factory import write_image

CHUNK = 64 << 10


@pytest.fixture(scope="module")
def items(tmp_path_factory: pytest.TempPathFactory) -> list[Encoded]:
    root = tmp_path_factory.mktemp("write-lmdb")
    for k in range(10):
        write_image(root / "ab"[k % 2] / f"img{k}.png", size=(100 + 4 * k, 90), seed=k)
    write_image(root / "b" / "large.png", size=(300, 300), seed=99)  # larger than a chunk
    out = [encode_file(str(root), sample, EncodeOptions()) for sample in scan_folder(root).samples]
    assert all(isinstance(item, Encoded) for item in out)
    return out  # type: ignore[return-value]


def manifest(items: list[Encoded]) -> dict:
    return {"format": "packload", "version": 1, "backend": "lmdb", "encoding": "keep", "records": len(items),
            "classes": ["a", "b"], "skipped": [], "labelled": True,
            "class_counts": {c: sum(i.label == k for i in items) for k, c in enumerate("ab")},
            "payload_bytes": sum(len(i.payload) for i in items)}


def values(path: Path) -> dict[bytes, bytes]:
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return {bytes(k): bytes(v) for k, v in txn.cursor()}
    finally:
        env.close()


def records(pack: Path) -> list[tuple[str, int, bytes]]:
    with PackReader(pack, check_index=True) as reader:
        return [(reader.path_of(i), int(reader.entries["label"][i]), bytes(reader.payload(i, verify=True)))
                for i in range(reader.records)]


def test_chunks_index_and_manifest(items: list[Encoded], tmp_path: Path) -> None:
    path = tmp_path / "p.lmdb"
    writer = LmdbWriter(path, 64 << 10, CHUNK)  # a map far smaller than the data: it grows
    for item in items:
        writer.write(item)
    written = writer.finish(manifest(items))
    assert not Path(str(path) + "-lock").exists()
    assert records(path) == [(i.path, i.label, i.payload) for i in items]
    stored = values(path)
    chunks = written["parts"]["chunks"]
    assert written["parts"]["chunk_size"] == CHUNK and chunks >= 3
    assert set(stored) == {LMDB_INDEX_KEY, LMDB_MANIFEST_KEY, *(lmdb_chunk_key(p) for p in range(chunks))}
    number = 0
    for part in range(chunks):
        chunk, offset, in_chunk = stored[lmdb_chunk_key(part)], 0, 0
        while offset < len(chunk):  # whole records, numbered in order
            meta, start, length, _ = decode_record_header(chunk, offset)
            assert meta.record == number and meta.path == items[number].path
            offset, number, in_chunk = start + length, number + 1, in_chunk + 1
        assert len(chunk) <= CHUNK or in_chunk == 1
    assert number == len(items)


def test_many_at_once_stores_the_same_values(items: list[Encoded], tmp_path: Path) -> None:
    stored = {}
    for how in ("one", "many"):
        writer = LmdbWriter(tmp_path / f"{how}.lmdb", 1 << 26, CHUNK)
        if how == "one":
            for item in items:
                writer.write(item)
        else:
            writer.write_many(items[:4])
            writer.write_many(items[4:])
        writer.finish(manifest(items))
        stored[how] = values(tmp_path / f"{how}.lmdb")
    assert stored["one"].keys() == stored["many"].keys()
    assert {k: v for k, v in stored["one"].items() if k != LMDB_MANIFEST_KEY} == {
        k: v for k, v in stored["many"].items() if k != LMDB_MANIFEST_KEY}


def test_resume_keeps_every_intact_chunk_and_finishes(items: list[Encoded], tmp_path: Path) -> None:
    path = tmp_path / "p.lmdb"
    writer = LmdbWriter(path, 1 << 26, CHUNK)
    for item in items[:7]:
        writer.write(item)
    writer.close()  # killed before any checkpoint
    assert LmdbWriter.resume(path, 1 << 26) is None
    path.unlink()
    writer = LmdbWriter(path, 1 << 26, CHUNK)
    for item in items[:7]:
        writer.write(item)
    writer.checkpoint({"next": 7})
    writer.close()  # killed after the checkpoint
    assert PROGRESS_KEY in values(path) and LMDB_MANIFEST_KEY not in values(path)
    resumed = LmdbWriter.resume(path, 1 << 26)
    assert resumed is not None
    writer, kept, progress = resumed
    assert progress == {"next": 7} and [m.path for m in kept] == [i.path for i in items[:7]]
    for item in items[7:]:
        writer.write(item)
    writer.finish(manifest(items))
    assert PROGRESS_KEY not in values(path)
    assert records(path) == [(i.path, i.label, i.payload) for i in items]
