"""One entry of the block cache (``packload.loaders.cache_entries``): its file names, the record
written with it (identity, length, CRC-32, inode), the record put in place before the bytes and
both under the writers' turn, and the checks that make anything else a miss: a record not ours,
of another identity, length or file, or bytes that are not what it recorded (then deleted)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from packload.loaders import cache_entries
from packload.loaders.cache_entries import (
    DATA_SUFFIX,
    ENTRY,
    RECORD_LIMIT,
    RECORD_SUFFIX,
    TMP,
    Reservation,
    entry_name,
    matches_record,
    read_record,
    signature,
    temporary_name,
)
from packload.loaders.cache_folder import CACHE_SUBFOLDER, CacheFolder, pack_folder_name
from tests.no_hang import within

P = pack_folder_name("pack", "a manifest")
IDENTITY = "shard-00000.bin\x0065536\x008192\x003"  # as a block of a shard is named
DATA = bytes(range(256)) * 12


class Turn:
    """The writers' turn as a reservation takes it: noted while held; ``fails`` refuses it."""

    def __init__(self, fails: BaseException | None = None) -> None:
        self.fails = fails
        self.held = False
        self.taken = 0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        if self.fails is not None:
            raise self.fails
        self.held, self.taken = True, self.taken + 1
        try:
            yield
        finally:
            self.held = False


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[int]:
    """The descriptor of a pack folder of a real cache folder in ``tmp_path``."""
    place = CacheFolder(tmp_path)
    fd = place.pack_fd(P, create=True)
    assert fd is not None
    yield fd
    place.close()


def _reserve(folder: int, identity: str, data: bytes, turn: Turn,
             placed: list[os.stat_result] | None = None) -> Reservation:
    """A reservation of ``identity`` with ``data`` written into its temporary file (as ``BlockCache.reserve``
    hands it out, then filled)."""
    name = entry_name(identity)
    tmp = temporary_name(name, DATA_SUFFIX)
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=folder)
    os.pwrite(fd, data, 0)
    return Reservation(folder, name, tmp, fd, identity, len(data), turn,
                       (placed if placed is not None else []).append)


def _files(folder: int) -> list[str]:
    return sorted(os.listdir(folder))


def test_names_are_hashes_of_a_fixed_form():
    names = {entry_name(identity) for identity in ("a\x00bc", "ab\x00c", "a", "A", "\udcff", IDENTITY)}
    assert len(names) == 6 and all(ENTRY.fullmatch(name) for name in names)  # NUL-separated fields apart
    name = entry_name(IDENTITY)
    assert entry_name(IDENTITY) == name
    mine = TMP.fullmatch(temporary_name(name, DATA_SUFFIX))
    assert mine is not None and mine.group(1, 2, 3) == (name, "blk", str(os.getpid()))
    assert TMP.fullmatch(temporary_name(name, RECORD_SUFFIX)).group(2) == "rec"
    others: list[str] = []
    thread = threading.Thread(target=lambda: others.append(temporary_name(name, DATA_SUFFIX)))
    thread.start()
    thread.join()
    assert others[0] != temporary_name(name, DATA_SUFFIX)  # each thread writes a file of its own


def test_a_signature_tells_a_file_from_the_same_file_changed(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"a" * 100)
    first = signature(os.stat(path))
    assert signature(os.stat(path)) == first
    os.utime(path, ns=(1, 1))  # rewritten in place, the size kept
    assert signature(os.stat(path)) != first
    touched = signature(os.stat(path))
    (tmp_path / "g").write_bytes(b"a" * 100)
    os.utime(tmp_path / "g", ns=(1, 1))
    os.replace(tmp_path / "g", path)  # another file of the same size and times in its place
    assert signature(os.stat(path)) != touched


def test_a_commit_records_the_entry_and_puts_it_in_place(folder, tmp_path):
    turn, placed = Turn(), []
    writing = _reserve(folder, IDENTITY, DATA, turn, placed)
    writing.commit()
    name = entry_name(IDENTITY)
    assert _files(folder) == [name + DATA_SUFFIX, name + RECORD_SUFFIX]  # no temporary file left
    info = os.stat(name + DATA_SUFFIX, dir_fd=folder)
    record = json.loads((tmp_path / CACHE_SUBFOLDER / P / (name + RECORD_SUFFIX)).read_bytes())
    assert record == {"packload_cache": 1, "identity": IDENTITY, "length": len(DATA), "crc32": zlib.crc32(DATA),
                      "inode": info.st_ino}
    assert read_record(folder, name) == record
    assert [p.st_ino for p in placed] == [info.st_ino] and turn.taken == 1
    assert writing.fd == -1


def test_a_crc_given_is_recorded_as_given(folder):
    """``commit(crc32)`` records the CRC the writer computed as it wrote; a wrong one makes the entry
    one whose bytes are not what it recorded: the first check deletes it."""
    _reserve(folder, IDENTITY, DATA, Turn()).commit(crc32=zlib.crc32(DATA) ^ 1)
    name = entry_name(IDENTITY)
    assert read_record(folder, name)["crc32"] == zlib.crc32(DATA) ^ 1
    info = os.stat(name + DATA_SUFFIX, dir_fd=folder)
    assert not matches_record(folder, name, IDENTITY, info, DATA)
    assert _files(folder) == []


def test_the_record_is_put_in_place_first_both_under_the_turn(folder, monkeypatch):
    """Bytes in place always have their record, and a walk (which holds the turn) never sees an
    entry half put in place."""
    turn = Turn()
    moves = []
    replace = os.replace

    def noting(src, dst, **kw):
        moves.append((Path(dst).suffix, turn.held))
        return replace(src, dst, **kw)

    monkeypatch.setattr(cache_entries.os, "replace", noting)
    _reserve(folder, IDENTITY, DATA, turn).commit()
    assert moves == [(RECORD_SUFFIX, True), (DATA_SUFFIX, True)]


def test_a_commit_that_fails_leaves_nothing_behind(folder):
    """The turn cannot be taken (the lock file cannot be opened): the error goes to the caller, and
    neither the bytes' nor the record's temporary file stays (the room they took is freed)."""
    writing = _reserve(folder, IDENTITY, DATA, Turn(fails=OSError(24, "Too many open files")))
    with pytest.raises(OSError, match="Too many open files"):
        writing.commit()
    assert _files(folder) == [] and writing.fd == -1


def test_abort_deletes_the_temporary_file(folder):
    writing = _reserve(folder, IDENTITY, DATA, Turn())
    assert _files(folder) == [temporary_name(entry_name(IDENTITY), DATA_SUFFIX)]
    writing.abort()
    assert _files(folder) == [] and writing.fd == -1
    writing.abort()  # twice: nothing left to delete


def _plant_record(folder: int, name: str, raw: bytes) -> None:
    fd = os.open(name + RECORD_SUFFIX, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=folder)
    try:
        os.write(fd, raw)
    finally:
        os.close(fd)


def _record(identity: str = IDENTITY, **fields: object) -> bytes:
    return json.dumps({"packload_cache": 1, "identity": identity, "length": 1, "crc32": 0, "inode": 0,
                       **fields}).encode()


@pytest.mark.parametrize(("raw", "why"), [
    (_record(), None),
    (_record() + b" " * (RECORD_LIMIT + 1 - len(_record())), "larger than a record of ours"),
    (b"{not json", "not JSON"),
    (b'["packload_cache", 1]', "not an object"),
    (_record(packload_cache=2), "another format"),
    (_record(identity="another block"), "the record of another entry, under this name"),
    (b'{"packload_cache": 1}', "no identity"),
])
def test_a_record_is_read_only_when_it_is_ours(folder, raw, why):
    name = entry_name(IDENTITY)
    _plant_record(folder, name, raw)
    if why is None:
        assert read_record(folder, name) == json.loads(raw)
    else:
        assert read_record(folder, name) is None, why


def test_a_record_that_is_no_file_is_none_and_never_waited_on(folder, tmp_path):
    name = entry_name(IDENTITY)
    assert read_record(folder, name) is None  # none there
    (tmp_path / "elsewhere").write_bytes(_record())
    os.symlink(tmp_path / "elsewhere", name + RECORD_SUFFIX, dir_fd=folder)
    assert read_record(folder, name) is None  # not read through a link
    os.unlink(name + RECORD_SUFFIX, dir_fd=folder)
    os.mkdir(name + RECORD_SUFFIX, dir_fd=folder)
    assert read_record(folder, name) is None
    os.rmdir(name + RECORD_SUFFIX, dir_fd=folder)
    os.mkfifo(name + RECORD_SUFFIX, dir_fd=folder)  # a walk over the folder reads every record: it must not hang
    with within(5):
        assert read_record(folder, name) is None


def test_only_bytes_that_are_what_their_record_says_match(folder, tmp_path):
    _reserve(folder, IDENTITY, DATA, Turn()).commit()
    name = entry_name(IDENTITY)
    info = os.stat(name + DATA_SUFFIX, dir_fd=folder)
    assert matches_record(folder, name, IDENTITY, info, DATA)
    (tmp_path / "other").write_bytes(DATA)
    shorter = list(info)
    shorter[6] -= 1  # st_size: the file as found truncated
    for identity, seen in [("another block", info),  # asked for another identity
                           (IDENTITY, os.stat(tmp_path / "other")),  # another file (written again meanwhile)
                           (IDENTITY, os.stat_result(shorter))]:
        assert not matches_record(folder, name, identity, seen, DATA)
    assert _files(folder) == [name + DATA_SUFFIX, name + RECORD_SUFFIX]  # none of these is damage: kept
    damaged = bytearray(DATA)
    damaged[100] ^= 0xFF
    assert not matches_record(folder, name, IDENTITY, info, bytes(damaged))
    assert _files(folder) == []  # bytes not what their own record says: deleted, to be fetched again
