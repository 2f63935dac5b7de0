"""Open a pack (LMDB file or shards folder) and hand out record payloads without copying.

``PackReader`` maps the pack's files read-only and returns ``memoryview`` slices of them, so N
DataLoader workers share the page cache and no worker copies the pack into its own memory.
Batched reads (``payloads``) hint the kernel to fetch each contiguous run of records in one large
request (``MADV_WILLNEED``), which is what keeps cold-cache and network-disk reads fast.

A reader holds OS resources; open one per process (``loaders.PackedImageFolder`` does this
lazily, after DataLoader workers fork or spawn).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import mmap
import os
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from packer.errors import ChecksumError, IncompletePackError, PackFormatError, UsageError
from packer.format import (
    FORMAT_VERSION,
    INDEX_ENTRY,
    INDEX_NAME,
    LMDB_INDEX_KEY,
    LMDB_MANIFEST_KEY,
    MANIFEST_NAME,
    PAYLOAD_FORMATS,
    SHARD_HEADER,
    SHARD_MAGIC,
    check_entries_fit,
    check_raw_sizes,
    decode_index,
    decode_manifest,
    entry_path,
    lmdb_chunk_key,
)

PAGE = mmap.PAGESIZE
_GRANULE_SHIFT = 17  # prefetch in whole 128 KiB granules: a FUSE request's and the default readahead's size
_RUN_GAP = 1 << 20  # records closer than this are prefetched as one run (a sampler block's sparse picks)
_MADV_WILLNEED = 3
_libc: Any = None


def _madvise_willneed(view: memoryview) -> None:
    """Ask the kernel to read the pages under ``view`` now, in large requests (best effort)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    address = np.frombuffer(view, np.uint8).ctypes.data
    start = address - address % PAGE
    _libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(address + len(view) - start), _MADV_WILLNEED)


class _ParallelFetcher:
    """Fill the page cache for byte ranges of files with many positioned reads in flight at once.

    On network and FUSE filesystems ``MADV_WILLNEED`` and readahead keep only one or two requests
    in flight, so a batch's runs arrive one round trip after another; reading them in 128 KiB pieces
    from a few threads overlaps the round trips. The bytes read are dropped: the memory maps then
    find the pages cached. Threads are started lazily, again in a forked child."""

    def __init__(self, threads: int = 16) -> None:
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._pid = 0

    def pool(self) -> ThreadPoolExecutor:
        if self._pool is None or self._pid != os.getpid():
            self._pool, self._pid = ThreadPoolExecutor(self.threads, thread_name_prefix="packload-fetch"), os.getpid()
        return self._pool

    def fetch(self, ranges: list[tuple[int, int, int]]) -> None:
        """Read every ``(fd, offset, length)`` range; returns when all are in the page cache."""
        step = 1 << _GRANULE_SHIFT
        pieces = [(fd, o, min(step, off + n - o)) for fd, off, n in ranges for o in range(off, off + n, step)]
        for _ in self.pool().map(_read_piece, pieces):
            pass

    def close(self) -> None:
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=False)
        self._pool = None


def _read_piece(piece: tuple[int, int, int]) -> None:
    fd, offset, length = piece
    try:
        os.pread(fd, length, offset)
    except OSError:
        pass  # only a hint: the memory map reports real errors when the bytes are used


def _parallel_reads(path: Path) -> bool:
    """Whether to prefetch with parallel reads: on network and FUSE filesystems, unless
    ``PACKLOAD_PARALLEL_READS`` is set to 0 (never) or 1 (always)."""
    forced = os.environ.get("PACKLOAD_PARALLEL_READS")
    if forced in ("0", "1"):
        return forced == "1"
    from loaders.machine import storage_facts

    facts = storage_facts(str(path))
    return bool(facts["network"] or facts["fuse"])


class _SharedEnvironments:
    """py-lmdb allows one open environment per file per process, so readers of the same file in one
    process share it, each with its own read transaction; it is closed when its last reader closes.

    A forked DataLoader worker inherits its parent's open environments and py-lmdb refuses to open
    them again there, so the child reuses the inherited one. That is safe here and only here: the
    environment is read-only and opened with ``lock=False``, so it has no lock file or reader table
    (the state LMDB's fork caveat is about), and nothing writes the file while it is read."""

    def __init__(self) -> None:
        self._open: dict[tuple[int, int], list[Any]] = {}

    def acquire(self, path: Path) -> tuple[lmdb.Environment, tuple[int, int]]:
        """The environment of the file at ``path`` and the key to release it with. Keyed by the
        file's identity (device, inode), so a pack replaced by a new one is opened afresh."""
        st = os.stat(path)
        key = (st.st_dev, st.st_ino)
        slot = self._open.get(key)
        if slot is None:
            env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, readahead=True, max_readers=1)
            # Reading a page past the end of a truncated file would kill the process with SIGBUS.
            needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
            if needed > st.st_size:
                env.close()
                raise PackFormatError(f"{path}: truncated ({st.st_size} bytes, the database needs {needed}); "
                                      "copy the pack again")
            slot = self._open[key] = [env, 0]
        slot[1] += 1
        return slot[0], key

    def release(self, key: tuple[int, int]) -> None:
        slot = self._open.get(key)
        if slot is not None:
            slot[1] -= 1
            if slot[1] == 0:
                del self._open[key]
                slot[0].close()


_ENVIRONMENTS = _SharedEnvironments()


def detect_backend(path: Path) -> str:
    """``shards`` for a folder, ``lmdb`` for a file; clear errors for anything else."""
    if path.is_dir():
        return "shards"
    if path.is_file():
        return "lmdb"
    partial = path.with_name(path.name + ".partial")
    if partial.exists():
        raise IncompletePackError(f"{path}: not found, but an unfinished pack is at {partial}; "
                                  "finish it with `pack SRC DEST --resume`")
    raise UsageError(f"{path}: no such pack; give the .lmdb file or shards folder that `pack` wrote")


class PackReader:
    """Read-only access to one pack: its manifest, its index and each record's payload."""

    def __init__(self, path: str | os.PathLike[str], check_index: bool = False) -> None:
        """``check_index``: compare the index with the manifest's sha256 before trusting it (what
        ``verify=True`` readers do, so a damaged label, offset or orientation is an error too)."""
        self.path = Path(path)
        if self.path.name.endswith(".partial"):  # pack writes DEST.partial and renames it when done
            raise IncompletePackError(f"{self.path}: an unfinished pack (it did not finish, or was never renamed "
                                      "into place); finish it with `pack SRC DEST --resume`")
        self.backend = detect_backend(self.path)
        self.pid = os.getpid()
        self._maps: dict[int, mmap.mmap] = {}
        self._env: lmdb.Environment | None = None
        self._txn: Any = None
        self._chunk_cache: tuple[int, memoryview] | None = None
        self.closed = False
        self._advised: set[tuple[int, int]] = set()  # (part, granule) already asked for with MADV_WILLNEED
        self._fetcher: _ParallelFetcher | None = None  # set up by the first prefetch on network/FUSE storage
        self._fds: dict[int, int] = {}  # part (-1: the LMDB file) -> descriptor for the parallel reads
        self._chunk_offsets: dict[int, int] = {}  # LMDB chunk -> its offset in the file
        try:
            if self.backend == "shards":
                self._open_shards()
            else:
                self._open_lmdb()
            self.records = len(self.entries)
            if self.records != self.manifest["records"]:
                raise PackFormatError(f"{self.path}: manifest says {self.manifest['records']} records, "
                                      f"index holds {self.records}; the pack is damaged")
            labels = self.entries["label"]
            if self.records and (int(labels.min()) < -1 or int(labels.max()) >= max(1, len(self.classes))
                                 or (not self.classes and int(labels.max()) != -1)):
                raise PackFormatError(f"{self.path}: index holds labels outside the manifest's "
                                      f"{len(self.classes)} classes; the pack is damaged")
            check_raw_sizes(self.entries, str(self.path))
            if check_index:
                self._check_index_digest()
        except BaseException:
            self.close()
            raise

    # -- opening ---------------------------------------------------------------------------
    def _open_shards(self) -> None:
        manifest_path = self.path / MANIFEST_NAME
        if not manifest_path.is_file():
            if (self.path / "progress.json").exists() or self.path.name.endswith(".partial"):
                raise IncompletePackError(f"{self.path}: no {MANIFEST_NAME}: this pack did not finish; "
                                          "finish it with `pack SRC DEST --resume`")
            if any(self.path.glob("shard-*.bin")):
                raise IncompletePackError(f"{self.path}: {MANIFEST_NAME} is missing, so the pack cannot be "
                                          "trusted; copy it again in full, or pack the images again")
            raise UsageError(f"{self.path}: not a pack (no {MANIFEST_NAME}); give a folder that `pack` wrote")
        self.manifest = decode_manifest(manifest_path.read_bytes(), str(manifest_path))
        if self.manifest["backend"] != "shards":
            raise PackFormatError(f"{manifest_path}: manifest is for a {self.manifest['backend']} pack")
        index_path = self.path / INDEX_NAME
        try:
            with open(index_path, "rb") as f:
                self._index_map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise PackFormatError(f"{index_path}: cannot read the index ({exc}); the pack is damaged") from None
        self.entries, self.paths = decode_index(self._index_map, str(index_path))
        parts = self.manifest.get("parts")
        if not isinstance(parts, list) or not all(isinstance(p, dict) and isinstance(p.get("name"), str)
                                                  for p in parts):
            raise PackFormatError(f"{manifest_path}: manifest has no valid shard list; the pack is damaged")
        self.part_names = [p["name"] for p in parts]
        sizes = []
        for part in parts:
            name = part["name"]
            if "/" in name or "\\" in name or name.startswith("."):
                raise PackFormatError(f"{manifest_path}: shard name {name!r} is not a plain file name")
            try:
                size = (self.path / name).stat().st_size
            except OSError:
                raise PackFormatError(f"{self.path / name}: shard missing; the pack is incomplete, "
                                      "copy it again") from None
            if size != part.get("size"):
                raise PackFormatError(f"{self.path / name}: {size} bytes, the manifest says {part.get('size')}; "
                                      "the shard is truncated or changed, copy it again")
            sizes.append(size)
        check_entries_fit(self.entries, np.array(sizes, dtype=np.uint64), str(index_path))

    def _open_lmdb(self) -> None:
        try:
            self._env, self._env_key = _ENVIRONMENTS.acquire(self.path)
            self._txn = self._env.begin(buffers=True)
        except lmdb.Error as exc:
            raise UsageError(f"{self.path}: cannot open as an LMDB pack ({exc}); give the .lmdb file "
                             "that `pack` wrote") from None
        raw = self._get(LMDB_MANIFEST_KEY, "the manifest")
        if raw is None:
            raise IncompletePackError(f"{self.path}: no manifest: this pack did not finish; "
                                      "finish it with `pack SRC DEST --resume`")
        self.manifest = decode_manifest(bytes(raw), str(self.path))
        if self.manifest["backend"] != "lmdb":
            raise PackFormatError(f"{self.path}: manifest is for a {self.manifest['backend']} pack")
        index = self._get(LMDB_INDEX_KEY, "the index")
        if index is None:
            raise PackFormatError(f"{self.path}: no index; the pack is damaged")
        self.entries, self.paths = decode_index(index, str(self.path))
        self.part_names = []

    def _get(self, key: bytes, what: str) -> memoryview | None:
        """A value of the LMDB file; a damaged B-tree page is our error, not LMDB's."""
        try:
            return self._txn.get(key)
        except lmdb.Error as exc:
            raise PackFormatError(f"{self.path}: cannot read {what} ({exc}); the LMDB file is damaged: "
                                  "copy it again") from None

    def _check_index_digest(self) -> None:
        expected = self.manifest.get("index", {}).get("sha256")
        if hashlib.sha256(self.index_bytes()).hexdigest() != expected:
            raise ChecksumError(f"{self.path}: the index does not match the sha256 in the manifest; the pack "
                                "is damaged: re-copy it, or run `packload verify` on it")

    # -- metadata --------------------------------------------------------------------------
    @property
    def classes(self) -> list[str]:
        return list(self.manifest["classes"])

    @property
    def encoding(self) -> str:
        return self.manifest["encoding"]

    def labels(self) -> np.ndarray:
        """Class index of every record (int64)."""
        return self.entries["label"].astype(np.int64)

    def path_of(self, i: int) -> str:
        """The original relative path of record ``i``."""
        return entry_path(self.entries, self.paths, self.normalize_index(i))

    def format_of(self, i: int) -> str:
        return PAYLOAD_FORMATS[int(self.entries["format"][i])]

    def where(self, i: int) -> str:
        """Where record ``i`` lives, for error messages: its shard or chunk and its original path."""
        part = int(self.entries["part"][i])
        place = self.part_names[part] if self.backend == "shards" else f"chunk {part}"
        return f"record {i} ({self.path_of(i)}) in {self.path}, {place}"

    def normalize_index(self, i: int) -> int:
        """``i`` as a record number in 0..records-1 (negative counts from the end); IndexError if out of range."""
        if not -self.records <= i < self.records:
            raise IndexError(f"record {i} out of range: the pack has {self.records} records")
        return i % self.records if i < 0 else i

    # -- payloads --------------------------------------------------------------------------
    def _shard(self, part: int) -> mmap.mmap:
        mapped = self._maps.get(part)
        if mapped is None:
            path = self.path / self.part_names[part]
            with open(path, "rb") as f:
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            header = np.frombuffer(mapped, SHARD_HEADER, 1)[0] if len(mapped) >= SHARD_HEADER.itemsize else None
            if header is None or bytes(header["magic"]) != SHARD_MAGIC or int(header["part"]) != part:
                raise PackFormatError(f"{path}: not shard {part} of this pack; the pack is damaged")
            if int(header["version"]) != FORMAT_VERSION:
                raise PackFormatError(f"{path}: shard format version {int(header['version'])}, this packload "
                                      f"reads version {FORMAT_VERSION}; upgrade packload or re-pack")
            del header
            self._maps[part] = mapped
        return mapped

    def _chunk(self, part: int) -> memoryview:
        if self._chunk_cache is not None and self._chunk_cache[0] == part:
            return self._chunk_cache[1]
        value = self._get(lmdb_chunk_key(part), f"chunk {part}")
        if value is None:
            raise PackFormatError(f"{self.path}: chunk {part} is missing; the pack is damaged")
        self._chunk_cache = (part, value)
        return value

    def part_view(self, part: int) -> memoryview:
        """The whole of shard or chunk ``part``, as a zero-copy view."""
        if self.backend == "shards":
            return memoryview(self._shard(part))
        return self._chunk(part)

    def payload(self, i: int, verify: bool = False) -> memoryview:
        """Record ``i``'s payload as a zero-copy view (valid while the reader is open)."""
        i = self.normalize_index(i)
        entry = self.entries[i]
        start = int(entry["payload_offset"])
        end = start + int(entry["payload_len"])
        part = self.part_view(int(entry["part"]))
        if end > len(part):
            raise PackFormatError(f"{self.where(i)}: payload runs past the end of its part; the pack is damaged")
        view = part[start:end]
        if verify and zlib.crc32(view) != int(entry["payload_crc32"]):
            raise ChecksumError(f"{self.where(i)}: checksum mismatch, the stored bytes are damaged; "
                                "re-copy the pack or re-pack the source")
        return view

    def positions(self, indices: Sequence[int]) -> np.ndarray:
        """``indices`` as record numbers in 0..records-1 (negative ones count from the end), checked
        all at once; IndexError names the first one out of range."""
        positions = np.asarray(indices, dtype=np.int64).reshape(-1)
        bad = (positions < -self.records) | (positions >= self.records)
        if bad.any():
            raise IndexError(f"record {int(positions[bad][0])} out of range: the pack has {self.records} records")
        return np.where(positions < 0, positions + self.records, positions)

    def payloads(self, indices: Sequence[int], verify: bool = False) -> list[memoryview]:
        """Payloads of several records as zero-copy views, prefetching each contiguous run of them
        in one request. Looks the whole batch up in the index at once (no per-record numpy calls)."""
        positions = self.positions(indices)
        entries = self.entries[positions]
        if len(positions) > 1:
            self._prefetch(entries)
        views: dict[int, memoryview] = {}
        out = []
        for part, start, length in zip(entries["part"].tolist(), entries["payload_offset"].tolist(),
                                       entries["payload_len"].tolist(), strict=True):
            view = views.get(part)
            if view is None:
                view = views[part] = self.part_view(part)
            if start + length > len(view):
                raise PackFormatError(f"{self.where(int(positions[len(out)]))}: payload runs past the end of its "
                                      "part; the pack is damaged")
            out.append(view[start : start + length])
        if verify:
            for k, (view, crc) in enumerate(zip(out, entries["payload_crc32"].tolist(), strict=True)):
                if zlib.crc32(view) != crc:
                    raise ChecksumError(f"{self.where(int(positions[k]))}: checksum mismatch, the stored bytes are "
                                        "damaged; re-copy the pack or re-pack the source")
        return out

    def _prefetch(self, entries: np.ndarray) -> None:
        """Fetch each run of the given records that lie close together in one part, widened to whole
        128 KiB granules: ``MADV_WILLNEED`` on local disks, parallel positioned reads on network and
        FUSE storage (:class:`_ParallelFetcher`). Every run is fetched, small ones too, so a batch's
        requests overlap where page faults would wait one round trip each (README, "Slow storage")."""
        entries = np.sort(entries, order=["part", "record_offset"])
        parts = entries["part"].astype(np.int64)
        starts = entries["record_offset"].astype(np.int64)
        ends = (entries["payload_offset"] + entries["payload_len"]).astype(np.int64)
        # A new run starts where the part changes or the gap to the previous record is large.
        first = np.ones(len(entries), dtype=bool)
        first[1:] = (parts[1:] != parts[:-1]) | (starts[1:] - ends[:-1] > _RUN_GAP)
        run_starts = np.flatnonzero(first)
        run_ends = np.append(run_starts[1:], len(entries)) - 1
        if self._fetcher is None:
            self._fetcher = _ParallelFetcher() if _parallel_reads(self.path) else _ParallelFetcher(0)
        ranges: list[tuple[int, int, int]] = []
        if self._fetcher.threads and self.backend == "lmdb":
            self._locate_chunks(np.unique(parts).tolist())
        for lo, hi in zip(run_starts.tolist(), run_ends.tolist(), strict=True):
            part, start, stop = int(parts[lo]), int(starts[lo]), int(ends[lo : hi + 1].max())
            size = len(self.part_view(part))
            stop = min(stop, size)  # a damaged length must not make a huge set below
            if start < 0 or stop <= start:
                continue
            first_g, last_g = start >> _GRANULE_SHIFT, (stop - 1) >> _GRANULE_SHIFT
            start, stop = first_g << _GRANULE_SHIFT, min(size, (last_g + 1) << _GRANULE_SHIFT)
            granules = {(part, g) for g in range(first_g, last_g + 1)}
            if granules <= self._advised:
                continue  # asked for already: the kernel has it or is reading it
            if len(self._advised) > 1 << 17:
                self._advised.clear()
            self._advised |= granules
            if self._fetcher.threads:
                ranges.append(self._file_range(part, start, stop))
            else:
                _madvise_willneed(self.part_view(part)[start:stop])
        if ranges:
            self._fetcher.fetch(ranges)

    def _file_range(self, part: int, start: int, stop: int) -> tuple[int, int, int]:
        """``(fd, file offset, length)`` of bytes ``start:stop`` of ``part``."""
        key = part if self.backend == "shards" else -1
        fd = self._fds.get(key)
        if fd is None:
            fd = self._fds[key] = os.open(self.path / self.part_names[part] if key >= 0 else self.path, os.O_RDONLY)
        if key >= 0:
            return fd, start, stop - start
        return fd, self._chunk_offsets[part] + start, stop - start

    def _locate_chunks(self, parts: list[int]) -> None:
        """File offsets of LMDB chunks not located yet, looked up from the fetcher's threads (each
        lookup may wait on storage for a B-tree or overflow page), so the waits overlap."""
        missing = [p for p in parts if p not in self._chunk_offsets]
        if not missing:
            return
        env = self._env
        base = env.info()["map_addr"]  # chunk views point into LMDB's map of the whole file

        def locate(part: int) -> tuple[int, int | None]:
            try:
                with env.begin(buffers=True) as txn:
                    value = txn.get(lmdb_chunk_key(part))
                    return part, None if value is None else np.frombuffer(value, np.uint8).ctypes.data - base
            except lmdb.Error:
                return part, None  # the reader's own lookup reports it

        assert self._fetcher is not None
        for part, offset in self._fetcher.pool().map(locate, missing):
            if offset is not None:
                self._chunk_offsets[part] = offset

    def index_bytes(self) -> bytes:
        """The index exactly as stored (for checksums)."""
        if self.backend == "shards":
            return bytes(self._index_map)
        return bytes(self._get(LMDB_INDEX_KEY, "the index"))

    def close(self) -> None:
        """Release the maps and the LMDB environment."""
        self.closed = True
        self._chunk_cache = None
        if getattr(self, "_fetcher", None) is not None:
            self._fetcher.close()
        for fd in getattr(self, "_fds", {}).values():
            os.close(fd)
        self._fds = {}
        if self._txn is not None:
            self._txn.abort()
            self._txn = None
        if self._env is not None:
            _ENVIRONMENTS.release(self._env_key)
            self._env = None
        for mapped in self._maps.values():
            try:
                mapped.close()
            except BufferError:
                pass  # a caller still holds a payload view; the map is freed with that view
        self._maps.clear()
        index_map = getattr(self, "_index_map", None)
        if index_map is not None:
            self.entries = np.zeros(0, INDEX_ENTRY)
            try:
                index_map.close()
            except BufferError:
                pass  # a caller still holds a view of the index; it is freed with that view

    def __enter__(self) -> PackReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a PackReader holds open files; pass the pack's path to other processes instead")
