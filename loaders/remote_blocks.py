"""Blocks of a shards pack at a URL: fixed ranges of each shard, from memory, the cache folder or the store.

A block is ``block_size`` bytes of one shard (the last one shorter), named in the cache by its
shard, the shard's size, the block size and its number. Fetched blocks go into the cache directory
(``loaders.read_cache``) and are read from there by every process (DataLoader workers share the
folder), so a second epoch reads the local disk. One block is fetched once: this process's threads
wait on its lock, other processes on the cache's lock file of it, then read what was fetched.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from packload.core.errors import PackFormatError
from packload.core.format import FORMAT_VERSION, SHARD_HEADER, decode_shard_header
from packload.core.remote import ObjectChangedError, RemoteStore
from packload.loaders.read_cache import BlockCache
from packload.loaders.remote_open import OpenedPack
from packload.loaders.remote_pin import BlockCheck

WRITE_THREADS = 2  # threads writing fetched blocks to the cache folder, behind the fetches
BLOCKS_MAPPED = 64  # cached blocks kept mapped in this process

Key = tuple[int, int]  # (shard, block number)


class ShardBlocks:
    """Each block of the pack ``opened``: ``get`` finds it or fetches it (pinned to the versions
    listed at open, checked by ``check``), its bytes kept mapped or in memory, written to the cache
    behind on threads of their own."""

    def __init__(self, store: RemoteStore, cache: BlockCache, opened: OpenedPack, block_size: int,
                 check: BlockCheck) -> None:
        self.store = store
        self.cache = cache
        self.opened = opened
        self.block_size = block_size
        self.check = check
        self._mapped: OrderedDict[Key, Any] = OrderedDict()
        self._lock = threading.Lock()
        # One lock per block being fetched, for this process's threads (they wait here rather than
        # each on a lock file of its own); the cache's lock file then orders the processes.
        self._fetch_locks: dict[Key, threading.Lock] = {}
        self._writer: ThreadPoolExecutor | None = None
        self._pid = os.getpid()

    def forked(self, store: RemoteStore, cache: BlockCache) -> ShardBlocks:
        """The same blocks for a process forked from this one: new maps, locks and threads."""
        return ShardBlocks(store, cache, self.opened, self.block_size, self.check)

    # -- a block's place --------------------------------------------------------------------
    def range(self, part: int, block: int) -> tuple[int, int]:
        """(start, stop) of block ``block`` in shard ``part``."""
        start = block * self.block_size
        return start, min(int(self.opened.part_sizes[part]), start + self.block_size)

    def identity(self, part: int, block: int) -> str:
        """What a cached block is: its shard (name and size), the block size and the block's number
        (the pack is the cache folder's, by its manifest)."""
        return f"{self.opened.part_names[part]}\0{int(self.opened.part_sizes[part])}\0{self.block_size}\0{block}"

    def mapped(self, key: Key) -> bool:
        """Whether block ``key`` is in this process's memory now."""
        with self._lock:
            return key in self._mapped

    def in_cache(self, key: Key) -> bool:
        """Whether the cache folder seems to hold block ``key`` (not checked: reading it checks it)."""
        start, stop = self.range(*key)
        return self.cache.has(self.opened.key, self.identity(*key), stop - start)

    # -- finding and fetching ---------------------------------------------------------------
    def cached(self, part: int, block: int) -> Any:
        """Block ``block`` of shard ``part`` from this process's maps or the cache folder, or None."""
        key = (part, block)
        with self._lock:
            found = self._mapped.get(key)
            if found is not None:
                self._mapped.move_to_end(key)
                return found
        start, stop = self.range(part, block)
        found = self.cache.read(self.opened.key, self.identity(part, block), stop - start)
        if found is None:
            return None  # not there, or not what its record says: fetched again
        if block == 0:
            self._check_header(part, found)
        self._keep(key, found)
        return found

    def get(self, key: Key) -> Any:
        """Block ``key`` from the cache, else fetched under the block's lock (so a process already
        fetching it is waited for, and its file read). The fetched bytes are returned at once; the
        cache's file is written behind, on a thread of its own, the lock held until it is there."""
        found = self.cached(*key)
        if found is not None:
            return found
        writer = self._writer_pool()
        lock = self._block_lock(key)
        lock.__enter__()
        handed = False
        try:
            found = self.cached(*key)  # fetched meanwhile, here or by another process
            if found is not None:
                return found
            data = self._fetch(*key)
            writer.submit(self._write_then_release, key, data, lock)
            handed = True
            return data
        finally:
            if not handed:
                lock.__exit__(None, None, None)

    def _fetch(self, part: int, block: int) -> Any:
        """Block ``block`` of shard ``part`` from the store, pinned to the version listed at open and
        checked against the index, kept in this process's memory (the caller writes it to the cache)."""
        start, stop = self.range(part, block)
        name = self.opened.part_names[part]
        try:
            data = self.store.read_range(name, start, stop, self.opened.pin.tags.get(name))
        except ObjectChangedError:
            raise self.opened.pin.error() from None
        self.check(part, start, data)
        if block == 0:
            self._check_header(part, data)
        self._keep((part, block), data)
        return data

    def _keep(self, key: Key, data: Any) -> None:
        with self._lock:
            self._mapped[key] = data
            while len(self._mapped) > BLOCKS_MAPPED:
                self._mapped.popitem(last=False)  # a map is freed once no view of it is left

    def _check_header(self, part: int, data: Any) -> None:
        header = decode_shard_header(bytes(data[: SHARD_HEADER.itemsize]))
        where = self.store.shown_of(self.opened.part_names[part])
        if header is None or header[1] != part:
            raise PackFormatError(f"{where}: not shard {part} of this pack; the pack is damaged")
        if header[0] != FORMAT_VERSION:
            raise PackFormatError(f"{where}: shard format version {header[0]}, this packload reads version "
                                  f"{FORMAT_VERSION}; upgrade packload or re-pack")

    # -- writing behind, and the locks ------------------------------------------------------
    def _writer_pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._writer is None or self._pid != os.getpid():  # threads do not survive a fork
                self._writer = ThreadPoolExecutor(WRITE_THREADS, thread_name_prefix="packload-remote-write")
                self._fetch_locks = {}  # a lock held when this process was forked would stay held
                self._pid = os.getpid()
            return self._writer

    def _write_then_release(self, key: Key, data: bytes, lock: contextlib.AbstractContextManager[None]) -> None:
        """Put a fetched block in the cache, then let go of its lock: other processes waiting for
        the block find the file, and this process's threads had its bytes from memory at once."""
        try:
            self.cache.put(self.opened.key, self.identity(*key), data)
        finally:
            lock.__exit__(None, None, None)

    @contextlib.contextmanager
    def _block_lock(self, key: Key) -> Iterator[None]:
        """Holds block ``key``'s lock among this process's threads (an announced fetch that starts
        while a batch's fetch of the same block runs waits for it, then finds it cached), then the
        cache's lock of the block among processes (none where the cache folder cannot be written)."""
        with self._lock:
            thread_lock = self._fetch_locks.setdefault(key, threading.Lock())
        with thread_lock, self._file_lock(key):
            yield

    @contextlib.contextmanager
    def _file_lock(self, key: Key) -> Iterator[None]:
        """Holds the cache's lock file of block ``key``, for other processes."""
        try:
            lock = self.cache.fetching(self.opened.key, self.identity(*key))
            lock.__enter__()
        except OSError:
            yield
            return
        try:
            yield
        finally:
            lock.__exit__(None, None, None)

    def close(self) -> None:
        """Wait for the blocks fetched to be written to the cache, and let the maps go."""
        if self._writer is not None and self._pid == os.getpid():
            self._writer.shutdown(wait=True)
        self._writer = None
        self._mapped.clear()
