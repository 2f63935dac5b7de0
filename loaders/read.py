"""Open a pack (LMDB file or shards folder) and hand out record payloads without copying.

``PackReader`` maps the pack's files read-only and returns ``memoryview`` slices of them, so N
DataLoader workers share the page cache and no worker copies the pack into its own memory.
Batched reads (``payloads``) ask the storage for each contiguous run of records in one large
request first (``loaders.prefetch``), which is what keeps cold-cache and network-disk reads fast.

Everything a reader trusts is checked when the pack is opened: the manifest, the index (every
offset and length inside its part, labels inside the classes, raw sizes matching their pixels),
and the parts themselves (``loaders.read_shards``, ``loaders.read_lmdb``). A reader holds OS
resources; open one per process (``PackedImageFolder`` does this lazily, after DataLoader
workers fork or spawn).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from packload.core.display import plural, terminal_safe
from packload.core.errors import ChecksumError, IncompletePackError, PackFormatError, UsageError
from packload.core.format import (
    INDEX_ENTRY,
    PARTIAL_SUFFIX,
    PAYLOAD_FORMATS,
    entry_path,
)
from packload.core.manifest import Manifest
from packload.core.remote import is_url
from packload.core.storage import reads_wait
from packload.core.urls import display_url
from packload.loaders.pack_open import detect_backend, open_at_url, open_local
from packload.loaders.prefetch import ParallelFetcher, Prefetcher, cut, distinct
from packload.loaders.read_backend import LocalPackBackend, PackBackend
from packload.loaders.read_checks import check_index_agrees, check_index_digest
from packload.loaders.read_remote import DEFAULT_BLOCK_SIZE, RemoteShardsPack


def pack_identity(manifest: Manifest) -> str:
    """What tells this pack from any other written to the same path: the manifest's ``id`` (new for
    every pack written), or for packs written before it existed, the index's sha256."""
    identity = manifest.id or manifest.index.get("sha256")
    return str(identity or "")


class PackReader:
    """Read-only access to one pack: its manifest, its index and each record's payload."""

    def __init__(self, path: str | os.PathLike[str], check_index: bool = False,
                 parallel_reads: bool | None = None, *, cache_dir: str | os.PathLike[str] | None = None,
                 cache_limit: int | None = None, block_size: int = DEFAULT_BLOCK_SIZE,
                 storage_options: dict[str, Any] | None = None, timeout: float | None = None) -> None:
        """``check_index``: compare the index with the manifest's sha256 before trusting it (what
        ``verify=True`` readers do, so a damaged label, offset or orientation is an error too).
        ``parallel_reads``: fetch from 16 threads at once (True), never (False), or where each read
        waits a round trip, on network and FUSE storage (None).

        ``path`` may be a URL (``s3://bucket/train.shards``, ``gs://``, ``https://``, any fsspec
        URL): a shards pack is then read in ranged requests of ``block_size`` bytes through the
        local cache folder ``cache_dir`` (at most ``cache_limit`` bytes; ``loaders.read_cache``), an
        LMDB pack fetched whole into it first. ``storage_options`` go to fsspec (an endpoint, keys);
        ``timeout``: seconds a request to the store may wait for its answer (default
        ``$PACKLOAD_TIMEOUT`` or 20; see ``packload.core.remote``)."""
        if is_url(path):
            self._open_remote(str(path), check_index, cache_dir, cache_limit, block_size, storage_options, timeout)
            return
        self.remote = False
        self.path = Path(path)
        if self.path.name.endswith(PARTIAL_SUFFIX):  # pack writes DEST.partial and renames it when done
            raise IncompletePackError(f"{self.path}: an unfinished pack (it did not finish, or was never renamed "
                                      "into place); finish it with `pack SRC DEST --resume`")
        self.backend = detect_backend(self.path)
        self._start()
        if parallel_reads is None:
            parallel_reads = reads_wait(self.path)
        self.parallel_reads = parallel_reads
        self._fetcher = ParallelFetcher() if parallel_reads else ParallelFetcher(0)
        try:
            self._adopt(open_local(self.path, self.backend, self._fetcher))
            self._prefetcher = Prefetcher(self.entries, self._fetcher)
            if check_index:
                check_index_digest(self.manifest, self.index_bytes(), str(self.path))
        except BaseException:
            self.close()
            raise

    def _open_remote(self, url: str, check_index: bool, cache_dir: str | os.PathLike[str] | None,
                     cache_limit: int | None, block_size: int, storage_options: dict[str, Any] | None,
                     timeout: float | None = None) -> None:
        """``__init__`` for a URL: a shards pack read through the cache, or an LMDB pack fetched into it."""
        self.remote = True
        # A URL is no local Path; shown as it may be shown (no credentials, no signature).
        self.path = display_url(url.rstrip("/"))  # type: ignore[assignment]
        if self.path.endswith(PARTIAL_SUFFIX):
            raise IncompletePackError(f"{self.path}: an unfinished pack; pack it again")
        self._start()
        self.parallel_reads = True
        self._fetcher = ParallelFetcher(0)  # the remote pack fetches with threads of its own
        try:
            self.backend, pack, local = open_at_url(url, self._fetcher, cache_dir, cache_limit, block_size,
                                                    storage_options, timeout)
            if local is not None:
                self.local_path = local  # the LMDB pack's file in the cache folder
            self._adopt(pack)
            if check_index:
                check_index_digest(self.manifest, self.index_bytes(), str(self.path))
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        """The state of a reader that has opened nothing yet."""
        self.pid = os.getpid()
        self.closed = False
        self._pack: PackBackend | None = None  # loaders.read_backend: the backends' one interface
        self._prefetcher: Prefetcher | None = None

    def _adopt(self, pack: PackBackend) -> None:
        """Read through ``pack``, its index checked against its manifest first."""
        self._pack = pack
        self.manifest: Manifest = pack.manifest
        self.entries: np.ndarray = pack.entries
        self.paths: bytes = pack.paths
        self.part_names: list[str] = pack.part_names
        self.records = len(self.entries)
        check_index_agrees(self.manifest, self.entries, str(self.path))

    def forked(self) -> PackReader:
        """This reader of a pack at a URL, for a process forked from the one that opened it (a
        DataLoader worker): the manifest and index it read carry over, so a worker starts without
        a round trip to the store; connections, threads and locks are new. Its pack is the one the
        parent opened. A reader of a local pack cannot be carried over: open it again."""
        if not isinstance(self._pack, RemoteShardsPack) or self.closed:
            raise UsageError(f"{self.path}: only an open reader of a shards pack at a URL carries over a fork; "
                             "open the pack again")
        copy = object.__new__(PackReader)
        copy.__dict__.update(self.__dict__)
        copy.pid = os.getpid()
        copy._fetcher = ParallelFetcher(0)
        copy._pack = self._pack.forked()
        return copy

    @property
    def ranged(self) -> bool:
        """Whether payloads come by ranged requests to an object store (not from a map of local files)."""
        return isinstance(self._pack, RemoteShardsPack)

    # -- metadata --------------------------------------------------------------------------
    @property
    def classes(self) -> list[str]:
        return list(self.manifest.classes)

    @property
    def encoding(self) -> str:
        return self.manifest.encoding

    @property
    def identity(self) -> str:
        """See :func:`pack_identity`."""
        return pack_identity(self.manifest)

    def labels(self) -> np.ndarray:
        """Class index of every record (int64)."""
        return self.entries["label"].astype(np.int64)

    def path_of(self, i: int) -> str:
        """The original relative path of record ``i``."""
        return entry_path(self.entries, self.paths, self.normalize_index(i))

    def format_of(self, i: int) -> str:
        return PAYLOAD_FORMATS[int(self.entries["format"][i])]

    def where(self, i: int) -> str:
        """Where record ``i`` lives, for error messages: its shard or chunk and its original path
        (control characters escaped: the path comes from the pack)."""
        part = int(self.entries["part"][i])
        place = self.part_names[part] if self.backend == "shards" else f"chunk {part}"
        return f"record {i} ({terminal_safe(self.path_of(i))}) in {self.path}, {place}"

    def normalize_index(self, i: int) -> int:
        """``i`` as a record number in 0..records-1 (negative counts from the end); IndexError if out of range."""
        if not -self.records <= i < self.records:
            raise IndexError(f"record {i} out of range: the pack has {plural(self.records, 'record')}")
        return i % self.records if i < 0 else i

    # -- payloads --------------------------------------------------------------------------
    def part_view(self, part: int) -> memoryview:
        """The whole of shard or chunk ``part``, as a zero-copy view."""
        return self._open_pack().part_view(part)

    def _open_pack(self) -> PackBackend:
        if self._pack is None:
            raise PackFormatError(f"{self.path}: this reader is closed; open the pack again")
        return self._pack

    def payload(self, i: int, verify: bool = False) -> memoryview:
        """Record ``i``'s payload as a zero-copy view (valid while the reader is open)."""
        i = self.normalize_index(i)
        if self.ranged:
            return self.payloads([i], verify)[0]
        start = int(self.entries["payload_offset"][i])
        view = self.part_view(int(self.entries["part"][i]))[start : start + int(self.entries["payload_len"][i])]
        if verify and zlib.crc32(view) != int(self.entries["payload_crc32"][i]):
            raise ChecksumError(f"{self.where(i)}: checksum mismatch, the stored bytes are damaged; "
                                "re-copy the pack or re-pack the source")
        return view

    def positions(self, indices: Sequence[int]) -> np.ndarray:
        """``indices`` as record numbers in 0..records-1 (negative ones count from the end), checked
        all at once; IndexError names the first one out of range."""
        positions = np.asarray(indices, dtype=np.int64).reshape(-1)
        if not len(positions) or (positions.min() >= 0 and positions.max() < self.records):
            return positions  # the common case, checked with two reductions and no copy
        bad = (positions < -self.records) | (positions >= self.records)
        if bad.any():
            raise IndexError(f"record {int(positions[bad][0])} out of range: the pack has {plural(self.records, 'record')}")
        return np.where(positions < 0, positions + self.records, positions)

    def payloads(self, indices: Sequence[int], verify: bool = False) -> list[memoryview]:
        """Payloads of several records as zero-copy views, prefetching each contiguous run of them
        in one request. Looks the whole batch up in the index at once (no per-record numpy calls)."""
        positions, parts, starts, ends = self._spans(indices)
        if self.ranged:
            out = [memoryview(b) for b in self._open_pack().payload_bytes(parts, starts, ends)]
        else:
            out = cut(self.part_view, parts, starts, ends)
        if verify:
            self._verify(positions, out)
        return out

    def payload_bytes(self, indices: Sequence[int], verify: bool = False) -> list[bytes]:
        """Payloads of several records as ``bytes`` (one copy each, straight from the map: cheaper
        than a view and then ``bytes(view)``), prefetched as :meth:`payloads` does."""
        positions, parts, starts, ends = self._spans(indices)
        out = self._open_pack().payload_bytes(parts, starts, ends)
        if verify:
            self._verify(positions, out)
        return out

    def _spans(self, indices: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(record numbers, parts, payload starts, payload ends) of ``indices``, after prefetching
        them. Every entry was checked to lie inside its part when the pack was opened. Reads single
        index fields (gathering whole 64-byte entries costs far more)."""
        positions = self.positions(indices)
        entries = self.entries
        parts = entries["part"][positions].astype(np.int64)
        starts = entries["payload_offset"][positions].astype(np.int64)
        ends = starts + entries["payload_len"][positions].astype(np.int64)
        if len(positions) > 1 and self._prefetcher is not None:
            self._prefetcher.before_batch(positions, parts, ends, self.file_ranges)
        return positions, parts, starts, ends

    def _verify(self, positions: np.ndarray, payloads: Sequence[bytes | memoryview]) -> None:
        """Raise ChecksumError naming the first payload whose CRC-32 is not the index's."""
        crcs = self.entries["payload_crc32"][positions].tolist()
        for k, (payload, crc) in enumerate(zip(payloads, crcs, strict=True)):
            if zlib.crc32(payload) != crc:
                raise ChecksumError(f"{self.where(int(positions[k]))}: checksum mismatch, the stored bytes are "
                                    "damaged; re-copy the pack or re-pack the source")

    def advise(self, indices: Sequence[int] | np.ndarray) -> int:
        """Ask the storage for the bytes of records that will be read soon, and return at once
        (:meth:`loaders.prefetch.Prefetcher.advise`). The page cache is shared, so a hint given in the
        process that runs the sampler serves the DataLoader workers too (``PackSampler(prefetch=...)``
        does this). Returns the bytes asked for."""
        if self.closed:
            return 0
        if isinstance(self._pack, RemoteShardsPack):
            positions = self.positions(indices)
            entries = self.entries
            return self._pack.advise(entries["part"][positions].astype(np.int64),
                                     entries["record_offset"][positions].astype(np.int64),
                                     (entries["payload_offset"][positions] + entries["payload_len"][positions]).astype(np.int64))
        if self._prefetcher is None:
            return 0
        return self._prefetcher.advise(self.positions(indices), self.file_ranges)

    def file_ranges(self, parts: np.ndarray, starts: np.ndarray,
                    stops: np.ndarray) -> tuple[list[tuple[int, int, int]], np.ndarray]:
        """``(fd, file offset, length)`` of bytes ``starts:stops`` of each of ``parts`` (int64 arrays),
        clipped to the part, and which of the inputs they are; empty ranges are left out."""
        unique = distinct(parts)
        pack = self._open_pack()
        assert isinstance(pack, LocalPackBackend), "file ranges are read ahead for local packs only"
        fds, bases = pack.file_places(unique.tolist())
        at = np.searchsorted(unique, parts)
        starts = np.maximum(starts, 0)
        stops = np.minimum(stops, pack.part_sizes_of(unique)[at])
        kept = np.flatnonzero(stops > starts)
        return list(zip([fds[k] for k in at[kept].tolist()], (bases[at] + starts)[kept].tolist(),
                        (stops - starts)[kept].tolist(), strict=True)), kept

    def index_bytes(self) -> bytes:
        """The index exactly as stored (for checksums)."""
        return self._open_pack().index_bytes()

    def fields_bytes(self) -> memoryview | bytes:
        """The fields part of a pack made from a table (``loaders.fields`` reads it), its size checked
        against the manifest; ``PackFormatError`` when it is missing."""
        return self._open_pack().fields_bytes()

    def pack_bytes(self) -> int:
        """Bytes the pack takes, from sizes checked when it was opened (what ``info`` reports): a
        shards pack's manifest, index and shards (each the size the manifest lists, and where its
        records end); an LMDB pack's pages (a tail of the file past LMDB's last page is never read).
        Files of the folder that are no part of the pack are not counted."""
        pack = self._open_pack()
        if not isinstance(pack, LocalPackBackend):
            raise UsageError(f"{self.path}: a pack at a URL; its size is its listing's")
        return pack.pack_bytes()

    def close(self) -> None:
        """Release the maps and descriptors."""
        self.closed = True
        fetcher = getattr(self, "_fetcher", None)
        if fetcher is not None:
            fetcher.close()
        # Views of the index map let go of first, so that the map can close.
        self.entries = np.zeros(0, INDEX_ENTRY)
        self._prefetcher = None
        if self._pack is not None:
            self._pack.close()
            self._pack = None

    def __enter__(self) -> PackReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a PackReader holds open files; pass the pack's path to other processes instead")
