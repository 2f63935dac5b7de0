"""Blocks of a shards pack at a URL (``packload.loaders.remote_blocks``): each block's range and name
in the cache, fetched once (checked, its first block's shard header checked), kept mapped (the last
used), written to the cache behind and read from there by a later open; a block another process is
fetching is waited for, then read from the cache. Against moto's S3 server on 127.0.0.1."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[dev]')")
pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")

from packload.core.errors import PackFormatError  # noqa: E402
from packload.core.format import FORMAT_VERSION, SHARD_HEADER, SHARD_PART_AT  # noqa: E402
from packload.core.remote import RemoteStore  # noqa: E402
from packload.loaders import remote_blocks  # noqa: E402
from packload.loaders.read_cache import BlockCache  # noqa: E402
from packload.loaders.remote_blocks import ShardBlocks  # noqa: E402
from packload.loaders.remote_open import OpenedPack, open_pinned  # noqa: E402
from tests.remote_packs import filesystem, options, small_packs, store_with_bucket, upload  # noqa: E402

BUCKET = "bkt-blocks"  # moto keeps one store per process: a bucket of this file's own
BLOCK = 4096
VERSION_AT = SHARD_HEADER.fields["version"][1]

@pytest.fixture(scope="module")
def store():
    with store_with_bucket(BUCKET) as s:
        yield s


@pytest.fixture(scope="module")
def pack(tmp_path_factory) -> Path:
    return small_packs(tmp_path_factory.mktemp("blocks"))["shards"]


class Checks:
    """The block check (``BlockCheck``'s place): notes each fetched block it is shown."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int, int]] = []

    def __call__(self, part: int, start: int, data: Any) -> None:
        self.seen.append((part, start, len(data)))


def _opened(store, url: str, cache: BlockCache) -> tuple[RemoteStore, OpenedPack]:
    remote = RemoteStore(url, options(store))
    return remote, open_pinned(remote, cache, remote.listing(), None)


def _blocks(store, url: str, cache_dir: Path, block_size: int = BLOCK) -> tuple[ShardBlocks, Checks]:
    cache = BlockCache(cache_dir, limit=1 << 24)
    remote, opened = _opened(store, url, cache)
    checks = Checks()
    return ShardBlocks(remote, cache, opened, block_size, checks), checks


def _shard_gets(store, tmp_path: Path) -> int:
    return store.proxy.count("GET", f"/{BUCKET}/{tmp_path.name}/p.shards/shard-")


def test_each_blocks_range_and_name(store, pack, tmp_path):
    url = upload(store, pack, BUCKET, f"{tmp_path.name}/p.shards")
    blocks, _ = _blocks(store, url, tmp_path / "cache")
    size = int(blocks.opened.part_sizes[1])
    last = (size - 1) // BLOCK
    assert blocks.range(1, 0) == (0, BLOCK) and blocks.range(1, 2) == (2 * BLOCK, 3 * BLOCK)
    assert blocks.range(1, last) == (last * BLOCK, size) and size % BLOCK  # the last one shorter
    names = {blocks.identity(part, block) for part in (0, 1) for block in (0, 1)}
    larger, _ = _blocks(store, url, tmp_path / "cache", block_size=2 * BLOCK)
    names |= {larger.identity(part, block) for part in (0, 1) for block in (0, 1)}
    assert len(names) == 8  # by shard, block size and number: one block size's never served for another's


def test_a_block_is_fetched_checked_and_kept_then_read_from_the_cache(store, pack, tmp_path):
    url = upload(store, pack, BUCKET, f"{tmp_path.name}/p.shards")
    shard = (pack / "shard-00001.bin").read_bytes()
    blocks, checks = _blocks(store, url, tmp_path / "cache")
    assert blocks.cached(1, 2) is None and not blocks.mapped((1, 2)) and not blocks.in_cache((1, 2))
    before = _shard_gets(store, tmp_path)
    assert bytes(blocks.get((1, 2))) == shard[2 * BLOCK : 3 * BLOCK]
    assert checks.seen == [(1, 2 * BLOCK, BLOCK)] and blocks.mapped((1, 2))
    assert bytes(blocks.get((1, 2))) == shard[2 * BLOCK : 3 * BLOCK]  # from memory
    assert _shard_gets(store, tmp_path) - before == 1
    blocks.close()  # waits for the write behind
    assert blocks.in_cache((1, 2)) and not blocks.mapped((1, 2))
    assert not list((tmp_path / "cache").rglob("*.fetching"))  # its lock let go
    again, checks = _blocks(store, url, tmp_path / "cache")  # a later open, the same cache folder
    assert bytes(again.get((1, 2))) == shard[2 * BLOCK : 3 * BLOCK]
    assert _shard_gets(store, tmp_path) - before == 1 and checks.seen == []  # read from the disk, not fetched


def _fetch_in_another_process(cache_dir: Path, pack: str, identity: str, data: bytes) -> tuple[int, int, int]:
    """Another process fetching a block: holds the block's lock in the cache, says so on a pipe, and
    once told on another puts ``data`` in the cache as the block, then lets go of the lock. (pid,
    the pipe it speaks on, the pipe it listens on)."""
    said, say = os.pipe()
    hear, told = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            cache = BlockCache(cache_dir, limit=1 << 24)
            with cache.fetching(pack, identity):
                os.write(say, b"holding")
                os.read(hear, 1)  # a byte, or the end of the pipe when the test failed first
                code = 0 if cache.put(pack, identity, data) else 2
        finally:
            os._exit(code)
    os.close(say)
    os.close(hear)
    return pid, said, told


def test_a_block_another_process_is_fetching_is_waited_for_then_read_from_the_cache(store, pack, tmp_path):
    url = upload(store, pack, BUCKET, f"{tmp_path.name}/p.shards")
    blocks, checks = _blocks(store, url, tmp_path / "cache")
    start, stop = blocks.range(0, 1)
    data = (pack / "shard-00000.bin").read_bytes()[start:stop]
    pid, said, told = _fetch_in_another_process(tmp_path / "cache", blocks.opened.key, blocks.identity(0, 1), data)
    try:
        assert os.read(said, 7) == b"holding"
        fetching = blocks.cache.fetching

        def about_to_wait(pack_key: str, identity: str):  # our get is past its first look at the cache
            lock = fetching(pack_key, identity)
            os.write(told, b"1")
            return lock

        blocks.cache.fetching = about_to_wait
        before = _shard_gets(store, tmp_path)
        assert bytes(blocks.get((0, 1))) == data
    finally:
        os.close(told)  # on any failure here too: the other process goes on and ends
        os.close(said)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _shard_gets(store, tmp_path) == before and checks.seen == []  # its bytes, never fetched twice


def _header_changed(pack: Path, at: int, value: int) -> bytes:
    """Shard 1 of ``pack`` with the header's 4-byte field at ``at`` set to ``value``."""
    data = bytearray((pack / "shard-00001.bin").read_bytes())
    data[at : at + 4] = np.uint32(value).tobytes()
    return bytes(data)


@pytest.mark.parametrize(("at", "value", "says"), [
    (SHARD_PART_AT, 0, "not shard 1 of this pack; the pack is damaged"),
    (VERSION_AT, FORMAT_VERSION + 1, f"shard format version {FORMAT_VERSION + 1}, this packload reads version "
                                     f"{FORMAT_VERSION}; upgrade packload or re-pack"),
], ids=["another shard's header", "another format version"])
def test_the_first_block_of_a_shard_names_its_shard(store, pack, tmp_path, at, value, says):
    """Fetched or found in the cache, block 0 must carry the header of this shard of this format."""
    url = upload(store, pack, BUCKET, f"{tmp_path.name}/p.shards")
    damaged = _header_changed(pack, at, value)
    filesystem(store).pipe_file(f"{BUCKET}/{tmp_path.name}/p.shards/shard-00001.bin", damaged)
    blocks, _ = _blocks(store, url, tmp_path / "fetched")
    with pytest.raises(PackFormatError) as info:
        blocks.get((1, 0))
    assert str(info.value) == f"{url}/shard-00001.bin: {says}"
    upload(store, pack, BUCKET, f"{tmp_path.name}/p.shards", replace=True)  # the store's is whole again
    blocks, _ = _blocks(store, url, tmp_path / "cached")
    start, stop = blocks.range(1, 0)
    assert blocks.cache.put(blocks.opened.key, blocks.identity(1, 0), damaged[start:stop])
    with pytest.raises(PackFormatError) as info:
        blocks.cached(1, 0)
    assert str(info.value) == f"{url}/shard-00001.bin: {says}"


def test_only_the_blocks_used_last_stay_mapped(store, pack, tmp_path, monkeypatch):
    monkeypatch.setattr(remote_blocks, "BLOCKS_MAPPED", 2)
    url = upload(store, pack, BUCKET, f"{tmp_path.name}/p.shards")
    blocks, _ = _blocks(store, url, tmp_path / "cache")
    blocks.get((0, 1))
    blocks.get((0, 2))
    blocks.cached(0, 1)  # used again: the newest
    blocks.get((0, 3))
    assert [blocks.mapped((0, b)) for b in (1, 2, 3)] == [True, False, True]


def test_a_forked_copy_shares_the_pack_and_nothing_else(store, pack, tmp_path):
    url = upload(store, pack, BUCKET, f"{tmp_path.name}/p.shards")
    blocks, checks = _blocks(store, url, tmp_path / "cache")
    blocks.get((0, 1))
    store_now, cache_now = RemoteStore(url, options(store)), BlockCache(tmp_path / "cache")
    copy = blocks.forked(store_now, cache_now)
    assert copy.store is store_now and copy.cache is cache_now
    assert copy.opened is blocks.opened and copy.block_size == BLOCK and copy.check is checks
    assert not copy.mapped((0, 1)) and blocks.mapped((0, 1))
    blocks.close()
