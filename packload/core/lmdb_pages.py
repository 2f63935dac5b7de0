"""Where each value of an LMDB file lies, read from its B-tree with every field checked against the file.

py-lmdb trusts the file it maps: a damaged page can make it, or code that follows its pointers, read
past the end of the map, and the process dies with SIGBUS. A pack comes from elsewhere, so packload
locates values itself. ``LmdbLayout`` reads the file through a read-only buffer of the whole of it (an
``mmap``, ``bytes`` or ``memoryview``) with ``struct`` and slicing only, so no read can leave the
buffer, and it checks each field against the file before it uses it. A damaged file gives
``PackFormatError``, never a signal and never a place outside the file.

It reads the part of LMDB's format that packload's packs use (described in ``packload.core.lmdb_meta``).

Opening reads the metas and the branch pages. A leaf page is read and checked when a key on it is
first asked for, and the header of a value's overflow run when that value is first asked for, so
opening a large pack reads a handful of pages.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator
from itertools import pairwise

import numpy as np

from packload.core.errors import PackFormatError
from packload.core.lmdb_meta import (
    DAMAGED,
    HEADER,
    P_BRANCH,
    P_INVALID,
    P_LEAF,
    P_OVERFLOW,
    PAGE_HEADER,
    UNSUPPORTED,
    current_meta,
    damaged,
)

Buffer = bytes | bytearray | memoryview | mmap.mmap
# Called with (file offset, length) pairs, in file order, just before those bytes are read (a level of
# branch pages, a batch of leaf pages, a batch of overflow headers), so that a reader on network
# storage can fetch them in parallel. It must not call back into the layout.
PrefetchHook = Callable[[list[tuple[int, int]]], None]

F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04

_OVERFLOW_HEADER = struct.Struct("<QHHI")  # pgno, pad, flags, pages
_NODE = struct.Struct("<HHHH")  # lo, hi, flags, ksize
_PGNO = struct.Struct("<Q")
NODE_HEADER = _NODE.size
_LEAVES_PER_BATCH = 256  # leaf pages items() reads (and hands to the prefetch hook) at a time

_CLOSED = b""  # the buffer of a closed layout: any read of it fails its bounds check


class _Leaf:
    """One parsed leaf page: its keys in order and where each value lies."""

    __slots__ = ("keys", "offsets", "sizes", "unchecked")

    def __init__(self) -> None:
        self.keys: list[bytes] = []
        self.offsets: list[int] = []  # file offset of each value
        self.sizes: list[int] = []
        self.unchecked: dict[int, int] = {}  # node -> first overflow page, for runs whose header is not checked yet


def _key_successor(prefix: bytes) -> bytes | None:
    """The smallest key above every key that starts with ``prefix`` (None: there is none)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` sorted, with touching or overlapping ones joined."""
    out: list[tuple[int, int]] = []
    for start, length in sorted(ranges):
        if out and start <= out[-1][0] + out[-1][1]:
            last_start, last_length = out[-1]
            out[-1] = (last_start, max(last_length, start + length - last_start))
        else:
            out.append((start, length))
    return out


def file_keys(path: str) -> list[bytes]:
    """Every key of the LMDB file ``path``, in order, read from its pages (every field checked; a
    damaged or foreign file gives ``PackFormatError``). For a file that py-lmdb will not open: LMDB
    refuses a second environment on a file this process already has open."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise PackFormatError(f"{path}: an empty file, not an LMDB file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            layout = LmdbLayout(data, path)
            try:
                return [key for key, _, _ in layout.items(headers=False)]
            finally:
                layout.close()


class LmdbLayout:
    """Where every value of an LMDB file lies, from its B-tree, every page checked against the file.

    ``data`` is the whole file, read-only; it is kept (``close`` drops it). ``where`` names the file in
    errors. ``prefetch`` (see ``PrefetchHook``) learns which bytes are about to be read. Keys compare as
    LMDB's default order does (bytewise, a prefix first), which is Python's order of ``bytes``.
    """

    def __init__(self, data: Buffer, where: str, prefetch: PrefetchHook | None = None) -> None:
        self.where = where
        self._data = data
        self._prefetch = prefetch
        self._lock = threading.Lock()  # leaves and overflow headers are checked once, and counted once
        meta = current_meta(data, where)
        self._meta = meta
        # LMDB counts pages that a transaction took and freed again as used, without writing them: the
        # file can end before last_pgno. Pages past its end are never in the tree, and none is read.
        self._last_page = min(meta.last_pgno, len(data) // meta.page_size - 1)
        if meta.root != P_INVALID:
            self._check_page_number(meta.root, 1, meta.page, "the root page")
        self.page_size = meta.page_size
        self.txnid = meta.txnid
        self.entries = meta.entries
        self.depth = meta.depth
        self._tree_pages: list[int] = []  # every branch and leaf page, sorted
        self._leaf_pages: list[int] = []  # in key order, with the bounds of each one's keys:
        self._lows: list[bytes] = []  # every key of leaf i is >= lows[i] ...
        self._highs: list[bytes | None] = []  # ... and < highs[i] (None: no bound)
        self._walk_branches()
        self._leaves: list[_Leaf | None] = [None] * len(self._leaf_pages)
        self._leaves_parsed = 0
        self._entries_seen = 0
        self._big_values = 0  # values on overflow pages, in the leaves parsed so far
        self._runs: list[tuple[int, int]] = []  # (first page, pages) of each overflow run checked
        self._failure: PackFormatError | None = None  # see _check_totals

    # -- public --------------------------------------------------------------------------------
    def locate(self, key: bytes) -> tuple[int, int] | None:
        """(file offset, size) of the value of ``key``, or None when the key is absent."""
        with self._lock:
            self._raise_failure()
            leaf = self._leaf_of(key)
            if leaf < 0:
                return None
            self._load([leaf])
            node = self._find(leaf, key)
            if node is None:
                return None
            self._check_overflows([node])
            return self._span(node)

    def locate_many(self, keys: Iterable[bytes]) -> list[tuple[int, int] | None]:
        """``locate`` for each of ``keys``, reading the leaf pages they need in one batch, then the
        overflow headers in another (one call of the prefetch hook each)."""
        keys = list(keys)
        with self._lock:
            self._raise_failure()
            leaves = [self._leaf_of(key) for key in keys]
            self._load(sorted({leaf for leaf in leaves if leaf >= 0}))
            nodes = [self._find(leaf, key) if leaf >= 0 else None for key, leaf in zip(keys, leaves, strict=True)]
            self._check_overflows([node for node in nodes if node is not None])
            return [None if node is None else self._span(node) for node in nodes]

    def items(self, prefix: bytes = b"", headers: bool = True) -> Iterator[tuple[bytes, int, int]]:
        """(key, file offset, size) of every value whose key starts with ``prefix``, in key order. Leaf
        pages are read (and handed to the prefetch hook) a few hundred at a time.

        ``headers=False`` leaves the values' overflow headers unread (each value's first page: one
        random read per value with a cold cache). Every place given is inside the file either way:
        a value's whole run is checked against the database and the file when its leaf is read; the
        header only confirms that the run was written as the leaf says."""
        if not self._leaf_pages:
            return
        successor = _key_successor(prefix)
        first = self._leaf_of(prefix)
        stop = len(self._leaf_pages) if successor is None else bisect_left(self._lows, successor)
        for start in range(first, stop, _LEAVES_PER_BATCH):
            batch = range(start, min(start + _LEAVES_PER_BATCH, stop))
            with self._lock:
                self._raise_failure()
                self._load(list(batch))
                nodes = []
                for i in batch:
                    keys = self._leaves[i].keys
                    end = len(keys) if successor is None else bisect_left(keys, successor)
                    nodes += [(i, j) for j in range(bisect_left(keys, prefix), end)]
                if headers:
                    self._check_overflows(nodes)
                found = [(self._leaves[i].keys[j], *self._span((i, j))) for i, j in nodes]
            yield from found

    def table(self, prefix: bytes, count: int, headers: bool = True) -> np.ndarray:
        """Where the values of keys ``prefix`` + 8-byte big-endian number 0..count-1 lie: an int64 array
        of shape (2, count), file offsets then sizes, -1 for a number that has no key. Other keys under
        ``prefix`` are left out. ``headers``: as for :meth:`items`."""
        numbers, offsets, sizes = [], [], []
        width = len(prefix) + 8
        for key, offset, size in self.items(prefix, headers):
            number = int.from_bytes(key[len(prefix):], "big") if len(key) == width else count
            if number < count:
                numbers.append(number)
                offsets.append(offset)
                sizes.append(size)
        out = np.full((2, count), -1, np.int64)
        out[0, numbers] = offsets
        out[1, numbers] = sizes
        return out

    def close(self) -> None:
        """Drop the reference to the buffer (an ``mmap`` can then be closed); the layout reads no more."""
        self._data = _CLOSED

    # -- errors --------------------------------------------------------------------------------
    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _damaged(self, what: str, page: int | None = None) -> PackFormatError:
        return damaged(self.where, what, page)

    # -- pages ---------------------------------------------------------------------------------
    def _read(self, offset: int, length: int) -> bytes:
        """A copy of ``length`` bytes at ``offset``, which the caller has checked lie in the file."""
        out = bytes(self._data[offset : offset + length])
        if len(out) != length:
            raise ValueError(f"{self.where}: the LMDB layout is closed")
        return out

    def _page(self, pgno: int, flags: int) -> tuple[bytes, tuple[int, ...], int]:
        """Branch or leaf page ``pgno`` (a copy, so what is checked is what is used), its node offsets
        and its ``upper``, the header checked. The caller has checked that the page is in the file."""
        size = self.page_size
        page = self._read(pgno * size, size)
        number, _, page_flags, lower, upper = PAGE_HEADER.unpack_from(page)
        if number != pgno:
            raise self._damaged(f"the page header says page {number}", pgno)
        if page_flags != flags:
            kind = "branch" if flags == P_BRANCH else "leaf"
            raise self._damaged(f"flags 0x{page_flags:x} where a {kind} page (0x{flags:x}) belongs", pgno)
        if not HEADER <= lower <= upper <= size or (lower - HEADER) % 2:
            raise self._damaged(f"node array bounds lower {lower}, upper {upper}", pgno)
        offsets = struct.unpack_from(f"<{(lower - HEADER) // 2}H", page, HEADER)
        return page, offsets, upper

    def _check_disjoint(self, pgno: int, extents: list[tuple[int, int]]) -> None:
        """No two nodes of page ``pgno`` overlap (each (start, end) in page offsets)."""
        extents.sort()
        for (_, end), (start, _) in pairwise(extents):
            if start < end:
                raise self._damaged(f"nodes overlap at offset {start}", pgno)

    def _check_page_number(self, first: int, pages: int, referrer: int, what: str) -> None:
        """Pages first..first+pages-1 (``what``, named on page ``referrer``) are database pages in the file."""
        last = first + pages - 1
        span = f"page {first}" if pages == 1 else f"pages {first}..{last}"
        if not 2 <= first or last > self._meta.last_pgno:
            raise self._damaged(f"{what} ({span}) lies outside the database (pages 2..{self._meta.last_pgno})",
                                referrer)
        if last > self._last_page:
            raise self._damaged(f"{what} ({span}) lies past the end of the file ({self._last_page + 1} pages): "
                                "truncated?", referrer)

    def _check_child(self, pgno: int, child: int, seen: set[int]) -> None:
        self._check_page_number(child, 1, pgno, "a child page")
        if child in seen:
            raise self._damaged(f"page {child} is reached twice", pgno)
        seen.add(child)

    def _branch(self, pgno: int, low: bytes, high: bytes | None,
                seen: set[int]) -> list[tuple[int, bytes, bytes | None]]:
        """The children of branch page ``pgno`` whose keys lie in [low, high), each with its bounds."""
        page, offsets, upper = self._page(pgno, P_BRANCH)
        if not offsets:
            raise self._damaged("a branch page without children", pgno)
        size = self.page_size
        children: list[int] = []
        keys: list[bytes] = []
        extents = []
        for i, at in enumerate(offsets):
            if not upper <= at <= size - NODE_HEADER:
                raise self._damaged(f"node {i} at offset {at}, outside {upper}..{size - NODE_HEADER}", pgno)
            lo, hi, flags, key_size = _NODE.unpack_from(page, at)
            end = at + NODE_HEADER + key_size
            if end > size:
                raise self._damaged(f"node {i}'s key runs past the page", pgno)
            extents.append((at, end))
            key = low if i == 0 else page[at + NODE_HEADER : end]  # the first key stands for `low`
            if i and (key <= keys[-1] or (high is not None and key >= high)):
                raise self._damaged(f"node {i}'s key is out of order", pgno)
            child = lo | hi << 16 | flags << 32
            self._check_child(pgno, child, seen)
            children.append(child)
            keys.append(key)
        self._check_disjoint(pgno, extents)
        return [(child, keys[i], keys[i + 1] if i + 1 < len(keys) else high) for i, child in enumerate(children)]

    def _walk_branches(self) -> None:
        """Read every branch level, down to the list of leaf pages and their key bounds."""
        meta = self._meta
        if meta.root == P_INVALID:
            return
        seen = {meta.root}
        level: list[tuple[int, bytes, bytes | None]] = [(meta.root, b"", None)]
        branches = 0
        for _ in range(meta.depth - 1):
            self._fetch([(pgno * self.page_size, self.page_size) for pgno, _, _ in level])
            below: list[tuple[int, bytes, bytes | None]] = []
            for pgno, low, high in level:
                below += self._branch(pgno, low, high, seen)
            branches += len(level)
            level = below
        if (branches, len(level)) != (meta.branch_pages, meta.leaf_pages):
            raise self._damaged(f"the tree has {branches} branch and {len(level)} leaf pages, the meta says "
                                f"{meta.branch_pages} and {meta.leaf_pages}", meta.page)
        self._tree_pages = sorted(seen)
        self._leaf_pages = [pgno for pgno, _, _ in level]
        self._lows = [low for _, low, _ in level]
        self._highs = [high for _, _, high in level]

    def _fetch(self, ranges: list[tuple[int, int]]) -> None:
        if self._prefetch is not None and ranges:
            self._prefetch(_merged(ranges))

    # -- leaves --------------------------------------------------------------------------------
    def _leaf_of(self, key: bytes) -> int:
        """The leaf that would hold ``key`` (-1: the database is empty)."""
        return bisect_right(self._lows, key) - 1

    def _find(self, leaf: int, key: bytes) -> tuple[int, int] | None:
        """(leaf, node) of ``key`` in leaf ``leaf`` (read already), or None when it is not there."""
        keys = self._leaves[leaf].keys
        j = bisect_left(keys, key)
        return (leaf, j) if j < len(keys) and keys[j] == key else None

    def _load(self, leaves: list[int]) -> None:
        """Read and check the leaves ``leaves`` (indices) not read yet."""
        leaves = [i for i in leaves if self._leaves[i] is None]
        self._fetch([(self._leaf_pages[i] * self.page_size, self.page_size) for i in leaves])
        for i in leaves:
            leaf = self._parse_leaf(self._leaf_pages[i], self._lows[i], self._highs[i])
            self._leaves[i] = leaf
            self._leaves_parsed += 1
            self._entries_seen += len(leaf.keys)
            self._big_values += len(leaf.unchecked)
        if leaves and self._leaves_parsed == len(self._leaves):
            self._check_totals()

    def _parse_leaf(self, pgno: int, low: bytes, high: bytes | None) -> _Leaf:
        """Leaf page ``pgno``: every node inside the page, keys ascending within [low, high), and every
        value inside the page or (its first overflow page and its end) inside the database."""
        page, offsets, upper = self._page(pgno, P_LEAF)
        size = self.page_size
        base = pgno * size
        leaf = _Leaf()
        extents = []
        previous = None
        for i, at in enumerate(offsets):
            if not upper <= at <= size - NODE_HEADER:
                raise self._damaged(f"node {i} at offset {at}, outside {upper}..{size - NODE_HEADER}", pgno)
            lo, hi, flags, key_size = _NODE.unpack_from(page, at)
            value_size = lo | hi << 16
            key_end = at + NODE_HEADER + key_size
            if flags & (F_SUBDATA | F_DUPDATA):
                raise PackFormatError(f"{self.where}: LMDB page {pgno}: node {i} holds a sub-database or "
                                      f"duplicates (flags 0x{flags:x}); {UNSUPPORTED}, or if it is one, {DAMAGED}")
            if flags not in (0, F_BIGDATA):
                raise self._damaged(f"node {i} has unknown flags 0x{flags:x}", pgno)
            end = key_end + (_PGNO.size if flags else value_size)
            if end > size:
                raise self._damaged(f"node {i} runs past the page", pgno)
            extents.append((at, end))
            key = page[at + NODE_HEADER : key_end]
            if (key < low) if previous is None else (key <= previous):
                raise self._damaged(f"node {i}'s key is out of order", pgno)
            if high is not None and key >= high:
                raise self._damaged(f"node {i}'s key is above its branch's bound", pgno)
            previous = key
            if flags:
                first = self._overflow_start(pgno, i, _PGNO.unpack_from(page, key_end)[0], value_size)
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
        self._check_page_number(first, pages, pgno, f"node {node}'s value of {value_size} bytes")
        if self._tree_page_in(first, pages):
            raise self._damaged(f"node {node}'s value (from page {first}) lies over a page of the tree", pgno)
        return first

    def _tree_page_in(self, first: int, pages: int) -> bool:
        """Whether a branch or leaf page lies in pages first..first+pages-1."""
        i = bisect_left(self._tree_pages, first)
        return i < len(self._tree_pages) and self._tree_pages[i] < first + pages

    # -- overflow runs -------------------------------------------------------------------------
    def _check_overflows(self, nodes: list[tuple[int, int]]) -> None:
        """Check the overflow headers of the values at ``nodes`` ((leaf, node) pairs) not checked yet."""
        todo = [(i, j) for i, j in nodes if j in self._leaves[i].unchecked]
        self._fetch([(self._leaves[i].unchecked[j] * self.page_size, HEADER) for i, j in todo])
        for i, j in todo:
            leaf = self._leaves[i]
            first = leaf.unchecked.get(j)
            if first is None:  # two keys of the batch share the node
                continue
            self._check_run(self._leaf_pages[i], j, first, leaf.sizes[j])
            del leaf.unchecked[j]
        if todo and len(self._runs) == self._big_values and self._leaves_parsed == len(self._leaves):
            self._check_totals()

    def _check_run(self, pgno: int, node: int, first: int, value_size: int) -> None:
        """The header of the overflow run at page ``first`` (node ``node`` of leaf ``pgno``): its own
        number, the overflow flag, and a length that holds the value and stays inside the database."""
        number, _, flags, pages = _OVERFLOW_HEADER.unpack_from(self._read(first * self.page_size, HEADER))
        if number != first or flags != P_OVERFLOW:
            raise self._damaged(f"the overflow page of leaf {pgno}'s node {node} says page {number}, "
                                f"flags 0x{flags:x}", first)
        if not HEADER + value_size <= pages * self.page_size:
            raise self._damaged(f"an overflow run of {pages} pages for a value of {value_size} bytes", first)
        self._check_page_number(first, pages, first, "the overflow run")
        if self._tree_page_in(first, pages):
            raise self._damaged(f"an overflow run of {pages} pages over a page of the tree", first)
        self._runs.append((first, pages))

    def _span(self, node: tuple[int, int]) -> tuple[int, int]:
        leaf = self._leaves[node[0]]
        return leaf.offsets[node[1]], leaf.sizes[node[1]]

    # -- totals --------------------------------------------------------------------------------
    def _check_totals(self) -> None:
        """Once every leaf (and every overflow run) is read: the counts the meta keeps agree. A
        disagreement is kept, and raised again by every later lookup."""
        try:
            self._compare_totals()
        except PackFormatError as exc:
            self._failure = exc
            raise

    def _compare_totals(self) -> None:
        meta = self._meta
        if self._entries_seen != meta.entries:
            raise self._damaged(f"the tree holds {self._entries_seen} entries, the meta says {meta.entries}", meta.page)
        if len(self._runs) < self._big_values:
            return
        pages = sum(length for _, length in self._runs)
        if pages != meta.overflow_pages:
            raise self._damaged(f"the values fill {pages} overflow pages, the meta says {meta.overflow_pages}",
                                meta.page)
        runs = sorted(self._runs)
        for (first, length), (after, _) in pairwise(runs):
            if after < first + length:
                raise self._damaged(f"overflow runs at pages {first} and {after} overlap", after)
