"""LMDB's file layout, and its meta pages: the two pages at the start of an LMDB file that say where
its B-tree is, read and checked as LMDB checks them when it opens a file.

packload reads the part of the format that its packs use: the main (unnamed) database of an LMDB 0.9
file, with no sub-databases and no DUPSORT. The layout, from LMDB's ``mdb.c`` (64-bit builds; every
integer little-endian):

- a page header is 16 bytes: ``pgno`` u64, a u16 of padding, ``flags`` u16, then ``lower`` and
  ``upper`` u16 (branch and leaf pages: the end of the node-offset array and the start of the nodes),
  or ``pages`` u32 (the first page of an overflow run: the run's length in pages);
- pages 0 and 1 are metas: after the header, ``magic`` u32, ``version`` u32, ``address`` and
  ``mapsize`` u64, two database records (the free list's, whose first field holds the page size, then
  the main database's), ``last_pgno`` and ``txnid`` u64. LMDB uses the meta with the larger txnid;
- a database record is ``pad`` u32, ``flags`` u16, ``depth`` u16, then the counts of branch, leaf and
  overflow pages, ``entries`` and ``root`` (u64 each);
- a branch or leaf page holds, after its header, a u16 offset per node in key order, and the nodes at
  its end. A node is ``lo, hi, flags, ksize`` (u16 each), then the key. In a branch node
  ``lo | hi << 16 | flags << 32`` is the child page, and the first node's key is not used (that child
  holds every key below the second node's). In a leaf node ``lo | hi << 16`` is the value's size; the
  value follows the key, or with ``F_BIGDATA`` the number of its first overflow page (u64) does, and
  the value starts 16 bytes into that page.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass

from packload.core.errors import PackFormatError

Buffer = bytes | bytearray | memoryview | mmap.mmap
MAGIC = 0xBEEFC0DE
DATA_VERSION = 1
P_BRANCH, P_LEAF, P_OVERFLOW, P_META = 0x01, 0x02, 0x04, 0x08
P_INVALID = (1 << 64) - 1  # the root of an empty database
MAX_DEPTH = 32  # LMDB's cursor stack: no tree of LMDB's is deeper
MIN_PAGE_SIZE, MAX_PAGE_SIZE = 512, 65536
PAGE_HEADER = struct.Struct("<QHHHH")  # pgno, pad, flags, lower, upper
META = struct.Struct("<IIQQ" + "IHHQQQQQ" * 2 + "QQ")  # after the page header; see above
HEADER = PAGE_HEADER.size
META_END = HEADER + META.size  # the bytes of a meta page that are read
F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04  # a leaf node's flags
NODE = struct.Struct("<HHHH")  # a node of a branch or leaf page: lo, hi, flags, ksize
NODE_HEADER = NODE.size
PGNO = struct.Struct("<Q")  # a page number: a leaf's F_BIGDATA value, after its key
OVERFLOW_HEADER = struct.Struct("<QHHI")  # the first page of an overflow run: pgno, pad, flags, pages
DAMAGED = "the LMDB file is damaged: copy it again"
UNSUPPORTED = "packload reads LMDB files with one unnamed database and no DUPSORT: give the .lmdb file `pack` wrote"


@dataclass(frozen=True)
class Meta:
    """The fields of one meta page that this reader uses."""

    page: int
    page_size: int
    flags: int  # of the main database
    depth: int
    branch_pages: int
    leaf_pages: int
    overflow_pages: int
    entries: int
    root: int
    last_pgno: int
    txnid: int


def damaged(where: str, what: str, page: int | None = None) -> PackFormatError:
    """The error for a damaged LMDB file ``where``: what is wrong, on which page."""
    place = "" if page is None else f"LMDB page {page}: "
    return PackFormatError(f"{where}: {place}{what}; {DAMAGED}")


def starts_as_lmdb(head: bytes) -> bool:
    """Whether ``head``, the first bytes of a file, begin LMDB's first meta page (its magic number)."""
    return len(head) >= META_END and struct.unpack_from("<I", head, HEADER)[0] == MAGIC


def read_meta(data: Buffer, where: str, page: int, offset: int) -> Meta:
    """Meta page ``page`` at ``offset``, checked as LMDB checks it when it opens a file."""
    size = len(data)
    if offset + META_END > size:
        raise damaged(where, f"{size} bytes: too short for meta page {page} of an LMDB file")
    pgno, _, flags, _, _ = PAGE_HEADER.unpack_from(data, offset)
    (magic, version, _address, _mapsize, free_pad, _, _, _, _, _, _, _,
     _, main_flags, depth, branch, leaf, overflow, entries, root, last_pgno, txnid) = \
        META.unpack_from(data, offset + HEADER)
    if magic != MAGIC:
        raise PackFormatError(f"{where}: not an LMDB file (meta page {page} has magic 0x{magic:08x}); "
                              f"give the .lmdb file `pack` wrote, or if it is one, {DAMAGED}")
    if version != DATA_VERSION:
        raise PackFormatError(f"{where}: LMDB data version {version} in meta page {page}; this reader "
                              f"knows version {DATA_VERSION} (LMDB 0.9). Give the .lmdb file `pack` wrote, "
                              f"or if it is one, {DAMAGED}")
    if pgno != page or flags != P_META:
        raise damaged(where, f"meta page header says page {pgno}, flags 0x{flags:x}", page)
    return Meta(page, free_pad, main_flags, depth, branch, leaf, overflow, entries, root, last_pgno, txnid)


def current_meta(data: Buffer, where: str) -> Meta:
    """The meta LMDB would use: of the two (both must be sound), the one of the larger txnid."""
    first = read_meta(data, where, 0, 0)
    page_size = first.page_size
    if not MIN_PAGE_SIZE <= page_size <= MAX_PAGE_SIZE or page_size & (page_size - 1):
        raise damaged(where, f"page size {page_size} is not a power of two in {MIN_PAGE_SIZE}..{MAX_PAGE_SIZE}", 0)
    second = read_meta(data, where, 1, page_size)
    if second.page_size != page_size:
        raise damaged(where, f"page size {second.page_size}, meta page 0 says {page_size}", 1)
    meta = second if second.txnid > first.txnid else first
    check_meta(meta, where)
    return meta


def check_meta(meta: Meta, where: str) -> None:
    if meta.flags:
        raise PackFormatError(f"{where}: the main database has flags 0x{meta.flags:x} (DUPSORT, integer "
                              f"or reversed keys); {UNSUPPORTED}, or if it is one, {DAMAGED}")
    if meta.last_pgno < 1:
        raise damaged(where, f"the database ends at page {meta.last_pgno}, before its metas", meta.page)
    counts = (meta.depth, meta.entries, meta.branch_pages, meta.leaf_pages, meta.overflow_pages)
    if meta.root == P_INVALID:
        if any(counts):
            raise damaged(where, f"an empty database with depth, entries or page counts {counts}", meta.page)
        return
    if not 1 <= meta.depth <= MAX_DEPTH:
        raise damaged(where, f"depth {meta.depth}, not in 1..{MAX_DEPTH}", meta.page)
