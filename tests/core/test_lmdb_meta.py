"""LMDB's meta pages (``packload.core.lmdb_meta``), read from real LMDB files the test writes and from
damaged copies of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from packload.core.errors import PackFormatError
from packload.core.lmdb_meta import MAGIC, META_END, P_INVALID, current_meta, starts_as_lmdb
from tests.lmdb_files import lmdb_file


def test_the_newer_meta_of_a_real_file(tmp_path: Path) -> None:
    data = lmdb_file(tmp_path / "db", {b"a": b"1" * 10, b"b": b"2" * 5000})
    assert starts_as_lmdb(data[:META_END]) and not starts_as_lmdb(b"\0" * META_END)
    meta = current_meta(data, "db")
    assert meta.entries == 2 and meta.root != P_INVALID and meta.depth >= 1 and meta.txnid >= 1
    assert meta.page_size in (4096, 8192, 16384, 65536)


def test_an_empty_database(tmp_path: Path) -> None:
    meta = current_meta(lmdb_file(tmp_path / "empty", {}), "empty")
    assert meta.entries == 0 and meta.root == P_INVALID


def test_damaged_metas_are_refused(tmp_path: Path) -> None:
    data = bytearray(lmdb_file(tmp_path / "db", {b"k": b"v"}))
    with pytest.raises(PackFormatError, match="too short"):
        current_meta(bytes(data[:100]), "short")
    foreign = bytearray(data)
    foreign[16:20] = (MAGIC ^ 1).to_bytes(4, "little")
    with pytest.raises(PackFormatError, match="not an LMDB file"):
        current_meta(bytes(foreign), "foreign")
    odd = bytearray(data)
    odd[40:44] = (5000).to_bytes(4, "little")  # the free database's pad (after magic, version, address, mapsize)
    with pytest.raises(PackFormatError, match="page size 5000"):
        current_meta(bytes(odd), "odd")
