"""The bounded cache folder of fetched blocks (``loaders.read_cache``): it owns only what it wrote.

The user's files in the cache folder (or in a shared ``PACKLOAD_CACHE``, or behind a ``cache_dir``
that is a link) are never deleted; an entry is read only when it is the bytes its record names (a
flipped byte, another block size, a planted link are misses, fetched again); nothing is followed
through a link; the folder that cannot be used says why."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from packload.core.errors import UsageError
from packload.loaders.read_cache import (
    CACHE_SUBFOLDER,
    DATA_SUFFIX,
    DEFAULT_CACHE_LIMIT,
    LOCK_NAME,
    MARKER_NAME,
    RECORD_SUFFIX,
    BlockCache,
    default_cache_dir,
    entry_name,
    pack_folder_name,
)
from tests.no_hang import within

P = pack_folder_name("pack", "a manifest")
Q = pack_folder_name("pack", "another manifest")


def _used(cache: BlockCache) -> int:
    """Bytes of the entries' files (blocks and records; the marker and lock file aside)."""
    return sum(p.stat().st_size for p in cache.folder.rglob("*") if p.is_file() and p.suffix in (DATA_SUFFIX, RECORD_SUFFIX))


def _blk(cache: BlockCache, pack: str, identity: str) -> Path:
    return cache.folder / pack / (entry_name(identity) + DATA_SUFFIX)


def _user_files(folder: Path, count: int, age: float = 10_000) -> dict[Path, bytes]:
    """``count`` files of the user's in ``folder`` (and one in a subfolder), all older than any entry."""
    files = {}
    for k in range(count):
        path = folder / ("notes" if k % 4 == 0 else "") / f"mine-{k}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"keep me %d " % k * 20)
        os.utime(path, (time.time() - age - k, time.time() - age - k))
        files[path] = path.read_bytes()
    return files


def _all_there(files: dict[Path, bytes]) -> bool:
    return all(path.is_file() and path.read_bytes() == data for path, data in files.items())


def test_put_and_read_round_trip(tmp_path):
    cache = BlockCache(tmp_path, limit=10_000)
    assert cache.put(P, "shard-00000.bin block 0", b"x" * 300)
    data = cache.read(P, "shard-00000.bin block 0", 300)
    assert data is not None and bytes(data) == b"x" * 300
    assert cache.read(P, "shard-00000.bin block 0", 299) is None  # the wrong size is not a hit
    assert cache.read(P, "shard-00000.bin block 1", 300) is None
    assert cache.read(Q, "shard-00000.bin block 0", 300) is None  # another pack's folder
    assert BlockCache(tmp_path).read(P, "shard-00000.bin block 0", 300) is not None  # another open checks it
    assert (tmp_path / CACHE_SUBFOLDER / MARKER_NAME).is_file()  # packload's folder, marked as its own


def test_a_fifo_planted_where_a_block_belongs_is_a_miss_not_a_hang(tmp_path):
    cache = BlockCache(tmp_path, limit=10_000)
    assert cache.put(P, "block", b"x" * 300)
    path = _blk(cache, P, "block")
    path.unlink()
    os.mkfifo(path)
    with within(5):
        assert cache.read(P, "block", 300) is None


def test_the_least_recently_used_go_first_and_the_limit_holds(tmp_path):
    cache = BlockCache(tmp_path, limit=2000)
    for k in range(3):
        assert cache.put(P, f"b{k}", bytes([k]) * 400)
        os.utime(_blk(cache, P, f"b{k}"), (time.time() - 100 + k, time.time() - 100 + k))
    assert BlockCache(tmp_path, limit=2000).read(P, "b0", 400) is not None  # used again (a new open): the newest
    assert cache.put(P, "b3", b"z" * 400)
    assert [cache.has(P, f"b{k}", 400) for k in range(4)] == [True, False, True, True]
    for k in range(4, 20):
        cache.put(Q, f"b{k}", b"y" * (100 + 37 * k))
        assert _used(cache) <= 2000
    assert cache.used() == _used(cache)


def test_an_entry_larger_than_the_limit_is_not_kept(tmp_path):
    cache = BlockCache(tmp_path, limit=1000)
    assert not cache.put(P, "big", b"x" * 1000)  # with its record it would not fit
    assert _used(cache) == 0
    with pytest.raises(OSError, match="do not fit"):
        cache.reserve(P, "big.lmdb", 1001)


def test_reserve_counts_before_it_is_written(tmp_path):
    cache = BlockCache(tmp_path, limit=2000)
    cache.put(P, "old", b"o" * 900)
    writing = cache.reserve(P, "pack.lmdb", 1000)
    assert os.fstat(writing.fd).st_size == 1000 and not cache.has(P, "old", 900)
    os.pwrite(writing.fd, b"l" * 1000, 0)
    writing.commit()
    assert bytes(cache.read(P, "pack.lmdb", 1000)) == b"l" * 1000
    assert cache.used() <= 2000


def test_a_block_that_writes_under_way_leave_no_room_for_is_kept_in_memory_only(tmp_path):
    """Writes under way cannot be evicted: a block that does not fit beside them is not kept (its
    bytes serve from memory), rather than the cache holding more than its limit."""
    cache = BlockCache(tmp_path, limit=2000)
    writing = cache.reserve(P, "first", 1200)  # under way, in another thread or process
    assert cache.put(P, "second", b"s" * 1000) is False and not cache.has(P, "second", 1000)
    os.pwrite(writing.fd, b"f" * 1200, 0)
    writing.commit()
    assert cache.put(P, "third", b"t" * 200) is True  # what fits still goes in
    assert cache.used() <= 2000 and bytes(cache.read(P, "first", 1200)) == b"f" * 1200


def test_commits_and_walks_never_interleave(tmp_path):
    """An entry is put in place under the folder's lock: a walk that makes room (holding it) sees
    the entry as a write under way or as an entry, never as neither (which let the cache overfill
    when two processes wrote blocks at once)."""
    cache = BlockCache(tmp_path, limit=4000)
    writing = cache.reserve(P, "block", 1000)
    os.pwrite(writing.fd, b"b" * 1000, 0)
    committed = threading.Event()
    with cache._folder_lock():  # a walk under way elsewhere
        thread = threading.Thread(target=lambda: (writing.commit(), committed.set()))
        thread.start()
        assert not committed.wait(0.3), "the commit went ahead while the folder was locked"
        assert cache.writing_bytes() == 1000 and not cache.has(P, "block", 1000)
    thread.join(10)
    assert committed.is_set() and cache.has(P, "block", 1000) and cache.writing_bytes() == 0


def test_a_folder_that_cannot_be_used_keeps_nothing_and_says_why(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    cache = BlockCache(blocker / "cache", limit=1000)
    assert not cache.put(P, "b", b"x")
    assert "not a folder" in cache.problem()
    assert "not a folder" in BlockCache(blocker, limit=1000).problem()


def test_limits_and_default_folder(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="cache_limit"):
        BlockCache(tmp_path, limit=-1)
    monkeypatch.setenv("PACKLOAD_CACHE", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    assert BlockCache().folder == tmp_path / "c" / CACHE_SUBFOLDER  # packload's own subfolder of it
    monkeypatch.delenv("PACKLOAD_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert default_cache_dir() == tmp_path / "x" / "packload"


def test_limit_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("PACKLOAD_CACHE_LIMIT", raising=False)
    assert BlockCache(tmp_path).limit == DEFAULT_CACHE_LIMIT
    monkeypatch.setenv("PACKLOAD_CACHE_LIMIT", "1500")
    cache = BlockCache(tmp_path)
    assert cache.limit == 1500 and BlockCache(tmp_path, limit=900).limit == 900  # an explicit limit wins
    assert cache.put(P, "a", b"x" * 600)
    assert cache.put(P, "b", b"y" * 600)
    assert cache.used() <= 1500 and cache.read(P, "a", 600) is None  # the older went to make room
    monkeypatch.setenv("PACKLOAD_CACHE_LIMIT", "20G")
    with pytest.raises(UsageError, match="PACKLOAD_CACHE_LIMIT='20G'") as info:
        BlockCache(tmp_path)
    assert "\n" not in str(info.value)


# -- the cache owns only what it wrote ----------------------------------------------------------
def _fill(cache: BlockCache, count: int, size: int = 700) -> None:
    for k in range(count):
        cache.put(P if k % 2 else Q, f"block {k}", bytes([k % 256]) * size)


@pytest.mark.parametrize("how", ["cache_dir", "PACKLOAD_CACHE", "link"])
def test_the_users_files_in_the_cache_folder_are_never_deleted(tmp_path, monkeypatch, how):
    """A cache folder holding the user's own files (older than every entry), with a limit below
    what they take: evictions delete entries only. Also a shared ``PACKLOAD_CACHE`` holding other
    programs' folders, and a ``cache_dir`` that is a link to such a folder."""
    shared = tmp_path / "shared"
    files = _user_files(shared, 20)
    for app in ("pip", "torch", "other-app"):  # other programs' caches beside ours
        files |= _user_files(shared / app, 3)
    if how == "PACKLOAD_CACHE":
        monkeypatch.setenv("PACKLOAD_CACHE", str(shared))
        cache = BlockCache(limit=3000)
    elif how == "link":
        (tmp_path / "link").symlink_to(shared)
        cache = BlockCache(tmp_path / "link", limit=3000)
    else:
        cache = BlockCache(shared, limit=3000)
    _fill(cache, 30)
    assert _all_there(files)
    assert 0 < cache.used() <= 3000 and cache.folder == shared.resolve() / CACHE_SUBFOLDER
    assert cache.make_room(3000) == 0  # everything of ours can go: still nothing of theirs
    assert _all_there(files)


def test_a_subfolder_of_that_name_without_our_marker_is_left_alone(tmp_path):
    folder = tmp_path / CACHE_SUBFOLDER
    files = _user_files(folder, 5)
    cache = BlockCache(tmp_path, limit=3000)
    assert "not packload's" in cache.problem() and "\n" not in cache.problem()
    assert not cache.put(P, "b", b"x" * 100) and cache.read(P, "b", 100) is None and cache.used() == 0
    assert _all_there(files)
    (folder / MARKER_NAME).write_bytes(b"Signature: 8a477f597d28d172789f06886806bc55\n")  # someone else's tag
    assert "not packload's marker" in BlockCache(tmp_path, limit=3000).problem()
    assert _all_there(files)


def test_files_planted_in_the_cache_folder_are_never_deleted(tmp_path):
    """Files the cache did not record, even named like its entries or in its pack folders, stay:
    only an entry with its record is evicted."""
    cache = BlockCache(tmp_path, limit=3000)
    cache.put(P, "first", b"f" * 100)
    planted = {cache.folder / P / "notes.txt": b"mine", cache.folder / P / ("0" * 40 + DATA_SUFFIX): b"x" * 500,
               cache.folder / "mine" / "file": b"y" * 500, cache.folder / Q / ("1" * 40 + RECORD_SUFFIX): b"{}"}
    for path, data in planted.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.utime(path, (1, 1))  # oldest of all
    _fill(cache, 30)
    cache.make_room(3000)
    assert _all_there(planted)


def test_an_unfinished_write_of_a_process_that_is_gone_is_deleted(tmp_path):
    cache = BlockCache(tmp_path, limit=3000)
    cache.put(P, "first", b"f" * 100)
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)  # a process that is gone now
    dead = cache.folder / P / f"{entry_name('x')}{DATA_SUFFIX}.tmp-{pid}-1"
    alive = cache.folder / P / f"{entry_name('y')}{DATA_SUFFIX}.tmp-{os.getpid()}-1"
    for path in (dead, alive):
        path.write_bytes(b"t" * 200)
        os.utime(path, (time.time() - 3600, time.time() - 3600))
    cache.make_room(3000)
    assert not dead.exists() and alive.exists()


# -- an entry is read only when it is what it says --------------------------------------------
def test_flipped_bytes_in_an_entry_are_a_miss_and_the_entry_goes(tmp_path):
    cache = BlockCache(tmp_path, limit=100_000)
    cache.put(P, "block", bytes(range(256)) * 40)
    path = _blk(cache, P, "block")
    data = bytearray(path.read_bytes())
    data[1000:1064] = bytes(64)  # 64 bytes changed in place, the size kept
    path.write_bytes(bytes(data))
    assert BlockCache(tmp_path).read(P, "block", len(data)) is None
    assert not path.exists()  # fetched again on the next read, never served
    cache.put(P, "block", bytes(range(256)) * 40)
    fresh = BlockCache(tmp_path)
    assert bytes(fresh.read(P, "block", len(data))) == bytes(range(256)) * 40
    with open(path, "r+b") as f:  # changed after it was checked in this open: checked again
        f.seek(5)
        f.write(b"\xff")
    os.utime(path, ns=(1, 1))
    assert fresh.read(P, "block", len(data)) is None


def test_an_entry_whose_record_names_another_identity_is_a_miss(tmp_path):
    cache = BlockCache(tmp_path, limit=100_000)
    cache.put(P, "shard block 3 of 8192", b"a" * 8192)
    cache.put(P, "shard block 3 of 4096", b"b" * 4096)
    source, target = _blk(cache, P, "shard block 3 of 4096"), _blk(cache, P, "shard block 3 of 8192")
    record = cache.folder / P / (entry_name("shard block 3 of 4096") + RECORD_SUFFIX)
    os.replace(source, target)  # another entry's bytes (and their own record) under this name
    os.replace(record, target.with_suffix(RECORD_SUFFIX))
    assert BlockCache(tmp_path).read(P, "shard block 3 of 8192", 4096) is None


def test_links_in_the_cache_are_never_followed(tmp_path):
    """A block file that is a link to a victim's file is not read through; writing the entry
    replaces the link, never the victim; a pack folder that is a link is not written into."""
    victim = tmp_path / "victim"
    victim.mkdir()
    secret = victim / "secret"
    secret.write_bytes(b"s" * 300)
    cache = BlockCache(tmp_path / "c", limit=100_000)
    cache.put(P, "other", b"o" * 10)  # makes P's folder
    link = _blk(cache, P, "block")
    link.symlink_to(secret)
    (link.with_suffix(RECORD_SUFFIX)).symlink_to(secret)
    assert cache.read(P, "block", 300) is None and not cache.has(P, "block", 300)
    assert cache.put(P, "block", b"n" * 300)
    assert secret.read_bytes() == b"s" * 300 and not link.is_symlink()
    (cache.folder / Q).symlink_to(victim, target_is_directory=True)
    assert not cache.put(Q, "index", b"i" * 100)
    assert sorted(p.name for p in victim.iterdir()) == ["secret"]
    with pytest.raises(OSError):
        with cache.fetching(Q, "index"):
            pass
    assert sorted(p.name for p in victim.iterdir()) == ["secret"]
    cache.make_room(100_000)
    assert secret.read_bytes() == b"s" * 300
    (cache.folder / LOCK_NAME).unlink()
    (cache.folder / LOCK_NAME).symlink_to(secret)
    assert not cache.put(P, "more", b"m" * 100)  # the lock file is a link: nothing written through it
    assert secret.read_bytes() == b"s" * 300


def test_the_cache_folder_itself_a_link_is_not_used(tmp_path):
    victim = tmp_path / "victim"
    files = _user_files(victim, 3)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / CACHE_SUBFOLDER).symlink_to(victim, target_is_directory=True)
    cache = BlockCache(tmp_path / "c", limit=3000)
    assert "symbolic link" in cache.problem()
    assert not cache.put(P, "b", b"x" * 100) and _all_there(files)


def test_one_fetch_lock_per_block_across_processes(tmp_path):
    """A second process asking for a block being fetched waits until the first is done."""
    cache = BlockCache(tmp_path / "cache")
    marks = tmp_path / "marks"
    with cache.fetching(P, "shard-00000.bin.0"):
        pid = os.fork()
        if pid == 0:  # the child: takes the lock only once the parent has let it go
            with cache.fetching(P, "shard-00000.bin.0"):
                with open(marks, "a") as f:
                    f.write("child\n")
            os._exit(0)
        time.sleep(0.3)  # gives the child time to be waiting (no timing is asserted)
        with open(marks, "a") as f:
            f.write("parent\n")
    os.waitpid(pid, 0)
    assert marks.read_text().split() == ["parent", "child"]
    assert not list((cache.folder / P).glob("*.fetching"))  # lock files do not stay behind
    assert cache.used() == 0  # and never counted as cached bytes


def _take(cache, name, marks, mark, errors):
    """Take block ``name``'s lock, note ``mark``, let it go (an error is kept in ``errors``)."""
    try:
        with cache.fetching(P, name):
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
            with cache.fetching(P, "y"):
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
    with cache.fetching(P, "x"):
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
    held = cache.fetching(P, "x")
    held.__enter__()
    keeper = os.fork()
    if keeper == 0:  # holds the copy of the descriptor until told to exit
        os.read(done_r, 1)
        os._exit(0)
    waiter = os.fork()
    if waiter == 0:  # already waiting on the lock file when it is let go
        with cache.fetching(P, "x"):
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
    entry (a full cache holds thousands); one that does not fit walks the folder and evicts."""
    cache = BlockCache(tmp_path, limit=4600)  # three entries fit by their recorded size, not four
    walks = []
    entries = BlockCache.entries
    monkeypatch.setattr(BlockCache, "entries", lambda self: walks.append(1) or entries(self))
    cache.put(P, "a", b"a" * 1000)  # nothing recorded yet: one walk
    assert len(walks) == 1
    cache.put(P, "b", b"b" * 1000)
    cache.put(P, "c", b"c" * 1000)
    assert len(walks) == 1 and (cache.folder / LOCK_NAME).read_text() == str(3 * (1000 + 512))
    cache.put(P, "d", b"d" * 1000)  # does not fit: walks, evicts the oldest
    assert len(walks) == 2 and not cache.has(P, "a", 1000) and _used(cache) <= 4600
    _blk(cache, P, "b").unlink()  # deleted by hand: the record is now more than the truth
    cache.put(P, "e", b"e" * 1000)  # walks again, finds room, evicts nothing more
    assert len(walks) == 3 and [cache.has(P, n, 1000) for n in "bcde"] == [False, True, True, True]
    assert int((cache.folder / LOCK_NAME).read_text()) >= _used(cache)


def test_a_write_under_way_is_counted_by_a_walk(tmp_path):
    """Room claimed by a write not finished yet (another thread's, another process's) counts when a
    walk records the bytes anew: once it lands, the limit still holds."""
    cache = BlockCache(tmp_path, limit=4000)
    writing = cache.reserve(P, "big", 2000)  # claimed, its bytes not written yet
    (cache.folder / LOCK_NAME).write_text("")  # the record lost: the next write walks the folder
    for k in range(3):
        cache.put(P, f"x{k}", b"x" * 1000)
    os.pwrite(writing.fd, b"b" * 2000, 0)
    writing.commit()
    assert _used(cache) <= 4000 and cache.has(P, "big", 2000)
