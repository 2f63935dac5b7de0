"""Appending from background threads while hashing (``packload.packer.append_file``): the file holds
exactly the bytes appended, in order, through every way of appending, across block boundaries, with
and without ``O_DIRECT``; the digest is the file's; appending to a file continues its digest; and a
failed write is raised in the caller's thread."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from packload.packer import append_file
from packload.packer.append_file import HashingAppender


def _pieces(seed: int, count: int = 60) -> list[bytes]:
    rng = np.random.default_rng(seed)
    sizes = rng.choice([0, 1, 7, 100, 4095, 4096, 9000, 20_000, 70_000], size=count)
    return [rng.integers(0, 256, int(n), dtype=np.uint8).tobytes() for n in sizes]


@pytest.mark.parametrize("direct", [False, True])
def test_every_way_of_appending_gives_the_bytes_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         direct: bool) -> None:
    monkeypatch.setattr(append_file, "BLOCK", 64 << 10)  # many blocks, small and large pieces in each
    monkeypatch.setattr(append_file, "MAX_PIECES", 16)
    path = tmp_path / "shard.bin"
    appender = HashingAppender(path, direct=direct)
    pieces = _pieces(1)
    written: list[bytes] = []
    for k in range(0, len(pieces), 6):
        a, b, c, d, e, f = pieces[k : k + 6]
        appender.write(a)
        appender.write_pair(b, c)  # a record's header and payload
        appender.write_many([d, e, f], len(d) + len(e) + len(f))
        written += [a, b, c, d, e, f]
        if k == 30:
            appender.flush()  # everything so far is in the file, readable by others
            assert path.read_bytes() == b"".join(written)
    digest = appender.close()
    data = b"".join(written)
    assert path.read_bytes() == data
    assert digest == hashlib.sha256(data).hexdigest()


def test_appending_to_a_file_continues_its_digest(tmp_path: Path) -> None:
    path = tmp_path / "shard.bin"
    first, second = b"".join(_pieces(2, 10)), b"".join(_pieces(3, 10))
    appender = HashingAppender(path)
    appender.write(first)
    assert appender.close() == hashlib.sha256(first).hexdigest()
    digest = hashlib.sha256(path.read_bytes())  # what a resumed pack carries on from
    appender = HashingAppender(path, mode="ab", digest=digest)
    appender.write(second)
    assert appender.close() == hashlib.sha256(first + second).hexdigest()
    assert path.read_bytes() == first + second


def test_a_failed_write_is_raised_in_the_callers_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, buffers: list[bytes]) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(append_file.os, "writev", full)
    appender = HashingAppender(tmp_path / "shard.bin", direct=False)
    appender.write_many([os.urandom(20_000) for _ in range(4)], 80_000)  # large pieces: written with writev
    with pytest.raises(OSError) as caught:
        appender.close()
    assert caught.value.errno == errno.ENOSPC
    appender = HashingAppender(tmp_path / "other.bin", direct=False)
    appender.write_many([os.urandom(20_000) for _ in range(4)], 80_000)
    appender.abandon()  # after another error: stops without raising this one
    assert not any(thread.is_alive() for thread in appender._threads)
