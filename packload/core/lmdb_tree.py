"""The pages of an LMDB file's B-tree, each read from a buffer of the whole file and checked against
the file before anything on it is used.

``LmdbTree`` reads through a read-only buffer (an ``mmap``, ``bytes`` or ``memoryview``) with
``struct`` and slicing only, so no read can leave the buffer: a branch page's children, a leaf
page's keys and where each value lies, an overflow run's header. Every page number is checked to be
a page of the database inside the file, every node to lie inside its page, every key to be in
order and within its branch's bounds. A damaged file gives ``PackFormatError``. The layout is
``packload.core.lmdb_meta``'s.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections.abc import Callable
from itertools import pairwise

from packload.core.errors import PackFormatError
from packload.core.lmdb_meta import (
    DAMAGED,
    F_BIGDATA,
    F_DUPDATA,
    F_SUBDATA,
    HEADER,
    NODE,
    NODE_HEADER,
    OVERFLOW_HEADER,
    P_BRANCH,
    P_INVALID,
    P_LEAF,
    P_OVERFLOW,
    PAGE_HEADER,
    PGNO,
    UNSUPPORTED,
    Buffer,
    Meta,
    damaged,
)

# Called with (file offset, length) pairs, in file order, just before those bytes are read (a level of
# branch pages, a batch of leaf pages, a batch of overflow headers), so that a reader on network
# storage can fetch them in parallel. It must not call back into the layout.
PrefetchHook = Callable[[list[tuple[int, int]]], None]

CLOSED = b""  # the buffer of a closed tree: any read of it fails its bounds check

Bounded = tuple[int, bytes, bytes | None]  # a page and the bounds of its keys: low <= key < high (None: none)


class Leaf:
    """One parsed leaf page: its keys in order and where each value lies."""

    __slots__ = ("keys", "offsets", "sizes", "unchecked")

    def __init__(self) -> None:
        self.keys: list[bytes] = []
        self.offsets: list[int] = []  # file offset of each value
        self.sizes: list[int] = []
        self.unchecked: dict[int, int] = {}  # node -> first overflow page, for runs whose header is not checked yet


def merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` sorted, with touching or overlapping ones joined."""
    out: list[tuple[int, int]] = []
    for start, length in sorted(ranges):
        if out and start <= out[-1][0] + out[-1][1]:
            last_start, last_length = out[-1]
            out[-1] = (last_start, max(last_length, start + length - last_start))
        else:
            out.append((start, length))
    return out


class LmdbTree:
    """The B-tree of the LMDB file ``data`` (whose current meta is ``meta``), read page by page.

    ``walk`` reads the branch pages, once, down to the leaves; ``leaf`` and ``check_run`` then read
    a leaf page and an overflow run's header. ``prefetch`` learns which bytes are about to be read."""

    def __init__(self, data: Buffer, where: str, meta: Meta, prefetch: PrefetchHook | None = None) -> None:
        self.data = data
        self.where = where
        self.meta = meta
        self.page_size = meta.page_size
        self.prefetch = prefetch
        # LMDB counts pages that a transaction took and freed again as used, without writing them: the
        # file can end before last_pgno. Pages past its end are never in the tree, and none is read.
        self.last_page = min(meta.last_pgno, len(data) // meta.page_size - 1)
        if meta.root != P_INVALID:
            self.check_page_number(meta.root, 1, meta.page, "the root page")
        self.tree_pages: list[int] = []  # every branch and leaf page, sorted (known once walked)

    def damaged(self, what: str, page: int | None = None) -> PackFormatError:
        return damaged(self.where, what, page)

    def fetch(self, ranges: list[tuple[int, int]]) -> None:
        """Tell the prefetch hook of the bytes about to be read."""
        if self.prefetch is not None and ranges:
            self.prefetch(merged(ranges))

    def close(self) -> None:
        """Drop the reference to the buffer (an ``mmap`` can then be closed); the tree reads no more."""
        self.data = CLOSED

    # -- pages ---------------------------------------------------------------------------------
    def read(self, offset: int, length: int) -> bytes:
        """A copy of ``length`` bytes at ``offset``, which the caller has checked lie in the file."""
        out = bytes(self.data[offset : offset + length])
        if len(out) != length:
            raise ValueError(f"{self.where}: the LMDB layout is closed")
        return out

    def page(self, pgno: int, flags: int) -> tuple[bytes, tuple[int, ...], int]:
        """Branch or leaf page ``pgno`` (a copy, so what is checked is what is used), its node offsets
        and its ``upper``, the header checked. The caller has checked that the page is in the file."""
        size = self.page_size
        page = self.read(pgno * size, size)
        number, _, page_flags, lower, upper = PAGE_HEADER.unpack_from(page)
        if number != pgno:
            raise self.damaged(f"the page header says page {number}", pgno)
        if page_flags != flags:
            kind = "branch" if flags == P_BRANCH else "leaf"
            raise self.damaged(f"flags 0x{page_flags:x} where a {kind} page (0x{flags:x}) belongs", pgno)
        if not HEADER <= lower <= upper <= size or (lower - HEADER) % 2:
            raise self.damaged(f"node array bounds lower {lower}, upper {upper}", pgno)
        offsets = struct.unpack_from(f"<{(lower - HEADER) // 2}H", page, HEADER)
        return page, offsets, upper

    def check_page_number(self, first: int, pages: int, referrer: int, what: str) -> None:
        """Pages first..first+pages-1 (``what``, named on page ``referrer``) are database pages in the file."""
        last = first + pages - 1
        span = f"page {first}" if pages == 1 else f"pages {first}..{last}"
        if not 2 <= first or last > self.meta.last_pgno:
            raise self.damaged(f"{what} ({span}) lies outside the database (pages 2..{self.meta.last_pgno})",
                               referrer)
        if last > self.last_page:
            raise self.damaged(f"{what} ({span}) lies past the end of the file ({self.last_page + 1} pages): "
                               "truncated?", referrer)

    def _check_disjoint(self, pgno: int, extents: list[tuple[int, int]]) -> None:
        """No two nodes of page ``pgno`` overlap (each (start, end) in page offsets)."""
        extents.sort()
        for (_, end), (start, _) in pairwise(extents):
            if start < end:
                raise self.damaged(f"nodes overlap at offset {start}", pgno)

    def _node(self, page: bytes, pgno: int, i: int, at: int, upper: int) -> tuple[int, int, int, int]:
        """Node ``i`` of page ``pgno`` at offset ``at``, its header inside the page: lo, hi, flags, ksize."""
        if not upper <= at <= self.page_size - NODE_HEADER:
            raise self.damaged(f"node {i} at offset {at}, outside {upper}..{self.page_size - NODE_HEADER}", pgno)
        return NODE.unpack_from(page, at)

    # -- branches ------------------------------------------------------------------------------
    def walk(self) -> list[Bounded]:
        """Read every branch level, down to the list of leaf pages and their key bounds, in key order."""
        meta = self.meta
        if meta.root == P_INVALID:
            return []
        seen = {meta.root}
        level: list[Bounded] = [(meta.root, b"", None)]
        branches = 0
        for _ in range(meta.depth - 1):
            self.fetch([(pgno * self.page_size, self.page_size) for pgno, _, _ in level])
            below: list[Bounded] = []
            for pgno, low, high in level:
                below += self._branch(pgno, low, high, seen)
            branches += len(level)
            level = below
        if (branches, len(level)) != (meta.branch_pages, meta.leaf_pages):
            raise self.damaged(f"the tree has {branches} branch and {len(level)} leaf pages, the meta says "
                               f"{meta.branch_pages} and {meta.leaf_pages}", meta.page)
        self.tree_pages = sorted(seen)
        return level

    def _branch(self, pgno: int, low: bytes, high: bytes | None, seen: set[int]) -> list[Bounded]:
        """The children of branch page ``pgno`` whose keys lie in [low, high), each with its bounds."""
        page, offsets, upper = self.page(pgno, P_BRANCH)
        if not offsets:
            raise self.damaged("a branch page without children", pgno)
        size = self.page_size
        children: list[int] = []
        keys: list[bytes] = []
        extents = []
        for i, at in enumerate(offsets):
            lo, hi, flags, key_size = self._node(page, pgno, i, at, upper)
            end = at + NODE_HEADER + key_size
            if end > size:
                raise self.damaged(f"node {i}'s key runs past the page", pgno)
            extents.append((at, end))
            key = low if i == 0 else page[at + NODE_HEADER : end]  # the first key stands for `low`
            if i and (key <= keys[-1] or (high is not None and key >= high)):
                raise self.damaged(f"node {i}'s key is out of order", pgno)
            child = lo | hi << 16 | flags << 32
            self._check_child(pgno, child, seen)
            children.append(child)
            keys.append(key)
        self._check_disjoint(pgno, extents)
        return [(child, keys[i], keys[i + 1] if i + 1 < len(keys) else high) for i, child in enumerate(children)]

    def _check_child(self, pgno: int, child: int, seen: set[int]) -> None:
        self.check_page_number(child, 1, pgno, "a child page")
        if child in seen:
            raise self.damaged(f"page {child} is reached twice", pgno)
        seen.add(child)

    # -- leaves --------------------------------------------------------------------------------
    def leaf(self, pgno: int, low: bytes, high: bytes | None) -> Leaf:
        """Leaf page ``pgno``: every node inside the page, keys ascending within [low, high), and every
        value inside the page or (its first overflow page and its end) inside the database."""
        page, offsets, upper = self.page(pgno, P_LEAF)
        size = self.page_size
        base = pgno * size
        leaf = Leaf()
        extents = []
        previous = None
        for i, at in enumerate(offsets):
            lo, hi, flags, key_size = self._node(page, pgno, i, at, upper)
            value_size = lo | hi << 16
            key_end = at + NODE_HEADER + key_size
            if flags & (F_SUBDATA | F_DUPDATA):
                raise PackFormatError(f"{self.where}: LMDB page {pgno}: node {i} holds a sub-database or "
                                      f"duplicates (flags 0x{flags:x}); {UNSUPPORTED}, or if it is one, {DAMAGED}")
            if flags not in (0, F_BIGDATA):
                raise self.damaged(f"node {i} has unknown flags 0x{flags:x}", pgno)
            end = key_end + (PGNO.size if flags else value_size)
            if end > size:
                raise self.damaged(f"node {i} runs past the page", pgno)
            extents.append((at, end))
            key = page[at + NODE_HEADER : key_end]
            if (key < low) if previous is None else (key <= previous):
                raise self.damaged(f"node {i}'s key is out of order", pgno)
            if high is not None and key >= high:
                raise self.damaged(f"node {i}'s key is above its branch's bound", pgno)
            previous = key
            if flags:
                first = self._overflow_start(pgno, i, PGNO.unpack_from(page, key_end)[0], value_size)
                leaf.unchecked[i] = first
                leaf.offsets.append(first * size + HEADER)
            else:
                leaf.offsets.append(base + key_end)
            leaf.keys.append(key)
            leaf.sizes.append(value_size)
        self._check_disjoint(pgno, extents)
        return leaf

    def _overflow_start(self, pgno: int, node: int, first: int, value_size: int) -> int:
        """``first``, the first overflow page of node ``node`` of leaf ``pgno``, checked: a page of the
        database, not of the tree, and the value's end inside the database."""
        pages = (HEADER + value_size + self.page_size - 1) // self.page_size
        self.check_page_number(first, pages, pgno, f"node {node}'s value of {value_size} bytes")
        if self._tree_page_in(first, pages):
            raise self.damaged(f"node {node}'s value (from page {first}) lies over a page of the tree", pgno)
        return first

    def _tree_page_in(self, first: int, pages: int) -> bool:
        """Whether a branch or leaf page lies in pages first..first+pages-1."""
        i = bisect_left(self.tree_pages, first)
        return i < len(self.tree_pages) and self.tree_pages[i] < first + pages

    # -- overflow runs -------------------------------------------------------------------------
    def check_run(self, pgno: int, node: int, first: int, value_size: int) -> tuple[int, int]:
        """The header of the overflow run at page ``first`` (node ``node`` of leaf ``pgno``): its own
        number, the overflow flag, and a length that holds the value and stays inside the database.
        Returns the run: (first page, pages)."""
        number, _, flags, pages = OVERFLOW_HEADER.unpack_from(self.read(first * self.page_size, HEADER))
        if number != first or flags != P_OVERFLOW:
            raise self.damaged(f"the overflow page of leaf {pgno}'s node {node} says page {number}, "
                               f"flags 0x{flags:x}", first)
        if not HEADER + value_size <= pages * self.page_size:
            raise self.damaged(f"an overflow run of {pages} pages for a value of {value_size} bytes", first)
        self.check_page_number(first, pages, first, "the overflow run")
        if self._tree_page_in(first, pages):
            raise self.damaged(f"an overflow run of {pages} pages over a page of the tree", first)
        return first, pages
