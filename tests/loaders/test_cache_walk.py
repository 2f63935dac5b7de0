"""The walk over the block cache (``packload.loaders.cache_walk``): what it counts as an entry (its
bytes and record, by last use), the unfinished writes it counts and those it may delete (a process
gone, the write old), and the deletions, least recently used first, down to a target."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from packload.loaders.cache_walk import STALE_SECONDS, delete_oldest, recorded_entries, writing_bytes
from packload.loaders.read_cache import DATA_SUFFIX, RECORD_SUFFIX, BlockCache, entry_name, pack_folder_name

P = pack_folder_name("pack", "a manifest")
Q = pack_folder_name("pack", "another manifest")
OLD = time.time() - 100_000  # an hour-old write is older than STALE_SECONDS


@pytest.fixture
def cache(tmp_path: Path) -> BlockCache:
    return BlockCache(tmp_path, limit=1 << 20)


@pytest.fixture(scope="module")
def gone_pid() -> int:
    """The id of a process that has exited."""
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def _file(cache: BlockCache, pack: str, name: str, suffix: str) -> Path:
    return cache.folder / pack / (name + suffix)


def _entry(cache: BlockCache, pack: str, identity: str, size: int, used: float) -> tuple[float, str, str, int]:
    """Put entry ``identity`` of ``size`` bytes, last used at ``used``; what the walk should find of it."""
    assert cache.put(pack, identity, bytes([size % 251]) * size)
    name = entry_name(identity)
    os.utime(_file(cache, pack, name, DATA_SUFFIX), (used, used))
    return (used, pack, name, size + _file(cache, pack, name, RECORD_SUFFIX).stat().st_size)


def _unfinished(cache: BlockCache, pack: str, identity: str, suffix: str, pid: int, size: int, at: float) -> str:
    """A temporary file of ``pid``'s write of ``identity``, last written at ``at``."""
    assert cache.place.pack_fd(pack, create=True) is not None
    item = f"{entry_name(identity)}{suffix}.tmp-{pid}-1"
    path = cache.folder / pack / item
    path.write_bytes(b"t" * size)
    os.utime(path, (at, at))
    return item


def test_every_recorded_entry_is_found_by_its_last_use_and_bytes(cache):
    now = time.time()
    expected = [_entry(cache, P, "a", 1000, now - 30), _entry(cache, P, "b", 300, now - 20),
                _entry(cache, Q, "c", 50, now - 10)]
    assert sorted(recorded_entries(cache.place)) == sorted(expected)
    assert writing_bytes(cache.place) == 0


def test_what_the_cache_did_not_record_is_not_an_entry(cache, tmp_path):
    now = time.time()
    kept = _entry(cache, P, "kept", 100, now)
    _entry(cache, P, "linked", 100, now)
    linked = _file(cache, P, entry_name("linked"), DATA_SUFFIX)
    (tmp_path / "victim").write_bytes(b"v" * 100)
    linked.unlink()
    linked.symlink_to(tmp_path / "victim")  # its record is there: the link is still no entry's bytes
    _file(cache, P, "0" * 40, DATA_SUFFIX).write_bytes(b"x" * 100)  # bytes without a record
    _file(cache, P, "1" * 40, RECORD_SUFFIX).write_bytes(b"{}")  # a record not ours
    (cache.folder / P / "notes.txt").write_bytes(b"mine")
    for folder in ("mine", "pack-" + "0" * 31):  # folders of names the cache does not give
        (cache.folder / folder).mkdir()
        for suffix in (DATA_SUFFIX, RECORD_SUFFIX):
            (cache.folder / folder / (entry_name("kept") + suffix)).write_bytes(
                _file(cache, P, entry_name("kept"), suffix).read_bytes())
    assert recorded_entries(cache.place) == [kept]


def test_a_record_whose_bytes_never_came_is_an_entry_to_delete_first(cache):
    """The writer died between putting its record and its bytes in place: the record is counted,
    oldest of all, so the next walk that needs room deletes it."""
    newest = _entry(cache, P, "whole", 100, time.time())
    _entry(cache, P, "half", 100, time.time())
    name = entry_name("half")
    _file(cache, P, name, DATA_SUFFIX).unlink()
    record = _file(cache, P, name, RECORD_SUFFIX).stat().st_size
    assert sorted(recorded_entries(cache.place)) == [(0.0, P, name, record), newest]
    assert delete_oldest(cache.place, recorded_entries(cache.place), 1000, 1000 - record) == 1000 - record
    assert not _file(cache, P, name, RECORD_SUFFIX).exists() and recorded_entries(cache.place) == [newest]


def test_unfinished_writes_are_counted_and_only_the_abandoned_listed(cache, gone_pid):
    """A write under way (its process alive, or its file written recently) takes room that a walk
    counts and never deletes; one of a process that is gone, untouched for ``STALE_SECONDS``, is
    listed (to be deleted first). Only the bytes' temporary files take room."""
    recent = time.time() - STALE_SECONDS / 2
    abandoned = _unfinished(cache, P, "a", DATA_SUFFIX, gone_pid, 700, OLD)
    _unfinished(cache, P, "b", DATA_SUFFIX, gone_pid, 300, recent)  # its process gone, but lately written
    _unfinished(cache, Q, "c", DATA_SUFFIX, os.getpid(), 200, OLD)  # old, but its process is alive
    _unfinished(cache, Q, "d", RECORD_SUFFIX, os.getpid(), 40, recent)  # a record being written
    abandoned_record = _unfinished(cache, Q, "e", RECORD_SUFFIX, gone_pid, 60, OLD)
    assert sorted(recorded_entries(cache.place)) == sorted([(0.0, P, abandoned, 700), (0.0, Q, abandoned_record, 60)])
    assert writing_bytes(cache.place) == 300 + 200


def test_the_least_recently_used_are_deleted_down_to_the_target(cache, gone_pid):
    now = time.time()
    entries = [_entry(cache, P, "newest", 400, now), _entry(cache, Q, "oldest", 400, now - 300),
               _entry(cache, P, "middle", 400, now - 200)]
    item = _unfinished(cache, P, "dead", DATA_SUFFIX, gone_pid, 100, OLD)
    entries.append((0.0, P, item, 100))
    total = sum(e[3] for e in entries)
    one = entries[1][3]  # the oldest entry's bytes and record
    assert delete_oldest(cache.place, entries, total, total) == total  # at the target: nothing goes
    assert len(recorded_entries(cache.place)) == 4
    left = delete_oldest(cache.place, entries, total, total - 101)  # the abandoned write, then the oldest
    assert left == total - 100 - one
    assert not (cache.folder / P / item).exists()
    assert [cache.has(Q, "oldest", 400), cache.has(P, "middle", 400), cache.has(P, "newest", 400)] == [False, True, True]
    for suffix in (DATA_SUFFIX, RECORD_SUFFIX):
        assert not _file(cache, Q, entry_name("oldest"), suffix).exists()  # its record goes with its bytes


def test_an_entry_gone_meanwhile_counts_as_deleted_and_one_out_of_reach_does_not(cache):
    now = time.time()
    first = _entry(cache, P, "first", 400, now - 10)
    second = _entry(cache, P, "second", 400, now)
    for suffix in (DATA_SUFFIX, RECORD_SUFFIX):  # deleted by another process after the walk listed it
        _file(cache, P, first[2], suffix).unlink()
    assert delete_oldest(cache.place, [first, second], 1000, 1000 - first[3]) == 1000 - first[3]
    assert cache.has(P, "second", 400)
    elsewhere = (0.0, pack_folder_name("pack", "a folder not there"), "2" * 40, 300)
    assert delete_oldest(cache.place, [elsewhere], 1000, 0) == 1000  # its folder is gone: nothing freed
