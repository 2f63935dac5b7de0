"""``core.file_hash``: the SHA-256 a manifest lists for a file, hashed in blocks and never past the
size listed."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from packload.core.errors import PackFormatError
from packload.core.file_hash import HASH_BLOCK, sha256_file


@pytest.mark.parametrize("size", [0, 1, HASH_BLOCK - 1, HASH_BLOCK, HASH_BLOCK * 2 + 7])
def test_the_digest_is_the_files_at_every_block_boundary(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    want = hashlib.sha256(data).hexdigest()
    assert sha256_file(path) == want and sha256_file(path, size) == want


def test_a_file_larger_than_listed_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    path = tmp_path / "grown.bin"
    path.write_bytes(b"x" * 1000)
    os.truncate(path, 1 << 40)  # a sparse terabyte where 1000 bytes were listed
    with pytest.raises(PackFormatError, match=r"grown\.bin: larger than the 1,000 bytes the manifest lists"):
        sha256_file(path, 1000)


def test_a_file_shorter_than_listed_hashes_what_is_there(tmp_path: Path) -> None:
    """A short file gives another digest, which the caller compares with the manifest's (a mismatch)."""
    path = tmp_path / "short.bin"
    path.write_bytes(b"abc")
    assert sha256_file(path, 10) == hashlib.sha256(b"abc").hexdigest()
