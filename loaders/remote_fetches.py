"""The fetches of a remote pack's blocks under way: a batch's, and the read-ahead of announced records.

A batch's blocks are fetched many at once. ``advise`` (a sampler's announcement) queues the blocks
of the records coming next on fewer threads of their own, so announced blocks never crowd out the
ones a batch waits for: a batch that needs an announced block still in the queue fetches it at
once, and one being fetched, in this process or in another (the cache's per-block lock), is waited
for, never asked for twice.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from packload.core.remote import RemoteStore
from packload.loaders.prefetch import distinct
from packload.loaders.read_cache import BlockCache
from packload.loaders.remote_blocks import Key, ShardBlocks

FETCH_THREADS = 32  # requests in flight for a batch's blocks
AHEAD_THREADS = 8  # requests in flight for announced blocks: the rest of the link is left to the batches


class BlockFetches:
    """The fetches of ``blocks`` in flight: a batch's (``get_all``) and announced ones (``advise``)."""

    def __init__(self, blocks: ShardBlocks) -> None:
        self.blocks = blocks
        self.inflight: dict[Key, Future[Any]] = {}  # a batch's fetches
        self.ahead: dict[Key, Future[Any]] = {}  # announced fetches, queued or running
        self._lock = threading.Lock()
        self._pools: tuple[ThreadPoolExecutor, ThreadPoolExecutor] | None = None
        self._pid = os.getpid()

    def forked(self, store: RemoteStore, cache: BlockCache) -> BlockFetches:
        """The same blocks' fetches for a process forked from this one (its own ``store`` connection
        and ``cache``): none in flight, threads, maps and locks of their own."""
        return BlockFetches(self.blocks.forked(store, cache))

    def get_all(self, keys: list[Key]) -> dict[Key, Any]:
        """The bytes of every block ``keys``: cached ones at once, the rest fetched at once, in parallel."""
        found: dict[Key, Any] = {}
        waiting: dict[Key, Future[Any]] = {}
        for key in keys:
            data = self.blocks.cached(*key)
            if data is not None:
                found[key] = data
            else:
                waiting[key] = self._request(key, ahead=False)
        for key, future in waiting.items():
            found[key] = future.result()
        return found

    def advise(self, parts: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> int:
        """Queue the fetch of every block these byte ranges lie in that is not cached or in flight,
        on background threads, and return at once; returns the bytes asked for."""
        size = self.blocks.block_size
        asked = 0
        for part in distinct(parts).tolist():
            mine = parts == part
            firsts = starts[mine] // size
            lasts = np.maximum(starts[mine], ends[mine] - 1) // size
            wanted = distinct(np.concatenate([np.arange(first, last + 1) for first, last
                                              in zip(firsts.tolist(), lasts.tolist(), strict=True)]))
            for block in wanted.tolist():
                key = (part, block)
                with self._lock:
                    if key in self.inflight or key in self.ahead:
                        continue
                if self.blocks.mapped(key) or self.blocks.in_cache(key):
                    continue
                self._request(key, ahead=True)
                start, stop = self.blocks.range(*key)
                asked += stop - start
        return asked

    def _executors(self) -> tuple[ThreadPoolExecutor, ThreadPoolExecutor]:
        if self._pools is None or self._pid != os.getpid():  # threads do not survive a fork
            self._pools = (ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="packload-remote"),
                           ThreadPoolExecutor(AHEAD_THREADS, thread_name_prefix="packload-remote-ahead"))
            self.inflight = {}
            self.ahead = {}
            self._pid = os.getpid()
        return self._pools

    def _request(self, key: Key, ahead: bool) -> Future[Any]:
        """The fetch of block ``key``: the one in flight, or a new one on the batch's (or, for an
        announcement, the background's) threads. A batch does not wait behind the announcements'
        queue: an announced block not started yet is fetched on the batch's threads."""
        with self._lock:
            pools = self._executors()
            future = self.inflight.get(key)
            if future is not None:
                return future
            queued = self.ahead.get(key)
            if queued is not None and (ahead or queued.running() or queued.done()):
                return queued
            future = pools[1 if ahead else 0].submit(self._fetch, key, ahead)
            (self.ahead if ahead else self.inflight)[key] = future
            return future

    def _fetch(self, key: Key, ahead: bool) -> Any:
        try:
            return self.blocks.get(key)
        finally:
            with self._lock:
                (self.ahead if ahead else self.inflight).pop(key, None)

    def close(self) -> None:
        """Stop the fetches not started yet (the running ones finish), and wait for the blocks
        fetched to be written to the cache."""
        if self._pools is not None and self._pid == os.getpid():
            self._pools[0].shutdown(wait=False, cancel_futures=True)
            self._pools[1].shutdown(wait=True, cancel_futures=True)
        self._pools = None
        self.blocks.close()
