"""The LMDB writer (``packload.packer.write_lmdb``): records in chunks of at most ``chunk_size``
bytes (a larger record alone in its chunk), index and manifest stored last in one transaction; the
same file record by record and many at once; a map that grows; resuming from a checkpoint with
every intact chunk kept. A large index or fields part is put as zeros and written in place: the same
values as a plain put, without a second whole copy in memory, and a pack killed between the two is
unfinished and resumes."""

from __future__ import annotations

import csv
import hashlib
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import lmdb
import pytest

from packload import PackedImageFolder, pack
from packload.core.errors import IncompletePackError
from packload.core.format import (
    LMDB_FIELDS_KEY,
    LMDB_INDEX_KEY,
    LMDB_MANIFEST_KEY,
    PROGRESS_KEY,
    decode_record_header,
    lmdb_chunk_key,
)
from packload.core.scan import scan_folder
from packload.loaders.read import PackReader
from packload.loaders.verify import verify
from packload.packer import write_lmdb
from packload.packer.encode import Encoded, EncodeOptions, encode_file
from packload.packer.write_lmdb import LmdbWriter
from packload.packer.write_shards import FieldsPart
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


# -- large values: put as zeros, then written in place --------------------------------------------------

SMALL_RESERVE = 4096  # above the largest value LMDB keeps on a leaf page of 4 KiB: these go on overflow pages


def fake_fields(pieces: list[bytes]) -> FieldsPart:
    """A fields part of ``pieces`` (the writer stores whatever it is handed), and its manifest entry."""
    def part(write: Any) -> dict:
        for piece in pieces:
            write(piece)
        data = b"".join(pieces)
        return {"name": LMDB_FIELDS_KEY.decode(), "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                "columns": []}
    return part


def count_fills(monkeypatch: pytest.MonkeyPatch, fail_at: int | None = None) -> list[bytes]:
    """The keys ``LmdbWriter._fill`` is called for; the call number ``fail_at`` is interrupted instead."""
    original, keys = LmdbWriter._fill, []

    def fill(self: LmdbWriter, key: bytes, source: int, size: int) -> None:
        keys.append(key)
        if len(keys) == fail_at:
            raise KeyboardInterrupt
        original(self, key, source, size)
    monkeypatch.setattr(LmdbWriter, "_fill", fill)
    return keys


def test_large_values_written_in_place_are_the_values_put(items: list[Encoded], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    many = [replace(items[k % len(items)], path=f"{'ab'[k % 2]}/many-{k:04d}.png") for k in range(80)]
    pieces = [bytes(range(256)) * 9, b"", b"\x01" * 7000, b"tail"]
    stored = {}
    for how, reserve in (("put", 1 << 40), ("in place", SMALL_RESERVE)):
        monkeypatch.setattr(write_lmdb, "RESERVE_BYTES", reserve)
        fills = count_fills(monkeypatch)
        path = tmp_path / f"{how}.lmdb"
        writer = LmdbWriter(path, 1 << 26, CHUNK)
        writer.write_many(many)
        written = writer.finish(manifest(many), fake_fields(pieces))
        assert fills == ([] if how == "put" else [LMDB_INDEX_KEY, LMDB_FIELDS_KEY])
        assert written["index"]["size"] > SMALL_RESERVE and written["fields"]["size"] > SMALL_RESERVE
        assert records(path) == [(i.path, i.label, i.payload) for i in many]  # the index's sha256 checked
        stored[how] = values(path)
        assert PROGRESS_KEY not in stored[how] and not list(tmp_path.glob(".packload-value-*"))
    assert stored["in place"][LMDB_FIELDS_KEY] == b"".join(pieces)
    assert stored["in place"] == stored["put"]


# The writer of a large pack's index, in a process of its own: its resident memory before ``finish``
# against its peak during it (the peak reset first: ``/proc/self/clear_refs``), printed with the
# index's size. ARGS: the folder of one image, the LMDB file to write, the records.
FINISH_CHILD = """
import gc, sys
from dataclasses import replace
from pathlib import Path
from packload.core.scan import scan_folder
from packload.packer.encode import EncodeOptions, encode_file
from packload.packer.write_lmdb import LmdbWriter

root, count = Path(sys.argv[1]), int(sys.argv[3])
[sample] = scan_folder(root).samples
item = encode_file(str(root), sample, EncodeOptions())
writer = LmdbWriter(Path(sys.argv[2]), 1 << 30)
for start in range(0, count, 4096):
    writer.write_many([replace(item, path=f"a/{k:09d}.png") for k in range(start, min(count, start + 4096))])

def fields(write):
    for k in range(8):
        write(bytes([k]) * (1 << 20))
    return {}

def status(name):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(name + ":"))

gc.collect()
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
except OSError:
    sys.exit(3)
before = status("VmRSS")
index = writer.finish({}, fields)["index"]["size"]
print(status("VmHWM") - before, index)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the peak memory from /proc")
def test_finishing_holds_one_copy_of_the_index(tmp_path: Path) -> None:
    """LMDB copies a value into pages of its own: the index (and the fields part) must not be in the
    writer's memory as well, or finishing a pack of a million files takes 75 MB more at its peak."""
    write_image(tmp_path / "src" / "a" / "one.png", size=(4, 4))
    done = subprocess.run([sys.executable, "-c", FINISH_CHILD, str(tmp_path / "src"), str(tmp_path / "p.lmdb"),
                           "200000"], capture_output=True, text=True)
    if done.returncode == 3:
        pytest.skip("the kernel does not let a process reset its peak memory")
    assert done.returncode == 0, done.stderr
    grown, index = map(int, done.stdout.split())
    assert index > 15_000_000
    assert grown < index // 2, f"finishing took {grown:,} bytes more than before it, for an index of {index:,}"


@pytest.fixture(scope="module")
def table_source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """60 images in a flat folder and a table of them (class, score, caption), its index and fields
    part past ``SMALL_RESERVE``."""
    base = tmp_path_factory.mktemp("lmdb-table")
    with open(base / "labels.csv", "w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["path", "label", "score", "caption"])
        for k in range(60):
            write_image(base / "images" / f"img{k:02d}.png", size=(6 + k % 3, 5), seed=k)
            rows.writerow([f"img{k:02d}.png", "cat" if k % 3 else "dog", k / 4, f"picture {k} " + "of a thing " * 6])
    return base / "images", base / "labels.csv"


def test_a_pack_killed_between_reserving_and_writing_resumes(table_source: tuple[Path, Path], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    images, table = table_source
    reference = tmp_path / "ref.lmdb"
    pack(images, reference, labels=table, workers=1, progress=False)  # each value put whole
    monkeypatch.setattr(write_lmdb, "RESERVE_BYTES", SMALL_RESERVE)
    fills = count_fills(monkeypatch, fail_at=2)  # the index written in place; the fields part reserved, not written
    dst = tmp_path / "p.lmdb"
    with pytest.raises(KeyboardInterrupt):
        pack(images, dst, labels=table, workers=1, progress=False)
    partial = tmp_path / "p.lmdb.partial"
    assert fills == [LMDB_INDEX_KEY, LMDB_FIELDS_KEY] and not dst.exists()
    assert values(partial)[LMDB_FIELDS_KEY] == bytes(len(values(reference)[LMDB_FIELDS_KEY]))  # zeros, as put
    with pytest.raises(IncompletePackError, match="did not finish"):
        PackReader(partial)
    fills = count_fills(monkeypatch)
    pack(images, dst, labels=table, workers=1, progress=False, resume=True)
    assert fills == [LMDB_INDEX_KEY, LMDB_FIELDS_KEY]
    got, want = values(dst), values(reference)
    assert got.keys() == want.keys() and PROGRESS_KEY not in got
    assert all(got[key] == want[key] for key in got if key != LMDB_MANIFEST_KEY)
    assert verify(dst, progress=False)["ok"]
    ds, ref = PackedImageFolder(dst), PackedImageFolder(reference)
    assert ds.field("caption").tolist() == ref.field("caption").tolist()
    assert ds.field("score").tolist() == [k / 4 for k in range(60)]
