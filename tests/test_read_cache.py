"""The bounded cache folder of fetched blocks (``loaders.read_cache``)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from packload.core.errors import UsageError
from packload.loaders.read_cache import DEFAULT_CACHE_LIMIT, LOCK_NAME, BlockCache, default_cache_dir


def _used(folder):
    """Bytes of the cached files (the lock file aside: a few bytes, the cache's record of its size)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and p.name != LOCK_NAME)


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


def test_limit_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("PACKLOAD_CACHE_LIMIT", raising=False)
    assert BlockCache(tmp_path).limit == DEFAULT_CACHE_LIMIT
    monkeypatch.setenv("PACKLOAD_CACHE_LIMIT", "500")
    cache = BlockCache(tmp_path)
    assert cache.limit == 500 and BlockCache(tmp_path, limit=900).limit == 900  # an explicit limit wins
    assert cache.put("p", "a", b"x" * 400) is not None
    assert cache.put("p", "b", b"y" * 400) is not None
    assert cache.used() <= 500 and cache.get("p", "a", 400) is None  # the older went to make room
    monkeypatch.setenv("PACKLOAD_CACHE_LIMIT", "20G")
    with pytest.raises(UsageError, match="PACKLOAD_CACHE_LIMIT='20G'") as info:
        BlockCache(tmp_path)
    assert "\n" not in str(info.value)


def test_one_fetch_lock_per_block_across_processes(tmp_path):
    """A second process asking for a block being fetched waits until the first is done."""
    cache = BlockCache(tmp_path / "cache")
    marks = tmp_path / "marks"
    with cache.fetching("p", "shard-00000.bin.0"):
        pid = os.fork()
        if pid == 0:  # the child: takes the lock only once the parent has let it go
            with cache.fetching("p", "shard-00000.bin.0"):
                with open(marks, "a") as f:
                    f.write("child\n")
            os._exit(0)
        time.sleep(0.3)  # gives the child time to be waiting (no timing is asserted)
        with open(marks, "a") as f:
            f.write("parent\n")
    os.waitpid(pid, 0)
    assert marks.read_text().split() == ["parent", "child"]
    assert not list((tmp_path / "cache" / "p").glob("*.fetching"))  # lock files do not stay behind
    assert cache.used() == 0  # and never counted as cached bytes


def _take(cache, name, marks, mark, errors):
    """Take block ``name``'s lock, note ``mark``, let it go (an error is kept in ``errors``)."""
    try:
        with cache.fetching("p", name):
            with open(marks, "a") as f:
                f.write(mark + "\n")
    except OSError as exc:
        errors.append(exc)


def test_two_processes_waiting_for_each_others_block_both_go_on(tmp_path):
    """Process A fetches block x and, on another thread, waits for block y; process B fetches y and
    waits for x. Each fetch ends on its own, so both waits end (a lock owned by the process, as
    ``lockf``'s, looks like a deadlock to the kernel, which fails one wait: then a block is fetched twice)."""
    cache = BlockCache(tmp_path / "cache")
    marks = tmp_path / "marks"
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # process B
        code = 1
        try:
            os.close(ready_r)
            errors: list[OSError] = []
            with cache.fetching("p", "y"):
                os.write(ready_w, b"1")
                waiter = threading.Thread(target=_take, args=(cache, "x", marks, "B-got-x", errors))
                waiter.start()
                time.sleep(0.3)  # A's waiter asks for y meanwhile (ordering only: no timing is asserted)
            waiter.join()
            code = 0 if not errors else 2
        finally:
            os._exit(code)
    os.close(ready_w)
    errors: list[OSError] = []
    with cache.fetching("p", "x"):
        os.read(ready_r, 1)  # B holds y now
        waiter = threading.Thread(target=_take, args=(cache, "y", marks, "A-got-y", errors))
        waiter.start()
        time.sleep(0.3)
    waiter.join()
    _, status = os.waitpid(pid, 0)
    assert errors == [] and os.waitstatus_to_exitcode(status) == 0
    assert sorted(marks.read_text().split()) == ["A-got-y", "B-got-x"]


def test_a_lock_let_go_is_free_though_a_forked_process_has_its_descriptor(tmp_path):
    """A process forked while a block's lock is held (a DataLoader worker started mid-fetch) keeps a
    copy of the lock's descriptor; letting the lock go frees it all the same for the one waiting."""
    cache = BlockCache(tmp_path / "cache")
    marks = tmp_path / "marks"
    done_r, done_w = os.pipe()
    held = cache.fetching("p", "x")
    held.__enter__()
    keeper = os.fork()
    if keeper == 0:  # holds the copy of the descriptor until told to exit
        os.read(done_r, 1)
        os._exit(0)
    waiter = os.fork()
    if waiter == 0:  # already waiting on the lock file when it is let go
        with cache.fetching("p", "x"):
            with open(marks, "a") as f:
                f.write("waiter\n")
        os._exit(0)
    time.sleep(0.3)  # the waiter opens the lock file and waits (ordering only)
    held.__exit__(None, None, None)
    ended = False
    try:
        deadline = time.monotonic() + 30
        while not ended and time.monotonic() < deadline:
            ended = os.waitpid(waiter, os.WNOHANG) != (0, 0)
            time.sleep(0.05)
    finally:
        if not ended:
            os.kill(waiter, signal.SIGKILL)
            os.waitpid(waiter, 0)
        os.write(done_w, b"1")
        os.waitpid(keeper, 0)
    assert ended, "the waiter never got the lock: a forked copy of the descriptor kept it held"
    assert marks.read_text().split() == ["waiter"]


def test_a_put_that_fits_the_recorded_size_does_not_walk_the_folder(tmp_path, monkeypatch):
    """The folder's lock file records the bytes cached: a put that fits needs no listing of every
    file (a full cache holds thousands); one that does not fit walks the folder and evicts."""
    cache = BlockCache(tmp_path, limit=1000)
    walks = []
    files = BlockCache.files
    monkeypatch.setattr(BlockCache, "files", lambda self: walks.append(1) or files(self))
    cache.put("p", "a", b"a" * 300)  # nothing recorded yet: one walk
    assert len(walks) == 1
    cache.put("p", "b", b"b" * 300)
    cache.put("p", "c", b"c" * 300)
    assert len(walks) == 1 and (tmp_path / LOCK_NAME).read_text() == "900"
    cache.put("p", "d", b"d" * 300)  # does not fit: walks, evicts the oldest
    assert len(walks) == 2 and _used(tmp_path) == 900 and not (tmp_path / "p" / "a").exists()
    (tmp_path / "p" / "b").unlink()  # deleted by hand: the record is now more than the truth
    cache.put("p", "e", b"e" * 400)  # 900 + 400 recorded: walks, finds 600 + 400 fit, evicts nothing
    assert len(walks) == 3 and sorted(p.name for p in (tmp_path / "p").iterdir()) == ["c", "d", "e"]
    assert (tmp_path / LOCK_NAME).read_text() == "1000" and _used(tmp_path) == 1000
