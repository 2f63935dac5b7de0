"""Asking the storage for a pack's bytes before they are read: which records were asked for
already, which 128 KiB pieces a batch or an announcement still needs, and how they are fetched.

On local disks a piece is asked for with ``posix_fadvise(WILLNEED)``: the kernel reads each run of
pieces in large requests while the caller goes on. On network and FUSE storage, where the kernel
keeps only a request or two in flight for such hints, pieces are read with many positioned reads in
flight at once (:class:`ParallelFetcher`); the memory maps then find the pages cached.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

PAGE = mmap.PAGESIZE
PREFETCH_RECORD_LIMIT = 1 << 30  # a longer record is not prefetched (the read reports a damaged one)
GRANULE_SHIFT = 17  # prefetch in whole 128 KiB granules: a FUSE request's and the default readahead's size
ADVISED_LIMIT = 1 << 17  # pieces (up to 16 GiB) asked for before the reader forgets which, and asks again
BLOCK_RECORDS = 64  # a batch's prefetch stops at the edges of such groups: PackSampler's default block_size
_BLOCK_SHIFT = 31  # a piece's key: block << 31 | part within the block << 25 | granule within the part's share
_PARTS_IN_BLOCK = 63
_IN_BLOCK = (1 << 25) - 1
_NO_LIMIT = 1 << 62

# (fd, file offset, length) of byte ranges to fetch, given parts and byte ranges within them, and
# which of the inputs they are (see ``PackReader.file_ranges``).
FileRanges = Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[list[tuple[int, int, int]], np.ndarray]]


def distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, sorted (``np.unique`` without its first-call import of ``numpy.ma``)."""
    values = np.sort(values)
    return values[np.concatenate([[True], values[1:] != values[:-1]])] if len(values) else values


def distinct_first(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values, sorted, and where each first occurs in ``values``."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    first = np.concatenate([[True], ordered[1:] != ordered[:-1]]) if len(values) else np.zeros(0, bool)
    return ordered[first], order[first]


class ParallelFetcher:
    """Fill the page cache for byte ranges of files with many positioned reads in flight at once.

    On network and FUSE filesystems ``WILLNEED`` hints and readahead keep only one or two requests
    in flight, so a batch's runs arrive one round trip after another; reading them in 128 KiB pieces
    from a few threads overlaps the round trips. The bytes read are dropped: the memory maps then
    find the pages cached. ``fetch`` waits for its reads (a batch's own); ``queue`` does not (a
    sampler's announcement), and runs on threads of its own so that it never delays a batch.
    Threads are started lazily, again in a forked child. ``threads=0``: fetch nothing this way."""

    def __init__(self, threads: int = 16) -> None:
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: ThreadPoolExecutor | None = None
        self._pid = 0

    def _pools(self) -> tuple[ThreadPoolExecutor, ThreadPoolExecutor]:
        if self._pool is None or self._ahead is None or self._pid != os.getpid():
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="packload-fetch")
            self._ahead = ThreadPoolExecutor(self.threads, thread_name_prefix="packload-ahead")
            self._pid = os.getpid()
        return self._pool, self._ahead

    def fetch(self, ranges: list[tuple[int, int, int]]) -> None:
        """Read every ``(fd, offset, length)`` range; returns when all are in the page cache."""
        step = 1 << GRANULE_SHIFT
        pieces = [(fd, o, min(step, off + n - o)) for fd, off, n in ranges for o in range(off, off + n, step)]
        for _ in self._pools()[0].map(read_piece, pieces):
            pass

    def queue(self, pieces: list[tuple[int, int, int]], keys: list[int], done: set[int]) -> None:
        """Start reading each ``(fd, offset, length)`` piece and return at once; a piece's key goes
        into ``done`` once it is read, and a piece whose key is there already is not read."""
        ahead = self._pools()[1]
        for piece, key in zip(pieces, keys, strict=True):
            ahead.submit(read_ahead, piece, key, done)

    def close(self) -> None:
        if self._pid == os.getpid():
            if self._pool is not None:
                self._pool.shutdown(wait=False)
            if self._ahead is not None:  # reads not started are dropped; the running ones finish
                self._ahead.shutdown(wait=True, cancel_futures=True)  # before their descriptors close
        self._pool = self._ahead = None


def read_piece(piece: tuple[int, int, int]) -> None:
    """Read one ``(fd, offset, length)`` piece into the page cache (the bytes are dropped)."""
    fd, offset, length = piece
    try:
        os.pread(fd, length, offset)
    except OSError:
        pass  # only a hint: the memory map reports real errors when the bytes are used


def read_ahead(piece: tuple[int, int, int], key: int, done: set[int]) -> None:
    """``read_piece`` unless a batch read it first; then note its key in ``done``."""
    if key not in done:  # a batch may have needed it first, and read it itself
        read_piece(piece)
        done.add(key)


class Prefetcher:
    """Asks the storage for the bytes of a pack's records, each piece once.

    ``entries`` is the pack's index; ``fetcher`` decides how (``threads`` 0: hints; else parallel
    reads). Each call is given ``file_ranges``, which turns parts and byte ranges within them into
    file ranges (the reader's: kept by the caller, so that no reference cycle keeps a closed
    reader's files open until the garbage collector runs)."""

    def __init__(self, entries: np.ndarray, fetcher: ParallelFetcher) -> None:
        self.entries = entries
        self.records = len(entries)
        self.fetcher = fetcher
        self._advised: set[int] = set()  # pieces already asked for
        self._asked: np.ndarray | None = None  # per record: all its pieces asked for

    def before_batch(self, positions: np.ndarray, parts: np.ndarray, ends: np.ndarray,
                     file_ranges: FileRanges) -> None:
        """Fetch what the given records need that was not asked for yet: each record's 128 KiB
        granules, cut at the edges of its group of ``BLOCK_RECORDS`` consecutive records (a
        ``PackSampler`` block, so a shuffled read does not fetch the neighbouring blocks' bytes
        too), each run of them as one range: ``POSIX_FADV_WILLNEED`` on local disks, parallel
        positioned reads on network and FUSE storage. Every run is fetched, small ones too, so a
        batch's requests overlap where page faults would wait one round trip each. A batch whose
        pieces were all asked for already (most batches of a sampler window) costs one lookup in
        a per-record table (a byte per record). On network and FUSE storage a piece announced by
        :meth:`advise` counts as asked for once the background has read it: until then a batch
        that needs it reads it itself. ``parts`` and ``ends`` (where each payload ends) are the
        caller's, as int64."""
        asked = self._asked_table()
        if asked[positions].all():
            return  # every piece of these records was asked for already
        self._prefetch_pieces(positions, parts, ends, file_ranges)
        asked[positions] = True

    def _asked_table(self) -> np.ndarray:
        """One flag per record: all its pieces asked for (by a batch's prefetch or by ``advise``)."""
        if self._asked is None:
            self._asked = np.zeros(self.records, dtype=bool)
        return self._asked

    def _prefetch_pieces(self, positions: np.ndarray, parts: np.ndarray, ends: np.ndarray,
                         file_ranges: FileRanges) -> None:
        """``before_batch``'s work: the pieces of these records not asked for yet, asked for."""
        fresh = self._fresh_pieces(positions, parts, ends)
        if fresh is None:
            return
        keys, piece_parts, lo, hi = fresh
        self._advised.update(keys.tolist())
        order = np.lexsort((lo, piece_parts))
        piece_parts, lo, hi = piece_parts[order], lo[order], hi[order]
        # Pieces that touch (or overlap) the one before in the same part join its run.
        new_run = np.ones(len(lo), dtype=bool)
        new_run[1:] = (piece_parts[1:] != piece_parts[:-1]) | (lo[1:] > hi[:-1])  # pieces do not overlap
        heads_at = np.flatnonzero(new_run)
        stops = np.maximum.reduceat(hi, heads_at)
        ranges = file_ranges(piece_parts[heads_at], lo[heads_at], stops)[0]
        if self.fetcher.threads:
            self.fetcher.fetch(ranges)
        else:  # what MADV_WILLNEED on the map does too, without locating each range in it
            for fd, offset, length in ranges:
                os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)

    def _fresh_pieces(self, positions: np.ndarray, parts: np.ndarray,
                      ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """The pieces these records need that were not asked for yet (not in ``_advised``): each
        one's key, part, and byte range in the part (``lo``, ``hi``); None if there are none."""
        entries = self.entries
        starts = entries["record_offset"][positions].astype(np.int64)
        keep = (ends > starts) & (ends - starts <= PREFETCH_RECORD_LIMIT)  # a huge record is read, not prefetched
        if not keep.all():
            positions, parts, starts, ends = positions[keep], parts[keep], starts[keep], ends[keep]
        # The block's first and last record bound what is fetched (when they lie in the same part).
        blocks = positions // BLOCK_RECORDS
        heads = blocks * BLOCK_RECORDS
        tails = np.minimum(heads + BLOCK_RECORDS, self.records) - 1
        head_parts = entries["part"][heads].astype(np.int64)
        floor = np.where(head_parts == parts, entries["record_offset"][heads].astype(np.int64), 0)
        ceiling = np.where(entries["part"][tails] == parts,
                           (entries["payload_offset"][tails] + entries["payload_len"][tails]).astype(np.int64),
                           _NO_LIMIT)
        first_g, last_g = starts >> GRANULE_SHIFT, (ends - 1) >> GRANULE_SHIFT
        span = last_g - first_g + 1
        # A piece: granule g of block b in part p (key: b, p counted from the block's first part, g
        # from the block's first granule in that part).
        base = blocks << _BLOCK_SHIFT | np.clip(parts - head_parts, 0, _PARTS_IN_BLOCK) << 25
        first_key = base | ((first_g - (floor >> GRANULE_SHIFT)) & _IN_BLOCK)
        if (span <= 2).all():
            keys = np.concatenate([first_key, first_key + (span - 1)])
            rows = np.concatenate([np.arange(len(span)), np.arange(len(span))])
        else:  # records over two granules: every granule in between too
            rows = np.repeat(np.arange(len(span)), span)
            keys = first_key[rows] + np.arange(span.sum()) - np.repeat(np.cumsum(span) - span, span)
        unique_keys, first_at = distinct_first(keys)  # a batch's records share few pieces
        advised = self._advised
        fresh = [key not in advised for key in unique_keys.tolist()]
        if not any(fresh):
            return None  # asked for already: the kernel has it or is reading it
        if len(advised) > ADVISED_LIMIT:  # the cache may have dropped early ones: ask again later
            advised.clear()
            self._asked_table()[:] = False
        wanted = np.array(fresh, dtype=bool)
        keys, rows = unique_keys[wanted], rows[first_at[wanted]]
        granules = (keys & _IN_BLOCK) + (floor[rows] >> GRANULE_SHIFT)
        lo = np.maximum(granules << GRANULE_SHIFT, floor[rows])
        hi = np.minimum((granules + 1) << GRANULE_SHIFT, ceiling[rows])
        return keys, parts[rows], lo, hi

    def advise(self, positions: np.ndarray, file_ranges: FileRanges) -> int:
        """Ask the storage for the bytes of records ``positions`` (0..records-1), which will be read
        soon, and return at once; returns the bytes asked for.

        Each run of consecutive records in one part (a sampler block, or several) is announced as
        one range, exactly, with ``posix_fadvise(POSIX_FADV_WILLNEED)``, so the kernel reads it in
        large requests while the caller goes on (and reads nothing the records do not need). On
        network and FUSE storage the records' 128 KiB pieces are read instead, in the background,
        by threads of their own: a batch that needs a piece before its turn reads it itself, so the
        announcement never makes a batch wait longer than its own reads would."""
        if not len(positions):
            return 0
        entries = self.entries
        parts = entries["part"][positions].astype(np.int64)
        ends = (entries["payload_offset"][positions] + entries["payload_len"][positions]).astype(np.int64)
        if self.fetcher.threads:
            return self._queue_pieces(positions, parts, ends, file_ranges)
        starts = entries["record_offset"][positions].astype(np.int64)
        by_place = np.lexsort((starts, parts))
        parts, starts, ends = parts[by_place], starts[by_place], ends[by_place]
        first = np.ones(len(parts), dtype=bool)  # records that touch the one before join its run
        first[1:] = (parts[1:] != parts[:-1]) | (starts[1:] > ends[:-1] + PAGE)  # records do not overlap
        run_starts = np.flatnonzero(first)
        run_stops = np.maximum.reduceat(ends, run_starts)
        ranges = file_ranges(parts[run_starts], starts[run_starts], run_stops)[0]
        for fd, offset, length in ranges:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
        self._asked_table()[positions] = True  # a batch of them need not ask again (see before_batch)
        return sum(length for _, _, length in ranges)

    def _queue_pieces(self, positions: np.ndarray, parts: np.ndarray, ends: np.ndarray,
                      file_ranges: FileRanges) -> int:
        """``advise`` on network and FUSE storage: the records' pieces not asked for yet, queued for
        reading in the background. Each goes into ``_advised`` once read, so a batch that comes to
        it earlier finds it fresh and reads it itself (the records are not marked as asked)."""
        fresh = self._fresh_pieces(positions, parts, ends)
        if fresh is None:
            return 0
        keys, piece_parts, lo, hi = fresh
        ranges, kept = file_ranges(piece_parts, lo, hi)
        self.fetcher.queue(ranges, keys[kept].tolist(), self._advised)
        return sum(length for _, _, length in ranges)


def cut(source: Callable[[int], Any], parts: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[Any]:
    """``source(part)[start:end]`` for each record: views of memoryviews, bytes of memory maps."""
    if len(parts) and (parts == parts[0]).all():  # the common case: one shard or chunk
        whole = source(int(parts[0]))
        return [whole[start:end] for start, end in zip(starts.tolist(), ends.tolist(), strict=True)]
    sources = {part: source(part) for part in distinct(parts).tolist()}
    return [sources[part][start:end] for part, start, end in zip(parts.tolist(), starts.tolist(), ends.tolist(),
                                                                   strict=True)]
