"""Writing shards past the page cache (``O_DIRECT``): the file holds exactly the bytes appended, at
every checkpoint and at the end; the page cache is left alone; and file systems that refuse direct
writes, at open or at the first write, get the same bytes through the page cache."""

from __future__ import annotations

import errno
import hashlib
import os

import numpy as np
import pytest

from packload import EncodeOptions, pack
from packload.diagnose.page_cache import resident_pages
from packload.loaders.read import PackReader
from packload.packer import append_file, direct_file
from packload.packer.direct_file import ALIGN, DirectAppender
from tests.image_factory import make_image_folder


def _direct_or_skip(path):
    appender = DirectAppender.open(path)
    if appender is None:
        pytest.skip(f"the file system under {path.parent} refuses O_DIRECT")
    return appender


def _pieces(seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    sizes = [0, 1, ALIGN - 1, ALIGN, ALIGN + 1, 5000, 70_000, 3, 200_000, 12_345]
    return [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for size in sizes]


def test_bytes_and_checkpoints_are_exact(tmp_path):
    """A small stage, so pieces cross it: after ``expose`` the file is exactly the prefix written
    (no zero padding left), and appending after a checkpoint rewrites the partial block correctly."""
    path = tmp_path / "f"
    appender = _direct_or_skip(path)
    appender = DirectAppender(appender._fd, stage_bytes=4 * ALIGN)  # reuse the fd with a small stage
    written = b""
    for number, piece in enumerate(_pieces(1) * 2):
        appender.write(piece)
        written += piece
        if number % 3 == 0:
            appender.expose()
            assert path.read_bytes() == written and appender.size == len(written)
    appender.write(np.arange(300, dtype=np.uint8).reshape(10, 10, 3))  # arrays go in as their bytes
    written += np.arange(300, dtype=np.uint8).tobytes()
    appender.close()
    assert path.read_bytes() == written
    assert appender.direct


def test_shard_bytes_bypass_the_page_cache(tmp_path):
    """What the direct path is for: the appended bytes reach the file without filling the cache."""
    path = tmp_path / "big"
    _direct_or_skip(path).close()
    data = os.urandom(64 * ALIGN + 17)
    appender = append_file.HashingAppender(path)
    appender.write(data)
    digest = appender.close()
    assert digest == hashlib.sha256(data).hexdigest()
    cached, pages = resident_pages(path)
    assert pages == 65 and cached <= 1  # at most the partial last block, cut back to size
    assert path.read_bytes() == data


def test_refused_at_open_writes_through_the_cache(tmp_path, monkeypatch):
    real_open = os.open

    def refuse_direct(path, flags, *args):
        if flags & direct_file._O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(direct_file.os, "open", refuse_direct)
    assert DirectAppender.open(tmp_path / "f") is None
    appender = append_file.HashingAppender(tmp_path / "f")
    pieces = _pieces(2)
    for piece in pieces:
        appender.write(piece)
    assert appender.close() == hashlib.sha256(b"".join(pieces)).hexdigest()
    assert (tmp_path / "f").read_bytes() == b"".join(pieces)


def test_refused_at_write_goes_on_through_the_cache(tmp_path, monkeypatch):
    """A file system that takes the flag at open but refuses the write: switched to plain writes,
    nothing lost; other errors (a full disk) still raise."""
    path = tmp_path / "f"
    appender = _direct_or_skip(path)
    real_pwrite = os.pwrite

    def refuse_direct(fd, data, offset):
        if appender.direct:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(direct_file.os, "pwrite", refuse_direct)
    pieces = _pieces(3)
    for piece in pieces:
        appender.write(piece)
    appender.expose()
    appender.write(b"tail")
    appender.close()
    assert not appender.direct
    assert path.read_bytes() == b"".join(pieces) + b"tail"

    full = _direct_or_skip(tmp_path / "g")
    monkeypatch.setattr(direct_file.os, "pwrite", lambda fd, data, offset: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device")))
    full.write(b"x" * 10)
    with pytest.raises(OSError, match="No space"):
        full.close()


def test_packs_written_direct_read_back(tmp_path):
    """A shards pack written through the direct path reads back intact (checksums on every record)."""
    make_image_folder(tmp_path / "src", classes=("a", "b"), per_class=12, seed=5)
    _direct_or_skip(tmp_path / "probe").close()
    pack(tmp_path / "src", tmp_path / "out.shards", options=EncodeOptions(encoding="raw", max_side=40),
         shard_size=64 << 10, progress=False)
    reader = PackReader(tmp_path / "out.shards")
    assert reader.records == reader.manifest["records"] == 24
    for i in range(reader.records):
        reader.payload(i, verify=True)
    for part in reader.manifest["parts"]:
        data = (tmp_path / "out.shards" / part["name"]).read_bytes()
        assert len(data) == part["size"] and hashlib.sha256(data).hexdigest() == part["sha256"]


def test_only_local_disk_file_systems_write_direct(tmp_path, monkeypatch):
    """Network, FUSE and tmpfs file systems keep the page cache (a direct write there waits for the
    far side, or the cache is the storage)."""
    if direct_file.filesystem_type(tmp_path) not in direct_file.LOCAL_DISK_FS:
        assert DirectAppender.open(tmp_path / "f") is None
        pytest.skip(f"{tmp_path} is not on a local disk file system")
    assert direct_file.filesystem_type(tmp_path / "missing") is None
    for magic in (0x65735546, 0x6969, 0x01021994):  # FUSE, NFS, tmpfs
        monkeypatch.setattr(direct_file, "filesystem_type", lambda path, magic=magic: magic)
        assert DirectAppender.open(tmp_path / "f") is None
        appender = append_file.HashingAppender(tmp_path / "f")
        appender.write(b"abc")
        appender.close()
        assert (tmp_path / "f").read_bytes() == b"abc"
