"""The keys of an LMDB data file, read from its pages without opening it as an LMDB environment.

py-lmdb refuses to open a file that this process already has open (LMDB forbids it), which is
the case when a dataset in this process still reads the pack that ``pack --overwrite`` is about
to replace. Telling whether that file is a pack only needs its keys: this walks the B-tree of its
main database, read-only, from the newer of its two meta pages (LMDB's data format 1, the one
LMDB 0.9 writes). Anything unexpected is a ``ValueError``.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

_MAGIC = 0xBEEFC0DE
_DATA_VERSION = 1
_HEADER = 16  # page header: page number (8), pad (2), flags (2), lower (2), upper (2)
_P_BRANCH, _P_LEAF, _P_LEAF2 = 0x01, 0x02, 0x20
_NO_PAGE = (1 << 64) - 1
_MAX_DEPTH = 64


def lmdb_keys(path: Path) -> Iterator[bytes]:
    """Every key of the main database of the LMDB file ``path``, in order."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        size = os.fstat(fd).st_size
        first = os.pread(fd, 4096, 0)
        if len(first) < 152 or struct.unpack_from("<II", first, 16) != (_MAGIC, _DATA_VERSION):
            raise ValueError("not an LMDB data file of format 1")
        page_size = struct.unpack_from("<I", first, 40)[0]  # the free database's pad holds it
        if page_size < 512 or page_size & (page_size - 1) or 2 * page_size > size:
            raise ValueError(f"implausible page size {page_size}")
        metas = [os.pread(fd, 152, k * page_size) for k in (0, 1)]
        valid = [m for m in metas if len(m) == 152 and struct.unpack_from("<II", m, 16) == (_MAGIC, _DATA_VERSION)]
        newest = max(valid, key=lambda m: struct.unpack_from("<Q", m, 144)[0])
        root = struct.unpack_from("<Q", newest, 128)[0]
        if root != _NO_PAGE:
            yield from _walk(fd, size, page_size, root, 0)
    finally:
        os.close(fd)


def _walk(fd: int, size: int, page_size: int, page_number: int, depth: int) -> Iterator[bytes]:
    if depth > _MAX_DEPTH or (page_number + 1) * page_size > size:
        raise ValueError(f"page {page_number} is outside the file")
    page = os.pread(fd, page_size, page_number * page_size)
    flags, lower = struct.unpack_from("<HH", page, 10)
    if flags & _P_LEAF2 or not flags & (_P_BRANCH | _P_LEAF) or not _HEADER <= lower <= page_size:
        raise ValueError(f"page {page_number} is not a branch or leaf page")
    for k in range((lower - _HEADER) // 2):
        (offset,) = struct.unpack_from("<H", page, _HEADER + 2 * k)
        if offset + 8 > page_size:
            raise ValueError(f"page {page_number}: node {k} is outside the page")
        low, high, node_flags, key_size = struct.unpack_from("<HHHH", page, offset)
        if flags & _P_BRANCH:
            yield from _walk(fd, size, page_size, low | high << 16 | node_flags << 32, depth + 1)
        elif offset + 8 + key_size > page_size:
            raise ValueError(f"page {page_number}: key {k} is outside the page")
        else:
            yield page[offset + 8 : offset + 8 + key_size]
