"""A shards pack on an object store for ``PackReader`` (``RemoteShardsPack``), read by large ranged
requests through a bounded local cache; an LMDB pack at a URL is fetched whole instead
(``loaders.remote_lmdb``).

The pack is read as blocks of ``block_size`` bytes of each shard. Its parts, each a module:

* opening: the listing, the manifest and the index, read as one pack (``loaders.remote_open``);
* pinning: every later read is of the pack opened, or ``PackChangedError`` (``loaders.remote_pin``);
* blocks: each found in memory or the cache folder, else fetched once across threads and processes
  (``loaders.remote_blocks``);
* fetches under way: a batch's many at once, and the read-ahead of announced records on fewer
  threads, never in a batch's way (``loaders.remote_fetches``).

``RemoteShardsPack`` puts records' bytes and whole shards together from the blocks.
"""

from __future__ import annotations

import hashlib
import warnings
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any

import numpy as np

from packload.core.errors import ChecksumError, PackChangedError, PackFormatError, UsageError
from packload.core.format import FIELDS_NAME
from packload.core.manifest import check_listed_size
from packload.core.remote import RemoteStore
from packload.loaders.read_cache import BlockCache
from packload.loaders.remote_blocks import Key, ShardBlocks
from packload.loaders.remote_fetches import BlockFetches
from packload.loaders.remote_open import open_pinned
from packload.loaders.remote_pin import BlockCheck

DEFAULT_BLOCK_SIZE = 8 << 20  # bytes per ranged request and per cached file
WHOLE_PARTS_KEPT = 2  # whole shards joined in memory for ``part_view``


class RemoteShardsPack:
    """One shards pack on an object store: manifest, index, and shards read block by block."""

    backend = "shards"

    def __init__(self, store: RemoteStore, cache: BlockCache, block_size: int = DEFAULT_BLOCK_SIZE,
                 listing: dict[str, int] | None = None, manifest_head: bytes | None = None) -> None:
        """``listing``: the store's listing of the pack's folder, when the caller has just made one;
        ``manifest_head``: the manifest's bytes read meanwhile (used when the listing's size agrees)."""
        if block_size < 1 << 12:
            raise UsageError(f"block_size {block_size}: give at least 4096 bytes")
        self.store = store
        self.path = store.url
        self.cache = cache
        self.block_size = block_size
        self._whole: OrderedDict[int, memoryview] = OrderedDict()
        self.opened = open_pinned(store, cache, self.store.listing() if listing is None else listing, manifest_head)
        self.pin = self.opened.pin
        self.manifest = self.opened.manifest
        self.part_names = self.opened.part_names
        self.part_sizes = self.opened.part_sizes
        self.entries, self.paths = self.opened.entries, self.opened.paths
        self.fetches = BlockFetches(ShardBlocks(store, cache, self.opened, block_size,
                                                BlockCheck(self.entries, self.pin)))
        problem = cache.problem()
        if problem:  # read all the same, from the store each time: said once per open, not hidden
            warnings.warn(f"{self.store.shown}: the cache folder cannot be used ({problem}); every block is fetched "
                          "from the store each time it is read: give cache_dir (or PACKLOAD_CACHE) a folder you can "
                          "write to", stacklevel=3)

    def forked(self) -> RemoteShardsPack:
        """A copy for a process forked from this one: the manifest, index and shard list as they
        are (nothing asked of the store again), new locks, maps, fetches and connections."""
        copy = object.__new__(RemoteShardsPack)
        copy.__dict__.update(self.__dict__)
        copy.store = RemoteStore(self.store.url, self.store.storage_options, self.store.timeout)
        # Kept, never used: the parent's connection, collected here, would be closed on the parent's
        # event loop, which has no thread in this process.
        copy._parent_store = self.store
        copy._whole = OrderedDict()
        copy.cache = self.cache.forked()  # its locks may have been held by a thread the fork left behind
        copy.fetches = self.fetches.forked(copy.store, copy.cache)
        return copy

    @property
    def _ahead(self) -> dict[Key, Future[Any]]:
        """The announced fetches queued or running (what a caller waits on to see them done)."""
        return self.fetches.ahead

    def changed(self) -> PackChangedError:
        """The error of a read that found another pack at the URL than the one opened."""
        return self.pin.error()

    # -- reading ---------------------------------------------------------------------------
    def payload_bytes(self, parts: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[bytes]:
        """``bytes`` of each range of each shard, its blocks fetched together first."""
        size = self.block_size
        parts_l, starts_l, ends_l = parts.tolist(), starts.tolist(), ends.tolist()
        keys = sorted({(p, b) for p, s, e in zip(parts_l, starts_l, ends_l, strict=True)
                       for b in range(s // size, max(s, e - 1) // size + 1)})
        data = self.fetches.get_all(keys)
        out = []
        for part, start, end in zip(parts_l, starts_l, ends_l, strict=True):
            first, last = start // size, max(start, end - 1) // size
            if first == last:
                out.append(bytes(data[(part, first)][start - first * size : end - first * size]))
            else:
                out.append(b"".join(bytes(data[(part, b)][max(start, b * size) - b * size : min(end, (b + 1) * size) - b * size])
                                    for b in range(first, last + 1)))
        return out

    def part_view(self, part: int) -> memoryview:
        """The whole of shard ``part``, joined in memory (checked against the manifest's sha256):
        what readers of whole shards need (``PackLoader``'s raw path, ``verify``)."""
        whole = self._whole.get(part)
        if whole is not None:
            return whole
        size = int(self.part_sizes[part])
        blocks = self.fetches.get_all([(part, b) for b in range(-(-size // self.block_size))])
        joined = b"".join(bytes(blocks[(part, b)]) for b in range(len(blocks)))
        expected = self.manifest.shards[part].get("sha256")
        if expected and hashlib.sha256(joined).hexdigest() != expected:
            if self.pin.changed_now():
                raise self.changed()
            raise ChecksumError(f"{self.store.shown_of(self.part_names[part])}: sha256 differs from the manifest; "
                                "the shard is damaged on the store: upload it again")
        self._whole[part] = memoryview(joined)
        while len(self._whole) > WHOLE_PARTS_KEPT:
            self._whole.popitem(last=False)
        return self._whole[part]

    def advise(self, parts: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> int:
        """Queue the fetch of every block these byte ranges lie in that is not cached or in flight,
        on background threads, and return at once; returns the bytes asked for."""
        return self.fetches.advise(parts, starts, ends)

    # -- what PackReader asks of a pack ----------------------------------------------------
    def part_sizes_of(self, parts: np.ndarray) -> np.ndarray:
        return self.part_sizes[parts]

    def part_label(self, part: int) -> str:
        return self.part_names[part]

    def index_bytes(self) -> bytes:
        return self.opened.index

    def fields_bytes(self) -> bytes:
        """``fields.bin`` (a pack made from a table), fetched whole on first use and kept in the cache."""
        if getattr(self, "_fields", None) is None:
            size = int(self.manifest.fields.get("size", 0))
            listed = self.opened.listed.get(FIELDS_NAME)
            if listed is None:
                raise PackFormatError(f"{self.store.shown_of(FIELDS_NAME)}: missing, though the manifest lists the "
                                      "pack's fields; the pack is incomplete, upload it again")
            check_listed_size(int(listed.get("size") or 0), size, str(self.store.shown_of(FIELDS_NAME)))
            identity = f"{FIELDS_NAME}\0{size}"
            cached = self.cache.read(self.opened.key, identity, size)
            if cached is not None:
                self._fields = bytes(cached)
                cached.close()
            else:
                try:
                    self._fields = self.store.read_all(FIELDS_NAME, size, self.pin.tags.get(FIELDS_NAME))
                except FileNotFoundError:
                    raise PackFormatError(f"{self.store.shown_of(FIELDS_NAME)}: missing, though the manifest lists "
                                          "the pack's fields; the pack is incomplete, upload it again") from None
                if len(self._fields) != size:
                    raise PackFormatError(f"{self.store.shown_of(FIELDS_NAME)}: {len(self._fields)} bytes, the "
                                          f"manifest says {size}; the pack is damaged")
                self.cache.put(self.opened.key, identity, self._fields)
        return self._fields

    def close(self) -> None:
        """Stop the fetches not started yet (the running ones finish) and let the maps go."""
        self.fetches.close()
        self.entries = np.zeros(0, self.entries.dtype) if hasattr(self, "entries") else None
        self._whole.clear()
        self.cache.close()
