"""``packer.destination_lock``: ``DEST.lock`` held by one process at a time. Another process (forked
here) holding it refuses this one in one line naming its pid; killed, it leaves the file but not the
lock. The file is removed on release only while it is still the one locked, a link at its name is
refused, and an owner removing the file between another's open and lock sends that one to lock the
new file. (Commands refused by a running ``pack`` or ``merge`` are tested in
test_concurrent_writers.py.)"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import signal
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from packload.core.errors import UsageError, WriteError
from packload.packer import destination_lock
from packload.packer.destination import lock_path
from packload.packer.destination_lock import DestinationLock


def _hold(dst: str, raw: bool, conn: Connection) -> None:
    """Child: hold the lock of ``dst`` (``raw``: a bare flock on a lock file holding no pid), say so,
    and keep it until the parent says so or kills this process."""
    if raw:
        fd = os.open(str(lock_path(Path(dst))), os.O_RDWR | os.O_CREAT)
        os.write(fd, b"not a pid\n")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    else:
        DestinationLock(Path(dst)).acquire()
    conn.send("held")
    conn.recv()
    os._exit(0)  # no cleanup of any kind: the lock goes with the process


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[Any]:
    """Starts a child that holds the lock of a destination; ends it whatever the test does."""
    context = multiprocessing.get_context("fork")
    started: list[tuple[Any, Connection]] = []

    def start(dst: Path, raw: bool = False) -> Any:
        parent, child = context.Pipe()
        process = context.Process(target=_hold, args=(str(dst), raw, child))
        process.start()
        child.close()
        assert parent.poll(60) and parent.recv() == "held"
        started.append((process, parent))
        return process

    yield start
    for process, conn in started:
        try:
            conn.send("let go")
        except OSError:
            pass  # killed already
        process.join(30)
        conn.close()
        if process.is_alive():
            process.kill()
            process.join()


def refusal(dst: Path) -> str:
    with pytest.raises(UsageError) as caught:
        DestinationLock(dst).acquire()
    text = str(caught.value)
    assert "\n" not in text, text
    return text


def test_another_process_holds_it_until_it_is_killed(tmp_path: Path, holder: Any) -> None:
    dst = tmp_path / "out.lmdb"
    child = holder(dst)
    assert lock_path(dst).read_text() == f"{child.pid}\n"
    assert refusal(dst) == f"another packload command (pid {child.pid}) is writing {dst}; wait for it to finish"
    with pytest.raises(UsageError, match=f"pid {child.pid}"), DestinationLock(dst):
        pytest.fail("the lock was taken while another process held it")
    assert lock_path(dst).read_text() == f"{child.pid}\n"  # a refused command leaves the owner's file alone
    os.kill(child.pid, signal.SIGKILL)
    child.join(30)
    assert child.exitcode == -signal.SIGKILL
    assert lock_path(dst).read_text() == f"{child.pid}\n"  # killed: the file stays, the lock does not
    with DestinationLock(dst) as lock:
        assert lock.path == lock_path(dst) and lock_path(dst).read_text() == f"{os.getpid()}\n"
    assert not lock_path(dst).exists()


def test_a_holder_that_wrote_no_pid_is_named_unknown(tmp_path: Path, holder: Any) -> None:
    dst = tmp_path / "out.shards"
    holder(dst, raw=True)
    assert refusal(dst) == f"another packload command (pid unknown) is writing {dst}; wait for it to finish"


def test_one_process_cannot_take_it_twice(tmp_path: Path) -> None:
    dst = tmp_path / "out.lmdb"
    first = DestinationLock(dst)
    first.acquire()
    assert refusal(dst) == f"another packload command (pid {os.getpid()}) is writing {dst}; wait for it to finish"
    first.release()
    first.release()  # a second release does nothing
    assert not lock_path(dst).exists()
    with DestinationLock(dst):
        assert lock_path(dst).exists()


def test_released_when_the_block_raises(tmp_path: Path) -> None:
    dst = tmp_path / "out.lmdb"
    with pytest.raises(RuntimeError), DestinationLock(dst):
        raise RuntimeError("the write failed")
    assert not lock_path(dst).exists()
    DestinationLock(dst).acquire()  # free again


def test_a_stale_file_is_taken_and_rewritten(tmp_path: Path) -> None:
    """A lock file no one holds (a killed command's) is locked, and its old text replaced by this pid."""
    dst = tmp_path / "out.lmdb"
    lock_path(dst).write_text("123456789012345678901234567890\nleft over\n")
    with DestinationLock(dst):
        assert lock_path(dst).read_text() == f"{os.getpid()}\n"


def test_release_leaves_a_file_that_is_no_longer_its_own(tmp_path: Path) -> None:
    """If the lock file was replaced meanwhile, release lets go without removing the new one."""
    dst = tmp_path / "out.lmdb"
    lock = DestinationLock(dst)
    lock.acquire()
    lock_path(dst).unlink()
    lock_path(dst).write_text("someone else's\n")
    lock.release()
    assert lock_path(dst).read_text() == "someone else's\n"


def test_an_owner_letting_go_between_open_and_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file this command opened is removed (its owner releasing) before it locks it: it locks a
    file no path names, notices, and locks the file at the path instead, which others then find held."""
    dst = tmp_path / "out.lmdb"
    lock_path(dst).write_text("4242\n")
    locks: list[int] = []

    class OwnerLetsGo:
        LOCK_EX, LOCK_NB = fcntl.LOCK_EX, fcntl.LOCK_NB

        @staticmethod
        def flock(fd: int, operation: int) -> None:
            if not locks:
                lock_path(dst).unlink()
            locks.append(fd)
            fcntl.flock(fd, operation)

    monkeypatch.setattr(destination_lock, "fcntl", OwnerLetsGo)
    lock = DestinationLock(dst)
    lock.acquire()
    monkeypatch.undo()
    assert len(locks) == 2  # the unnamed file, then the one at the path
    assert lock_path(dst).read_text() == f"{os.getpid()}\n"
    probe = os.open(lock_path(dst), os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(probe)
    lock.release()
    assert not lock_path(dst).exists()


@pytest.mark.parametrize("target", ["victim.txt", "nowhere"])
def test_a_link_at_the_lock_files_name_is_refused(tmp_path: Path, target: str) -> None:
    dst = tmp_path / "out.lmdb"
    (tmp_path / "victim.txt").write_text("victim's")
    lock_path(dst).symlink_to(tmp_path / target)
    with pytest.raises(UsageError) as caught:
        DestinationLock(dst).acquire()
    assert str(caught.value) == (f"{lock_path(dst)}: is a symbolic link, where packload keeps the lock of {dst}; "
                                 "remove it")
    assert (tmp_path / "victim.txt").read_text() == "victim's" and not (tmp_path / "nowhere").exists()
    assert lock_path(dst).is_symlink()


def test_a_destination_where_no_lock_file_can_be_made(tmp_path: Path) -> None:
    dst = tmp_path / "missing" / "out.lmdb"
    with pytest.raises(WriteError) as caught:
        DestinationLock(dst).acquire()
    assert str(caught.value) == (f"{dst}: cannot create its lock file out.lmdb.lock (No such file or directory); "
                                 "choose a destination in a folder you can write to")
    if os.path.ismount("/proc"):
        with pytest.raises(WriteError) as caught:
            DestinationLock(Path("/proc/out.lmdb")).acquire()
        assert str(caught.value).startswith("/proc/out.lmdb: cannot be written there: /proc is a virtual file system")
        assert str(caught.value).endswith("; choose a destination on a disk you can write to")
