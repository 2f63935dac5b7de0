"""The exclusive lock on a file (``packload.loaders.file_lock``): held for a ``with`` block against
other processes and other opens in this one, the number it records, the file removed on release
where asked, never taken through a link, never handed to a child process."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from packload.loaders.file_lock import FileLock

# Another process: tries to take the lock without waiting; exit 0 when it got it, 3 when held.
TRY_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    sys.exit(3)
sys.exit(0)
"""


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[int]:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def _other_process_gets(path: Path) -> bool:
    code = subprocess.run([sys.executable, "-c", TRY_LOCK, str(path)], timeout=60).returncode
    assert code in (0, 3), code
    return code == 0


def _another_open_gets(path: Path) -> bool:
    """Whether a second open of the file in this process (another thread's lock) can take it now."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def test_the_lock_is_held_for_the_block_against_other_processes_and_opens(folder, tmp_path):
    path = tmp_path / ".lock"
    with FileLock(folder, ".lock") as lock:
        assert path.is_file() and lock.fd >= 0
        assert not _other_process_gets(path)
        assert not _another_open_gets(path)
    assert lock.fd == -1 and path.is_file()  # kept: the writers' lock file stays
    assert _other_process_gets(path) and _another_open_gets(path)


def test_the_number_recorded_in_the_lock_file(folder, tmp_path):
    with FileLock(folder, ".lock") as lock:
        assert lock.read_number() is None  # a new file
        lock.write_number(123456)
        assert lock.read_number() == 123456
        lock.write_number(7)  # a shorter number replaces the longer one whole
        assert lock.read_number() == 7
    assert (tmp_path / ".lock").read_text() == "7"
    with FileLock(folder, ".lock") as lock:
        assert lock.read_number() == 7  # kept for the next holder
    for junk in ("12ab", "-5", "", " "):
        (tmp_path / ".lock").write_text(junk)
        with FileLock(folder, ".lock") as lock:
            assert lock.read_number() is None, junk


def test_a_lock_asked_to_remove_its_file_does_so_on_release(folder, tmp_path):
    with FileLock(folder, "x.fetching", remove=True):
        assert (tmp_path / "x.fetching").is_file()
    assert not (tmp_path / "x.fetching").exists()
    with pytest.raises(RuntimeError, match="mid-fetch"):  # released and removed on an error too
        with FileLock(folder, "x.fetching", remove=True):
            raise RuntimeError("mid-fetch")
    assert not (tmp_path / "x.fetching").exists()


def test_the_lock_file_is_never_taken_through_a_link(folder, tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / ".lock").symlink_to(victim)
    (tmp_path / "dangling").symlink_to(tmp_path / "would-be-made")
    for name in (".lock", "dangling"):
        with pytest.raises(OSError):
            with FileLock(folder, name):
                pass
    assert victim.read_bytes() == b"precious" and not (tmp_path / "would-be-made").exists()


def test_a_child_process_is_not_handed_the_lock(folder, tmp_path):
    """A child started while the lock is held (a DataLoader worker, a subprocess) gets no copy of its
    descriptor, which would keep the lock held after this process lets it go."""
    with FileLock(folder, ".lock") as lock:
        assert not os.get_inheritable(lock.fd)
