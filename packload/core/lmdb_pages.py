"""Where each value of an LMDB file lies, read from its B-tree with every field checked against the file.

py-lmdb trusts the file it maps: a damaged page can make it, or code that follows its pointers, read
past the end of the map, and the process dies with SIGBUS. A pack comes from elsewhere, so packload
locates values itself. ``LmdbLayout`` reads the file through a read-only buffer of the whole of it (an
``mmap``, ``bytes`` or ``memoryview``) with ``struct`` and slicing only, so no read can leave the
buffer, and it checks each field against the file before it uses it (the pages are read and checked
by ``packload.core.lmdb_tree``). A damaged file gives ``PackFormatError``, never a signal and never a
place outside the file.

It reads the part of LMDB's format that packload's packs use (described in ``packload.core.lmdb_meta``).

Opening reads the metas and the branch pages. A leaf page is read and checked when a key on it is
first asked for, and the header of a value's overflow run when that value is first asked for, so
opening a large pack reads a handful of pages.
"""

from __future__ import annotations

import mmap
import os
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator
from itertools import pairwise
from typing import Any

import numpy as np

from packload.core.errors import PackFormatError
from packload.core.lmdb_meta import F_BIGDATA, HEADER, NODE_HEADER, Buffer, current_meta
from packload.core.lmdb_tree import Leaf, LmdbTree, PrefetchHook

# The node layout's names, as tests and callers have imported them from here.
__all__ = ["F_BIGDATA", "NODE_HEADER", "Buffer", "LmdbLayout", "PrefetchHook", "file_keys"]

_LEAVES_PER_BATCH = 256  # leaf pages items() reads (and hands to the prefetch hook) at a time


def _key_successor(prefix: bytes) -> bytes | None:
    """The smallest key above every key that starts with ``prefix`` (None: there is none)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _from_file(path: str, read: Callable[[LmdbLayout], Any]) -> Any:
    """``read`` of the layout of the LMDB file ``path`` (mapped for the call, then let go)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise PackFormatError(f"{path}: an empty file, not an LMDB file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            layout = LmdbLayout(data, path)
            try:
                return read(layout)
            finally:
                layout.close()


def file_keys(path: str) -> list[bytes]:
    """Every key of the LMDB file ``path``, in order, read from its pages (every field checked; a
    damaged or foreign file gives ``PackFormatError``). For a file that py-lmdb will not open: LMDB
    refuses a second environment on a file this process already has open."""
    return _from_file(path, lambda layout: [key for key, _, _ in layout.items(headers=False)])


def file_place(path: str, key: bytes) -> tuple[int, int] | None:
    """(offset, size) of ``key``'s value in the LMDB file ``path``, or None where it has none: read
    from its pages, as ``file_keys`` reads them (so also while an environment has the file open)."""
    return _from_file(path, lambda layout: layout.locate(key))


class LmdbLayout:
    """Where every value of an LMDB file lies, from its B-tree, every page checked against the file.

    ``data`` is the whole file, read-only; it is kept (``close`` drops it). ``where`` names the file in
    errors. ``prefetch`` (see ``PrefetchHook``) learns which bytes are about to be read. Keys compare as
    LMDB's default order does (bytewise, a prefix first), which is Python's order of ``bytes``.
    """

    def __init__(self, data: Buffer, where: str, prefetch: PrefetchHook | None = None) -> None:
        self.where = where
        self._lock = threading.Lock()  # leaves and overflow headers are checked once, and counted once
        meta = current_meta(data, where)
        self._meta = meta
        self._tree = LmdbTree(data, where, meta, prefetch)
        self.page_size = meta.page_size
        self.txnid = meta.txnid
        self.entries = meta.entries
        self.depth = meta.depth
        leaves = self._tree.walk()
        self._leaf_pages = [pgno for pgno, _, _ in leaves]  # in key order, with the bounds of each one's keys:
        self._lows = [low for _, low, _ in leaves]  # every key of leaf i is >= lows[i] ...
        self._highs = [high for _, _, high in leaves]  # ... and < highs[i] (None: no bound)
        self._leaves: list[Leaf | None] = [None] * len(self._leaf_pages)
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
        self._tree.close()

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
        self._tree.fetch([(self._leaf_pages[i] * self.page_size, self.page_size) for i in leaves])
        for i in leaves:
            leaf = self._tree.leaf(self._leaf_pages[i], self._lows[i], self._highs[i])
            self._leaves[i] = leaf
            self._leaves_parsed += 1
            self._entries_seen += len(leaf.keys)
            self._big_values += len(leaf.unchecked)
        if leaves and self._leaves_parsed == len(self._leaves):
            self._check_totals()

    def _check_overflows(self, nodes: list[tuple[int, int]]) -> None:
        """Check the overflow headers of the values at ``nodes`` ((leaf, node) pairs) not checked yet."""
        todo = [(i, j) for i, j in nodes if j in self._leaves[i].unchecked]
        self._tree.fetch([(self._leaves[i].unchecked[j] * self.page_size, HEADER) for i, j in todo])
        for i, j in todo:
            leaf = self._leaves[i]
            first = leaf.unchecked.get(j)
            if first is None:  # two keys of the batch share the node
                continue
            self._runs.append(self._tree.check_run(self._leaf_pages[i], j, first, leaf.sizes[j]))
            del leaf.unchecked[j]
        if todo and len(self._runs) == self._big_values and self._leaves_parsed == len(self._leaves):
            self._check_totals()

    def _span(self, node: tuple[int, int]) -> tuple[int, int]:
        leaf = self._leaves[node[0]]
        return leaf.offsets[node[1]], leaf.sizes[node[1]]

    # -- totals --------------------------------------------------------------------------------
    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

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
        damaged = self._tree.damaged
        if self._entries_seen != meta.entries:
            raise damaged(f"the tree holds {self._entries_seen} entries, the meta says {meta.entries}", meta.page)
        if len(self._runs) < self._big_values:
            return
        pages = sum(length for _, length in self._runs)
        if pages != meta.overflow_pages:
            raise damaged(f"the values fill {pages} overflow pages, the meta says {meta.overflow_pages}", meta.page)
        runs = sorted(self._runs)
        for (first, length), (after, _) in pairwise(runs):
            if after < first + length:
                raise damaged(f"overflow runs at pages {first} and {after} overlap", after)
