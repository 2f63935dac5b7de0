"""Packs on object stores for ``PackReader``: a shards pack read by large ranged requests through a
bounded local cache (``RemoteShardsPack``), and an LMDB pack fetched whole into the cache
(``fetch_lmdb``: LMDB needs a local file).

A shards pack is read as blocks of ``block_size`` bytes of each shard: the manifest first (always
from the store: it says which pack is there now), then the index (from the cache when it holds
this pack's), then the blocks that the records asked for lie in, many requests in flight at once.
Fetched blocks go into the cache directory (``loaders.read_cache``) and are read from there by
every process (DataLoader workers share the folder), so a second epoch reads the local disk.

**Pinned to the pack it opened.** An open reads the folder's listing, which notes each object's
version (``RemoteStore.tags``), and the manifest; the cache keeps this pack's entries under the
manifest's hash, each block named by its shard, its block size and its number. Every later read
(the index, each block) is pinned to the version listed (S3's ``If-Match``, GCS's generation) and
each block fetched is checked against the CRC-32 of records that lie wholly in it: a pack packed
again at the URL while a reader has it open (or replaced under an open that was reading it)
raises ``PackChangedError`` ("changed since it was opened; open it again"), never another pack's
records and never a "damaged" message for what is a replacement. A CRC that does not match while
the manifest there is still the one opened is damage on the store: the block is kept as it is, and
the records' own checks (``verify=True``) report it, as for a local pack.
``advise`` (a sampler's announcement) queues the blocks of the records coming next on fewer threads
of their own, so announced blocks never crowd out the ones a batch waits for: a batch that needs an
announced block still in the queue fetches it at once, and one being fetched, in this process or in
another (the cache's per-block lock), is waited for, never asked for twice.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import threading
import warnings
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from packload.core.display import pack_phrase
from packload.core.errors import (
    ChecksumError,
    IncompletePackError,
    PackChangedError,
    PackFormatError,
    UsageError,
)
from packload.core.format import (
    FIELDS_NAME,
    FORMAT_VERSION,
    INDEX_NAME,
    MANIFEST_NAME,
    PROGRESS_NAME,
    SHARD_HEADER,
    check_entries_fit,
    check_parts_reached,
    decode_index,
    decode_shard_header,
    shard_number,
)
from packload.core.manifest import MANIFEST_LIMIT, check_listed_size, decode_manifest, shard_parts
from packload.core.remote import (
    ObjectChangedError,
    RemoteMissingError,
    RemoteStore,
    content_matches_tag,
    tag_of,
)
from packload.loaders.prefetch import distinct
from packload.loaders.read_cache import BlockCache, pack_folder_name

DEFAULT_BLOCK_SIZE = 8 << 20  # bytes per ranged request and per cached file
FETCH_THREADS = 32  # requests in flight for a batch's blocks
WRITE_THREADS = 2  # threads writing fetched blocks to the cache folder, behind the fetches
AHEAD_THREADS = 8  # requests in flight for announced blocks: the rest of the link is left to the batches
_BLOCKS_MAPPED = 64  # cached blocks kept mapped in this process
_WHOLE_PARTS_KEPT = 2  # whole shards joined in memory for ``part_view``
OPEN_ATTEMPTS = 3  # opens of a pack that changed while it was being opened, before giving up
RECORDS_CHECKED = 8  # records of a fetched block whose CRC-32 is compared with the index at most


class _ChangedWhileOpening(Exception):
    """The listing, the manifest and the index read at open are not of one pack: open again."""


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
        self._mapped: OrderedDict[tuple[int, int], Any] = OrderedDict()
        self._whole: OrderedDict[int, memoryview] = OrderedDict()
        self._inflight: dict[tuple[int, int], Future[Any]] = {}  # a batch's fetches
        self._ahead: dict[tuple[int, int], Future[Any]] = {}  # announced fetches, queued or running
        self._lock = threading.Lock()
        # One lock per block being fetched, for this process's threads (they wait here rather than
        # each on a lock file of its own); the cache's lock file then orders the processes.
        self._fetch_locks: dict[tuple[int, int], threading.Lock] = {}
        self._pools: tuple[ThreadPoolExecutor, ThreadPoolExecutor, ThreadPoolExecutor] | None = None
        self._pid = os.getpid()
        self._by_part: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._open_pinned(self.store.listing() if listing is None else listing, manifest_head)
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
        copy._mapped = OrderedDict()
        copy._whole = OrderedDict()
        copy._inflight = {}
        copy._ahead = {}
        copy._lock = threading.Lock()  # the parent's may have been held by a thread the fork left behind
        copy._fetch_locks = {}
        copy.cache = self.cache.forked()  # so may its cache's
        copy._pools = None
        copy._pid = os.getpid()
        return copy

    # -- opening ---------------------------------------------------------------------------
    def _open_pinned(self, listing: dict[str, int], manifest_head: bytes | None) -> None:
        """``_open``, again from a new listing while what was read is not of one pack (a pack being
        written again right now)."""
        for _ in range(OPEN_ATTEMPTS):
            try:
                self._open(listing, manifest_head)
                return
            except _ChangedWhileOpening:
                listing, manifest_head = self.store.listing(), None
        raise PackChangedError(f"{self.store.shown}: the pack changed while it was being opened (it is being packed "
                               "again?); open it again once it is written")

    def _open(self, listing: dict[str, int], manifest_head: bytes | None) -> None:
        self.tags = dict(self.store.tags)  # the version of each object, as this listing found it
        self.listed = dict(self.store.listed)
        if MANIFEST_NAME not in listing:
            self._refuse_without_manifest(listing)
        size = listing[MANIFEST_NAME]
        tag = self.tags.get(MANIFEST_NAME)
        if size > MANIFEST_LIMIT:
            raw = b"x" * (MANIFEST_LIMIT + 1)  # refused as too large by decode_manifest
        elif manifest_head is not None and len(manifest_head) == size and \
                content_matches_tag(tag, manifest_head, self.listed.get(MANIFEST_NAME)) is not False:
            raw = manifest_head
        else:
            try:
                raw = self.store.read_range(MANIFEST_NAME, 0, size, tag)
            except ObjectChangedError:
                raise _ChangedWhileOpening from None
        self.manifest_sha256 = hashlib.sha256(raw).hexdigest()
        self.manifest = decode_manifest(raw, self.store.shown_of(MANIFEST_NAME))
        if self.manifest["backend"] != "shards":
            raise PackFormatError(f"{self.store.shown_of(MANIFEST_NAME)}: manifest is for "
                                  f"{pack_phrase(self.manifest['backend'])}")
        self.key = pack_folder_name("pack", self.manifest_sha256)
        self.part_names, sizes = self._shard_list(listing)
        self.part_sizes = np.array(sizes, dtype=np.int64)
        self._index = self._read_index(listing)
        where = self.store.shown_of(INDEX_NAME)
        self.entries, self.paths = decode_index(self._index, where, self.manifest["records"], sum(sizes))
        check_entries_fit(self.entries, self.part_sizes.astype(np.uint64), where)
        check_parts_reached(self.entries, self.part_sizes, self.part_names, self.store.shown)  # no tail to fetch

    def _refuse_without_manifest(self, listing: dict[str, int]) -> None:
        url = self.store.shown
        if not listing:
            if self.store.kind() is None:
                self.store.check_bucket()
                raise RemoteMissingError(f"{url}: no such pack (nothing is stored under it); give the URL "
                                         "`pack` wrote to")
        if PROGRESS_NAME in listing or any(shard_number(name) is not None for name in listing):
            raise IncompletePackError(f"{url}: no {MANIFEST_NAME}: this pack did not finish (or is being "
                                      "written now); pack it again, or wait for the pack to finish")
        raise UsageError(f"{url}: not a pack (no {MANIFEST_NAME}); give a shards folder that `pack` wrote")

    def _shard_list(self, listing: dict[str, int]) -> tuple[list[str], list[int]]:
        """The shards' names and sizes from the manifest, each checked against the store's listing."""
        where = self.store.shown_of(MANIFEST_NAME)
        parts = shard_parts(self.manifest, str(where))
        names, sizes = [], []
        for part in parts:
            name = part["name"]
            if name not in listing or listing[name] != part.get("size"):
                self._refuse_if_changed_while_opening()
            if name not in listing:
                raise PackFormatError(f"{self.store.shown_of(name)}: shard missing; the pack is incomplete, "
                                      "upload it again")
            if listing[name] != part.get("size"):
                raise PackFormatError(f"{self.store.shown_of(name)}: {listing[name]} bytes, the manifest says "
                                      f"{part.get('size')}; the shard is truncated or changed, upload it again")
            names.append(name)
            sizes.append(listing[name])
        return names, sizes

    def _refuse_if_changed_while_opening(self) -> None:
        """Raise ``_ChangedWhileOpening`` when the manifest listed now is not the one read (the
        listing read with it may be of another pack than the manifest)."""
        if self._pack_changed():
            raise _ChangedWhileOpening

    def _read_index(self, listing: dict[str, int]) -> bytes:
        """The index, from the cache when it holds this pack's (its record and sha256 checked), else
        fetched (pinned to the version listed) and kept there."""
        where = self.store.shown_of(INDEX_NAME)
        if INDEX_NAME not in listing:
            self._refuse_if_changed_while_opening()
            raise PackFormatError(f"{where}: missing; the pack is incomplete, upload it again")
        size = listing[INDEX_NAME]
        expected = self.manifest.get("index", {})
        if size == 0 or ("size" in expected and size != expected["size"]):
            self._refuse_if_changed_while_opening()
            raise PackFormatError(f"{where}: {size} bytes, the manifest says {expected.get('size')}; the pack "
                                  "is damaged")
        identity = f"{INDEX_NAME}\0{size}"
        cached = self.cache.read(self.key, identity, size)
        if cached is not None:
            data = bytes(cached)
            cached.close()
            if hashlib.sha256(data).hexdigest() == expected.get("sha256"):
                return data
        try:
            data = self.store.read_all(INDEX_NAME, size, self.tags.get(INDEX_NAME))
        except ObjectChangedError:
            raise _ChangedWhileOpening from None
        if hashlib.sha256(data).hexdigest() != expected.get("sha256"):
            self._refuse_if_changed_while_opening()  # else damaged on the store: check_index says so
            return data
        self.cache.put(self.key, identity, data)
        return data

    # -- is it still the pack opened? ------------------------------------------------------
    def _pack_changed(self) -> bool:
        """Whether the manifest at the URL now is another than the one this open read (or is gone):
        by the version listed, else by its bytes."""
        probe = RemoteStore(self.store.url, self.store.storage_options, self.store.timeout)
        listing = probe.listing()
        if MANIFEST_NAME not in listing:
            return True
        then, now = self.tags.get(MANIFEST_NAME), probe.tags.get(MANIFEST_NAME)
        if then and now:
            return then != now
        if not hasattr(self, "manifest_sha256"):
            return False
        raw = probe.read_range(MANIFEST_NAME, 0, listing[MANIFEST_NAME]) if listing[MANIFEST_NAME] <= MANIFEST_LIMIT \
            else b""
        return hashlib.sha256(raw).hexdigest() != self.manifest_sha256

    def changed(self) -> PackChangedError:
        """The error of a read that found another pack at the URL than the one opened."""
        return PackChangedError(f"{self.store.shown}: the pack changed since it was opened (it was packed again, or "
                                "its objects replaced); open it again (create the dataset again) to read the pack "
                                "there now")

    # -- blocks ----------------------------------------------------------------------------
    def _block_range(self, part: int, block: int) -> tuple[int, int]:
        start = block * self.block_size
        return start, min(int(self.part_sizes[part]), start + self.block_size)

    def _block_identity(self, part: int, block: int) -> str:
        """What a cached block is: its shard (name and size), the block size and the block's number
        (the pack is the cache folder's, by its manifest)."""
        return f"{self.part_names[part]}\0{int(self.part_sizes[part])}\0{self.block_size}\0{block}"

    def _cached(self, part: int, block: int) -> Any:
        """Block ``block`` of shard ``part`` from this process's maps or the cache folder, or None."""
        key = (part, block)
        with self._lock:
            found = self._mapped.get(key)
            if found is not None:
                self._mapped.move_to_end(key)
                return found
        start, stop = self._block_range(part, block)
        found = self.cache.read(self.key, self._block_identity(part, block), stop - start)
        if found is None:
            return None  # not there, or not what its record says: fetched again
        if block == 0:
            self._check_header(part, found)
        self._keep(key, found)
        return found

    def _keep(self, key: tuple[int, int], data: Any) -> None:
        with self._lock:
            self._mapped[key] = data
            while len(self._mapped) > _BLOCKS_MAPPED:
                self._mapped.popitem(last=False)  # a map is freed once no view of it is left

    def _fetch(self, part: int, block: int) -> Any:
        """Block ``block`` of shard ``part`` from the store, pinned to the version listed at open and
        checked against the index (``_check_fetched``), kept in this process's memory (the caller
        writes it to the cache)."""
        start, stop = self._block_range(part, block)
        name = self.part_names[part]
        try:
            data = self.store.read_range(name, start, stop, self.tags.get(name))
        except ObjectChangedError:
            raise self.changed() from None
        self._check_fetched(part, start, data)
        if block == 0:
            self._check_header(part, data)
        self._keep((part, block), data)
        return data

    def _records_of(self, part: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(payload starts, payload ends, CRC-32s) of shard ``part``'s records, by start."""
        found = self._by_part.get(part)
        if found is None:
            mine = np.flatnonzero(self.entries["part"] == part)
            starts = self.entries["payload_offset"][mine].astype(np.int64)
            order = np.argsort(starts, kind="stable")
            mine = mine[order]
            found = (starts[order], starts[order] + self.entries["payload_len"][mine].astype(np.int64),
                     self.entries["payload_crc32"][mine].astype(np.int64))
            self._by_part[part] = found
        return found

    def _check_fetched(self, part: int, start: int, data: bytes) -> None:
        """Compare the CRC-32 of a few records lying wholly in a fetched block (``start``: its offset
        in the shard) with the index: bytes of another pack than the one opened raise ``changed``;
        a mismatch while the manifest is still the one opened is damage, left to the records' checks."""
        starts, ends, crcs = self._records_of(part)
        first = int(np.searchsorted(starts, start))
        last = int(np.searchsorted(starts, start + len(data)))
        inside = [k for k in range(first, last) if ends[k] <= start + len(data)]
        if len(inside) > RECORDS_CHECKED:
            inside = [inside[round(j * (len(inside) - 1) / (RECORDS_CHECKED - 1))] for j in range(RECORDS_CHECKED)]
        view = memoryview(data)
        for k in inside:
            if zlib.crc32(view[starts[k] - start : ends[k] - start]) != int(crcs[k]):
                if self._pack_changed():
                    raise self.changed()
                return

    def _write_then_release(self, key: tuple[int, int], data: bytes, lock: contextlib.AbstractContextManager[None]) -> None:
        """Put a fetched block in the cache, then let go of its lock: other processes waiting for
        the block find the file, and this process's threads had its bytes from memory at once."""
        try:
            self.cache.put(self.key, self._block_identity(*key), data)
        finally:
            lock.__exit__(None, None, None)

    def _check_header(self, part: int, data: Any) -> None:
        header = decode_shard_header(bytes(data[: SHARD_HEADER.itemsize]))
        where = self.store.shown_of(self.part_names[part])
        if header is None or header[1] != part:
            raise PackFormatError(f"{where}: not shard {part} of this pack; the pack is damaged")
        if header[0] != FORMAT_VERSION:
            raise PackFormatError(f"{where}: shard format version {header[0]}, this packload reads version "
                                  f"{FORMAT_VERSION}; upgrade packload or re-pack")

    def _executors(self) -> tuple[ThreadPoolExecutor, ThreadPoolExecutor, ThreadPoolExecutor]:
        if self._pools is None or self._pid != os.getpid():  # threads do not survive a fork
            self._pools = (ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="packload-remote"),
                           ThreadPoolExecutor(AHEAD_THREADS, thread_name_prefix="packload-remote-ahead"),
                           ThreadPoolExecutor(WRITE_THREADS, thread_name_prefix="packload-remote-write"))
            self._inflight = {}
            self._ahead = {}
            self._fetch_locks = {}  # a lock held when this process was forked would stay held
            self._pid = os.getpid()
        return self._pools

    def _request(self, key: tuple[int, int], ahead: bool) -> Future[Any]:
        """The fetch of block ``key``: the one in flight, or a new one on the batch's (or, for an
        announcement, the background's) threads. A batch does not wait behind the announcements'
        queue: an announced block not started yet is fetched on the batch's threads."""
        with self._lock:
            pools = self._executors()
            future = self._inflight.get(key)
            if future is not None:
                return future
            queued = self._ahead.get(key)
            if queued is not None and (ahead or queued.running() or queued.done()):
                return queued
            future = pools[1 if ahead else 0].submit(self._fetch_once, key, ahead)
            (self._ahead if ahead else self._inflight)[key] = future
            return future

    def _fetch_once(self, key: tuple[int, int], ahead: bool) -> Any:
        """Block ``key`` from the cache, else fetched under the block's lock (so a process already
        fetching it is waited for, and its file read). The fetched bytes are returned at once; the
        cache's file is written behind, on a thread of its own, the lock held until it is there."""
        try:
            found = self._cached(*key)
            if found is not None:
                return found
            lock = self._block_lock(key)
            lock.__enter__()
            handed = False
            try:
                found = self._cached(*key)  # fetched meanwhile, here or by another process
                if found is not None:
                    return found
                data = self._fetch(*key)
                self._executors()[2].submit(self._write_then_release, key, data, lock)
                handed = True
                return data
            finally:
                if not handed:
                    lock.__exit__(None, None, None)
        finally:
            with self._lock:
                (self._ahead if ahead else self._inflight).pop(key, None)

    @contextlib.contextmanager
    def _block_lock(self, key: tuple[int, int]) -> Iterator[None]:
        """Holds block ``key``'s lock among this process's threads (an announced fetch that starts
        while a batch's fetch of the same block runs waits for it, then finds it cached), then the
        cache's lock of the block among processes (none where the cache folder cannot be written)."""
        with self._lock:
            thread_lock = self._fetch_locks.setdefault(key, threading.Lock())
        with thread_lock, self._file_lock(key):
            yield

    @contextlib.contextmanager
    def _file_lock(self, key: tuple[int, int]) -> Iterator[None]:
        """Holds the cache's lock file of block ``key``, for other processes."""
        try:
            lock = self.cache.fetching(self.key, self._block_identity(*key))
            lock.__enter__()
        except OSError:
            yield
            return
        try:
            yield
        finally:
            lock.__exit__(None, None, None)

    def blocks(self, keys: list[tuple[int, int]]) -> dict[tuple[int, int], Any]:
        """The bytes of every block ``keys``: cached ones at once, the rest fetched at once, in parallel."""
        found: dict[tuple[int, int], Any] = {}
        waiting: dict[tuple[int, int], Future[Any]] = {}
        for key in keys:
            data = self._cached(*key)
            if data is not None:
                found[key] = data
            else:
                waiting[key] = self._request(key, ahead=False)
        for key, future in waiting.items():
            found[key] = future.result()
        return found

    # -- reading ---------------------------------------------------------------------------
    def payload_bytes(self, parts: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[bytes]:
        """``bytes`` of each range of each shard, its blocks fetched together first."""
        size = self.block_size
        parts_l, starts_l, ends_l = parts.tolist(), starts.tolist(), ends.tolist()
        keys = sorted({(p, b) for p, s, e in zip(parts_l, starts_l, ends_l, strict=True)
                       for b in range(s // size, max(s, e - 1) // size + 1)})
        data = self.blocks(keys)
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
        blocks = self.blocks([(part, b) for b in range(-(-size // self.block_size))])
        joined = b"".join(bytes(blocks[(part, b)]) for b in range(len(blocks)))
        expected = self.manifest["parts"][part].get("sha256")
        if expected and hashlib.sha256(joined).hexdigest() != expected:
            if self._pack_changed():
                raise self.changed()
            raise ChecksumError(f"{self.store.shown_of(self.part_names[part])}: sha256 differs from the manifest; "
                                "the shard is damaged on the store: upload it again")
        self._whole[part] = memoryview(joined)
        while len(self._whole) > _WHOLE_PARTS_KEPT:
            self._whole.popitem(last=False)
        return self._whole[part]

    def advise(self, parts: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> int:
        """Queue the fetch of every block these byte ranges lie in that is not cached or in flight,
        on background threads, and return at once; returns the bytes asked for."""
        size = self.block_size
        asked = 0
        for part in distinct(parts).tolist():
            mine = parts == part
            firsts = starts[mine] // size
            lasts = np.maximum(starts[mine], ends[mine] - 1) // size
            wanted = distinct(np.concatenate([np.arange(first, last + 1) for first, last
                                              in zip(firsts.tolist(), lasts.tolist(), strict=True)]))
            for block in wanted.tolist():
                with self._lock:
                    if (part, block) in self._mapped or (part, block) in self._inflight or (part, block) in self._ahead:
                        continue
                start, stop = self._block_range(part, block)
                if not self.cache.has(self.key, self._block_identity(part, block), stop - start):
                    self._request((part, block), ahead=True)
                    asked += stop - start
        return asked

    # -- what PackReader asks of a pack ----------------------------------------------------
    def part_sizes_of(self, parts: np.ndarray) -> np.ndarray:
        return self.part_sizes[parts]

    def part_label(self, part: int) -> str:
        return self.part_names[part]

    def index_bytes(self) -> bytes:
        return self._index

    def fields_bytes(self) -> bytes:
        """``fields.bin`` (a pack made from a table), fetched whole on first use and kept in the cache."""
        if getattr(self, "_fields", None) is None:
            size = int(self.manifest.get("fields", {}).get("size", 0))
            listed = self.listed.get(FIELDS_NAME)
            if listed is None:
                raise PackFormatError(f"{self.store.shown_of(FIELDS_NAME)}: missing, though the manifest lists the "
                                      "pack's fields; the pack is incomplete, upload it again")
            check_listed_size(int(listed.get("size") or 0), size, str(self.store.shown_of(FIELDS_NAME)))
            identity = f"{FIELDS_NAME}\0{size}"
            cached = self.cache.read(self.key, identity, size)
            if cached is not None:
                self._fields = bytes(cached)
                cached.close()
            else:
                try:
                    self._fields = self.store.read_all(FIELDS_NAME, size, self.tags.get(FIELDS_NAME))
                except FileNotFoundError:
                    raise PackFormatError(f"{self.store.shown_of(FIELDS_NAME)}: missing, though the manifest lists "
                                          "the pack's fields; the pack is incomplete, upload it again") from None
                if len(self._fields) != size:
                    raise PackFormatError(f"{self.store.shown_of(FIELDS_NAME)}: {len(self._fields)} bytes, the "
                                          f"manifest says {size}; the pack is damaged")
                self.cache.put(self.key, identity, self._fields)
        return self._fields

    def close(self) -> None:
        """Stop the fetches not started yet (the running ones finish) and let the maps go."""
        if self._pools is not None and self._pid == os.getpid():
            self._pools[0].shutdown(wait=False, cancel_futures=True)
            self._pools[1].shutdown(wait=True, cancel_futures=True)
            self._pools[2].shutdown(wait=True)  # the blocks fetched are written to the cache
        self._pools = None
        self.entries = np.zeros(0, self.entries.dtype) if hasattr(self, "entries") else None
        self._mapped.clear()
        self._whole.clear()
        self.cache.close()


def fetch_lmdb(store: RemoteStore, cache: BlockCache) -> str:
    """The local path of the LMDB pack at ``store``: fetched whole into the cache, by ranged requests
    in flight at once pinned to the version it has now, unless the cache holds this very version
    (checked against its record). One process fetches it; others opening it meanwhile wait."""
    info = store.info()
    if info.get("type") == "directory":
        raise UsageError(f"{store.shown}: a folder without a pack manifest; give a shards pack or an .lmdb object")
    size = int(info["size"])
    tag = tag_of(info)
    version = tag or f"{info.get('LastModified') or info.get('mtime') or info.get('updated') or ''}"
    pack = pack_folder_name("lmdb", f"{store.url}\0{size}\0{version}")
    identity = f"lmdb\0{size}"
    found = cache.path(pack, identity, size)
    if found is not None:
        return str(found)
    problem = cache.problem()
    if problem:
        raise UsageError(f"{store.shown}: an LMDB pack at a URL is fetched whole into the cache folder, and that "
                         f"cannot be used: {problem}; give cache_dir (or PACKLOAD_CACHE) a folder you can write to")
    if size + 4096 > cache.limit:
        raise UsageError(f"{store.shown}: an LMDB pack of {size:,} bytes does not fit the cache of "
                         f"{cache.limit:,} bytes at {cache.folder} (LMDB packs are fetched whole); raise "
                         "cache_limit, or pack the images as shards")
    free = cache.free_bytes()
    if free is not None and free < size:
        raise UsageError(f"{store.shown}: an LMDB pack of {size:,} bytes is fetched whole into the cache folder "
                         f"{cache.folder}, whose disk has {free:,} bytes free; free space there, or give cache_dir "
                         "a folder on a larger disk")
    with cache.fetching(pack, identity):
        found = cache.path(pack, identity, size)  # fetched meanwhile by another process
        if found is not None:
            return str(found)
        _download_into_cache(store, cache, pack, identity, size, tag)
    found = cache.path(pack, identity, size)
    if found is None:
        raise UsageError(f"{store.shown}: the cache at {cache.folder} made room for other files while the LMDB pack "
                         "was fetched; raise cache_limit and retry")
    return str(found)


def _download_into_cache(store: RemoteStore, cache: BlockCache, pack: str, identity: str, size: int,
                         tag: str | None) -> None:
    try:
        writing = cache.reserve(pack, identity, size)
    except OSError as exc:
        raise UsageError(f"{store.shown}: cannot keep the LMDB pack in the cache folder {cache.folder} "
                         f"({exc.strerror or exc}); give cache_dir a folder you can write to") from None
    try:
        store.download("", size, writing.fd, tag)
        writing.commit()
    except ObjectChangedError:
        writing.abort()
        raise PackChangedError(f"{store.shown}: the pack changed while it was fetched (it is being packed again?); "
                               "open it again once it is written") from None
    except OSError as exc:
        writing.abort()
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise UsageError(f"{store.shown}: the cache folder {cache.folder} ran out of space while the LMDB pack was "
                             "fetched; free space there, or give cache_dir a folder on a larger disk") from None
        raise
    except BaseException:
        writing.abort()
        raise
