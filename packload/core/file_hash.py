"""The SHA-256 of a file, read in large blocks: what a manifest lists for each shard and index, as
the writers (pack, merge) record it and the readers (verify) check it."""

from __future__ import annotations

import hashlib
import os

from packload.core.errors import PackFormatError

HASH_BLOCK = 8 << 20  # bytes read at a time when hashing or copying a pack's file

LARGER_THAN_LISTED = ("larger than the {size:,} bytes the manifest lists; the pack is damaged, or the file is not "
                      "this pack's: copy the pack again")


def sha256_file(path: str | os.PathLike[str], size: int | None = None) -> str:
    """The SHA-256 of the whole file ``path``. With ``size`` (what the manifest lists), no more than
    that is ever read: a file that holds more raises ``PackFormatError`` (a sparse terabyte in place
    of a shard is refused at once, not hashed for minutes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        if size is None:
            while block := f.read(HASH_BLOCK):
                digest.update(block)
            return digest.hexdigest()
        left = size
        while left and (block := f.read(min(HASH_BLOCK, left))):
            digest.update(block)
            left -= len(block)
        if f.read(1):
            raise PackFormatError(f"{os.fspath(path)}: {LARGER_THAN_LISTED.format(size=size)}")
    return digest.hexdigest()
