"""The bounded cache folder of fetched blocks (``loaders.read_cache``)."""

from __future__ import annotations

import os
import time

import pytest

from packload.loaders.read_cache import BlockCache, default_cache_dir


def _used(folder):
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_put_and_get_round_trip(tmp_path):
    cache = BlockCache(tmp_path, limit=1000)
    path = cache.put("pack-a", "shard-00000.bin.0", b"x" * 300)
    assert path is not None and path.read_bytes() == b"x" * 300
    assert cache.get("pack-a", "shard-00000.bin.0", 300) == path
    assert cache.get("pack-a", "shard-00000.bin.0", 299) is None  # a file of the wrong size is not a hit
    assert cache.get("pack-a", "shard-00000.bin.1", 300) is None


def test_the_least_recently_used_go_first_and_the_limit_holds(tmp_path):
    cache = BlockCache(tmp_path, limit=1000)
    for k in range(3):
        cache.put("p", f"b{k}", bytes([k]) * 300)
        os.utime(tmp_path / "p" / f"b{k}", (time.time() - 100 + k, time.time() - 100 + k))
    cache.get("p", "b0", 300)  # used again: now the newest
    cache.put("p", "b3", b"z" * 300)
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["b0", "b2", "b3"]
    for k in range(4, 20):
        cache.put("q", f"b{k}", b"y" * (100 + 37 * k))
        assert _used(tmp_path) <= 1000
    assert cache.used() == _used(tmp_path)


def test_a_block_larger_than_the_limit_is_not_kept(tmp_path):
    cache = BlockCache(tmp_path, limit=100)
    assert cache.put("p", "big", b"x" * 101) is None
    assert _used(tmp_path) == 0
    with pytest.raises(OSError, match="do not fit"):
        cache.reserve("p", "big.lmdb", 101)


def test_reserve_counts_before_it_is_written(tmp_path):
    cache = BlockCache(tmp_path, limit=1000)
    cache.put("p", "old", b"o" * 600)
    tmp = cache.reserve("p", "pack.lmdb", 700)
    assert tmp.stat().st_size == 700 and not (tmp_path / "p" / "old").exists()
    assert cache.used() <= 1000


def test_unwritable_folder_keeps_nothing(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    assert BlockCache(blocker / "cache", limit=1000).put("p", "b", b"x") is None


def test_limits_and_default_folder(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="cache_limit"):
        BlockCache(tmp_path, limit=-1)
    monkeypatch.setenv("PACKLOAD_CACHE", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("PACKLOAD_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert default_cache_dir() == tmp_path / "x" / "packload"
