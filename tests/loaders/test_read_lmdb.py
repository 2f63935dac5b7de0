"""The LMDB backend of ``PackReader`` (``packload.loaders.read_lmdb``): every value found through the
file's own B-tree (never the LMDB library) and equal to what LMDB stores, each chunk checked to hold
what the index puts in it, and unfinished, foreign or damaged files refused."""

from __future__ import annotations

from pathlib import Path

import lmdb
import pytest

from packload.core.errors import IncompletePackError, PackFormatError, UsageError
from packload.core.format import LMDB_MANIFEST_KEY, PROGRESS_KEY, lmdb_chunk_key
from packload.loaders import read_lmdb
from packload.loaders.read import PackReader
from tests.reliability.crafted import copy_pack, rewrite
from tests.reliability.packs import make_source, pack_small, records_of


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("read-lmdb")
    pack_small(make_source(root / "src", per_class=4, big=2), root / "p.lmdb")  # several 16 KiB chunks
    return root / "p.lmdb"


def _edit(path: Path, put: dict[bytes, bytes] | None = None, delete: tuple[bytes, ...] = ()) -> None:
    env = lmdb.open(str(path), subdir=False, lock=False, map_size=1 << 26)
    try:
        with env.begin(write=True) as txn:
            for key, value in (put or {}).items():
                txn.put(key, value)
            for key in delete:
                txn.delete(key)
    finally:
        env.close()


def test_values_are_what_lmdb_stores(pack: Path) -> None:
    env = lmdb.open(str(pack), subdir=False, readonly=True, lock=False)
    try:
        with env.begin() as txn, PackReader(pack) as reader:
            chunks = reader.manifest["parts"]["chunks"]
            assert chunks >= 3 and reader.part_names == []
            for part in range(chunks):
                assert bytes(reader.part_view(part)) == txn.get(lmdb_chunk_key(part))
            assert reader.index_bytes() == txn.get(b"#index")
    finally:
        env.close()


def test_a_missing_chunk_is_named_when_it_is_needed(pack: Path, tmp_path: Path) -> None:
    copy = copy_pack(pack, tmp_path / "c.lmdb")
    _edit(copy, delete=(lmdb_chunk_key(1),))
    with PackReader(copy) as reader:
        assert bytes(reader.payload(0)) == records_of(pack)[0][2]  # chunk 0 is there
        later = next(i for i in range(reader.records) if int(reader.entries["part"][i]) == 1)
        with pytest.raises(PackFormatError, match="chunk 1 is missing"):
            reader.payload(later)


def test_a_chunk_shorter_than_its_records_is_refused(pack: Path, tmp_path: Path) -> None:
    copy = copy_pack(pack, tmp_path / "short.lmdb")
    env = lmdb.open(str(copy), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        chunk = bytes(txn.get(lmdb_chunk_key(0)))
    env.close()
    _edit(copy, put={lmdb_chunk_key(0): chunk[: len(chunk) // 2]})
    with PackReader(copy) as reader:
        with pytest.raises(PackFormatError, match="points past the end of chunk 0"):
            reader.payload(0)


def test_unfinished_foreign_and_other_files_are_refused(pack: Path, tmp_path: Path) -> None:
    copy = copy_pack(pack, tmp_path / "u.lmdb")
    _edit(copy, put={PROGRESS_KEY: b"{}"}, delete=(LMDB_MANIFEST_KEY,))
    with pytest.raises(IncompletePackError, match="did not finish"):
        PackReader(copy)
    other = tmp_path / "mine.lmdb"
    _edit(other, put={b"key": b"value"})  # someone's own database
    with pytest.raises(IncompletePackError, match="not a finished packload pack"):
        PackReader(other)
    (tmp_path / "text.lmdb").write_text("not lmdb at all" * 10)
    with pytest.raises(UsageError, match="not an LMDB file"):
        PackReader(tmp_path / "text.lmdb")
    copy = copy_pack(pack, tmp_path / "b.lmdb")
    with PackReader(copy) as reader:
        manifest = dict(reader.manifest)
    rewrite(copy, manifest=dict(manifest, backend="shards"))
    with pytest.raises(PackFormatError, match=r"b\.lmdb: manifest"):  # a shards manifest in an LMDB file
        PackReader(copy)


def test_a_manifest_larger_than_the_limit_is_refused_unread(pack: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(read_lmdb, "MANIFEST_LIMIT", 100)
    with pytest.raises(PackFormatError, match="more than the 100 a packload manifest may take"):
        PackReader(pack)
