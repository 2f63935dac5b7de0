"""Open a pack (LMDB file or shards folder) and hand out record payloads without copying.

``PackReader`` maps the pack's files read-only and returns ``memoryview`` slices of them, so N
DataLoader workers share the page cache and no worker copies the pack into its own memory.
Batched reads (``payloads``) hint the kernel to fetch each contiguous run of records in one large
request (``POSIX_FADV_WILLNEED``), which is what keeps cold-cache and network-disk reads fast.

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
from collections.abc import Callable, Sequence
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
_PREFETCH_RECORD_LIMIT = 1 << 30  # a longer record is not prefetched (a damaged index entry, surely)
_GRANULE_SHIFT = 17  # prefetch in whole 128 KiB granules: a FUSE request's and the default readahead's size
_ADVISED_LIMIT = 1 << 17  # pieces (up to 16 GiB) asked for before the reader forgets which, and asks again
_CHUNKS_KEPT = 4096  # LMDB chunk views a reader keeps (about 4 GiB of a pack's map; the views are small)
_BLOCK_RECORDS = 64  # a batch's prefetch stops at the edges of such groups: PackSampler's default block_size
_BLOCK_SHIFT = 31  # a piece's key: block << 31 | part within the block << 25 | granule within the part's share
_PARTS_IN_BLOCK = 63
_IN_BLOCK = (1 << 25) - 1
_NO_LIMIT = 1 << 62
_F_BIGDATA, _P_LEAF, _P_OVERFLOW, _PAGE_HEADER = 0x01, 0x02, 0x04, 16  # LMDB 0.9's page and node flags
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


def _distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, sorted (``np.unique`` without its first-call import of ``numpy.ma``)."""
    values = np.sort(values)
    return values[np.concatenate([[True], values[1:] != values[:-1]])] if len(values) else values


def _cut(source: Callable[[int], Any], parts: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[Any]:
    """``source(part)[start:end]`` for each record: views of memoryviews, bytes of memory maps."""
    if len(parts) and (parts == parts[0]).all():  # the common case: one shard or chunk
        whole = source(int(parts[0]))
        return [whole[start:end] for start, end in zip(starts.tolist(), ends.tolist(), strict=True)]
    sources = {part: source(part) for part in _distinct(parts).tolist()}
    return [sources[part][start:end] for part, start, end in zip(parts.tolist(), starts.tolist(), ends.tolist(),
                                                                   strict=True)]


def _distinct_first(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values, sorted, and where each first occurs in ``values``."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    first = np.concatenate([[True], ordered[1:] != ordered[:-1]]) if len(values) else np.zeros(0, bool)
    return ordered[first], order[first]


class _ParallelFetcher:
    """Fill the page cache for byte ranges of files with many positioned reads in flight at once.

    On network and FUSE filesystems ``WILLNEED`` hints and readahead keep only one or two requests
    in flight, so a batch's runs arrive one round trip after another; reading them in 128 KiB pieces
    from a few threads overlaps the round trips. The bytes read are dropped: the memory maps then
    find the pages cached. ``fetch`` waits for its reads (a batch's own); ``queue`` does not (a
    sampler's announcement), and runs on threads of its own so that it never delays a batch.
    Threads are started lazily, again in a forked child."""

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
        step = 1 << _GRANULE_SHIFT
        pieces = [(fd, o, min(step, off + n - o)) for fd, off, n in ranges for o in range(off, off + n, step)]
        for _ in self._pools()[0].map(_read_piece, pieces):
            pass

    def queue(self, pieces: list[tuple[int, int, int]], keys: list[int], done: set[int]) -> None:
        """Start reading each ``(fd, offset, length)`` piece and return at once; a piece's key goes
        into ``done`` once it is read, and a piece whose key is there already is not read."""
        ahead = self._pools()[1]
        for piece, key in zip(pieces, keys, strict=True):
            ahead.submit(_read_ahead, piece, key, done)

    def close(self) -> None:
        if self._pid == os.getpid():
            if self._pool is not None:
                self._pool.shutdown(wait=False)
            if self._ahead is not None:  # reads not started are dropped; the running ones finish
                self._ahead.shutdown(wait=True, cancel_futures=True)  # before their descriptors close
        self._pool = self._ahead = None


def _read_piece(piece: tuple[int, int, int]) -> None:
    fd, offset, length = piece
    try:
        os.pread(fd, length, offset)
    except OSError:
        pass  # only a hint: the memory map reports real errors when the bytes are used


def _read_ahead(piece: tuple[int, int, int], key: int, done: set[int]) -> None:
    if key not in done:  # a batch may have needed it first, and read it itself
        _read_piece(piece)
        done.add(key)


def parallel_reads(path: Path) -> bool:
    """Whether to prefetch with parallel reads: on network and FUSE filesystems, unless
    ``PACKLOAD_PARALLEL_READS`` is set to 0 (never) or 1 (always)."""
    forced = os.environ.get("PACKLOAD_PARALLEL_READS")
    if forced in ("0", "1"):
        return forced == "1"
    from loaders.machine import storage_facts

    facts = storage_facts(str(path))
    return bool(facts["network"] or facts["fuse"])


class PackHints:
    """Announce the records a sampler will hand out next, from the process that runs the sampler.

    Called with an array of upcoming record numbers: opens the pack read-only on first use (again
    after a fork) and passes them to :meth:`PackReader.advise`, which queues the reads and returns.
    Best effort: a failure is kept in ``error``, never raised (the reads themselves report a
    missing or damaged pack). Pickles as just the path. ``PackSampler(prefetch=path)`` builds one.

    (Queueing from a helper thread instead was measured slower with a cold cache on two cores.)"""

    def __init__(self, path: str | os.PathLike[str], opener: Callable[[], PackReader] | None = None) -> None:
        """``opener``: returns this process's reader of the pack, to share it (``PackedImageFolder.sampler``
        passes the dataset's); without one, the hints open a reader of their own."""
        self.path = Path(path)
        self._opener = opener
        self._reader: PackReader | None = None
        self.error: Exception | None = None

    def __call__(self, indices: np.ndarray) -> int:
        try:
            if self._opener is not None:
                return self._opener().advise(indices)
            if self._reader is None or self._reader.closed or self._reader.pid != os.getpid():
                self._reader = PackReader(self.path)
            return self._reader.advise(indices)
        except Exception as exc:
            self.error = exc
            return 0

    def close(self) -> None:
        if self._reader is not None and self._reader.pid == os.getpid():
            self._reader.close()
        self._reader = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the files close with the process
            pass

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_opener": None, "_reader": None, "error": None}

    def __repr__(self) -> str:
        return f"PackHints({str(self.path)!r})"


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
            # No readahead on LMDB's own map: it serves only B-tree lookups (each touches a page or
            # two; with readahead each would read megabytes around it). Readers take the values'
            # bytes from their own map of the file, prefetched (PackReader._chunk).
            env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, readahead=False, max_readers=1)
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
        self._chunks: dict[int, memoryview] = {}  # LMDB chunk -> its value (see _chunk)
        self.closed = False
        self._advised: set[int] = set()  # pieces already asked for (see _prefetch)
        self._asked: np.ndarray | None = None  # per record: all its pieces asked for (see _prefetch)
        self._fetcher: _ParallelFetcher | None = None  # see _storage_fetcher
        self._fds: dict[int, int] = {}  # part (-1: the LMDB file) -> descriptor for the parallel reads
        self._chunk_offsets: dict[int, int] = {}  # LMDB chunk -> its offset in the file
        self._chunk_table = np.full((2, 0), -1, np.int64)  # LMDB: offset and size of chunk i, -1 unknown
        self._overflows_checked = 0
        self._leaf_values: dict[bytes, tuple[int, int]] = {}  # LMDB key -> (file offset, size), see _overflow
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
                fetcher = self._storage_fetcher()
                if fetcher.threads:  # network/FUSE: faulting it in waits ~2 requests at a time
                    fetcher.fetch([(f.fileno(), 0, os.fstat(f.fileno()).st_size)])
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
        self._part_sizes = sizes
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
        self._page_size = int(self._env.stat()["psize"])
        self._map_addr = int(self._env.info()["map_addr"])
        with open(self.path, "rb") as f:
            self._maps[-1] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        index = self._value(LMDB_INDEX_KEY, "the index")
        if index is None:
            raise PackFormatError(f"{self.path}: no index; the pack is damaged")
        self.entries, self.paths = decode_index(index, str(self.path))
        self.part_names = []
        chunks = int(self.entries["part"].max()) + 1 if len(self.entries) else 0  # a damaged index's absurd
        self._chunk_table = np.full((2, min(chunks, len(self.entries) + 1)), -1, np.int64)  # numbers: not here

    def _value(self, key: bytes, what: str) -> memoryview | None:
        """A value of the LMDB file as a view of the reader's own map (fetched ahead when it is
        large: in one request, or on network and FUSE storage by parallel reads, as the shards'
        index is), or LMDB's when it lies inline in its leaf page (see :meth:`_overflow`)."""
        located = self._overflow(key)
        if located is None:
            return self._get(key, what)
        offset, size = located
        view = memoryview(self._maps[-1])[offset : offset + size]
        if size > PAGE:
            fetcher = self._storage_fetcher()
            if fetcher.threads:  # faulting it in there waits ~2 requests at a time
                fetcher.fetch([(self._fd(-1), offset, size)])
            else:
                _madvise_willneed(view)
        return view

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
                # Read, not faulted in: a fault with a cold cache would read megabytes around it.
                head = os.pread(f.fileno(), SHARD_HEADER.itemsize, 0)
            header = np.frombuffer(head, SHARD_HEADER, 1)[0] if len(head) >= SHARD_HEADER.itemsize else None
            if header is None or bytes(header["magic"]) != SHARD_MAGIC or int(header["part"]) != part:
                raise PackFormatError(f"{path}: not shard {part} of this pack; the pack is damaged")
            if int(header["version"]) != FORMAT_VERSION:
                raise PackFormatError(f"{path}: shard format version {int(header['version'])}, this packload "
                                      f"reads version {FORMAT_VERSION}; upgrade packload or re-pack")
            del header
            self._maps[part] = mapped
        return mapped

    def _chunk(self, part: int) -> memoryview:
        """Chunk ``part`` of an LMDB pack, as a view of the reader's own map of the file.

        py-lmdb reads a whole value when it hands it out (1 MiB, synchronously, with a cold cache),
        so a chunk is located from its B-tree node instead (:meth:`_overflow`: only the node's leaf
        page is read) and its bytes are left to the prefetch. The last few thousand are kept."""
        value = self._chunks.get(part)
        if value is not None:
            return value
        located = self._overflow(lmdb_chunk_key(part))
        if located is not None:
            offset, size = located
            value = memoryview(self._maps[-1])[offset : offset + size]
        else:  # stored inline in its leaf page, or a layout this reader does not know: ask LMDB
            value = self._get(lmdb_chunk_key(part), f"chunk {part}")
            if value is None:
                raise PackFormatError(f"{self.path}: chunk {part} is missing; the pack is damaged")
            offset = np.frombuffer(value, np.uint8).ctypes.data - self._env.info()["map_addr"]
        if len(self._chunks) >= _CHUNKS_KEPT:
            self._chunks.clear()
        self._chunks[part] = value
        self._chunk_offsets[part] = offset
        if part < self._chunk_table.shape[1]:
            self._chunk_table[:, part] = (offset, len(value))
        return value

    def _chunk_spans(self, parts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(file offset, size) of LMDB chunk ``parts`` (an int64 array), each; -1 for a chunk that
        cannot be located. A table lookup once located, for a batch's worth at a time."""
        table = self._chunk_table
        if len(parts) and int(parts.max()) < table.shape[1]:
            found = table[:, parts]
            if (found[0] >= 0).all():
                return found[0], found[1]
        self._locate_chunks(_distinct(parts).tolist())
        listed = parts.tolist()
        return (np.array([self._chunk_offsets.get(part, -1) for part in listed], np.int64),
                np.array([len(self._chunk(part)) if part in self._chunk_offsets else -1 for part in listed], np.int64))

    def _overflow(self, name: bytes) -> tuple[int, int] | None:
        """(file offset, size) of the value of key ``name`` when LMDB stores it on overflow pages, read
        from its leaf node (LMDB 0.9's on-disk layout: the node header ``lo, hi, flags, ksize`` just
        before the key, the first overflow page's number just after it, a 16-byte page header there,
        checked); None when it is not there or does not check out.

        A B-tree lookup reads the value's first page too (with a cold cache, one 4 KB random read per
        chunk), so the first lookup on a leaf page notes every overflow value on that page
        (:meth:`_note_leaf`) and the chunks beside it are found without one."""
        located = self._leaf_values.get(name)
        if located is None:
            try:
                cursor = self._txn.cursor()
                if not cursor.set_key(name):
                    return None
                key = cursor.key()
            except lmdb.Error:
                return None
            at = np.frombuffer(key, np.uint8).ctypes.data
            lo, hi, flags, key_size = (ctypes.c_uint16 * 4).from_address(at - 8)
            if not flags & _F_BIGDATA or key_size != len(key):
                return None
            page = int.from_bytes(ctypes.string_at(at + key_size, 8), "little")
            located = page * self._page_size + _PAGE_HEADER, lo | hi << 16
            self._note_leaf(at)
        offset, size = located
        if offset + size > len(self._maps[-1]):
            return None
        if self._overflows_checked < 2:  # the layout, checked on a reader's first chunks: a small
            fd = self._fd(-1)  # read, not a fault (which would read around it)
            header = os.pread(fd, _PAGE_HEADER, offset - _PAGE_HEADER)
            if int.from_bytes(header[:8], "little") != (offset - _PAGE_HEADER) // self._page_size \
                    or not header[10] & _P_OVERFLOW:
                return None
            self._overflows_checked += 1
        return located

    def _note_leaf(self, at: int) -> None:
        """Note (file offset, size) of every value on overflow pages in the LMDB leaf page holding
        address ``at`` (a key LMDB just returned from it, so the page is in memory): the page header
        (``pgno, pad, flags, lower, upper``), its array of node offsets, each node as above. Nodes
        that do not check out are skipped; their keys take the lookup."""
        psize = self._page_size
        page_at = at - (at - self._map_addr) % psize
        header = (ctypes.c_uint16 * 8).from_address(page_at)
        flags, lower, upper = header[5], header[6], header[7]
        if not flags & _P_LEAF or not _PAGE_HEADER <= lower <= upper <= psize:
            return
        for node in (ctypes.c_uint16 * ((lower - _PAGE_HEADER) // 2)).from_address(page_at + _PAGE_HEADER):
            if node < upper or node + 8 > psize:
                continue
            lo, hi, node_flags, key_size = (ctypes.c_uint16 * 4).from_address(page_at + node)
            if not node_flags & _F_BIGDATA or node + 8 + key_size + 8 > psize:
                continue
            key = ctypes.string_at(page_at + node + 8, key_size)
            page = int.from_bytes(ctypes.string_at(page_at + node + 8 + key_size, 8), "little")
            self._leaf_values[key] = (page * psize + _PAGE_HEADER, lo | hi << 16)

    def _part_size(self, part: int) -> int:
        """Bytes in shard or chunk ``part`` (a shard's from the manifest, checked at open: not mapped)."""
        if self.backend == "shards":
            return self._part_sizes[part]
        return len(self._chunk(part))

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
        if not len(positions) or (positions.min() >= 0 and positions.max() < self.records):
            return positions  # the common case, checked with two reductions and no copy
        bad = (positions < -self.records) | (positions >= self.records)
        if bad.any():
            raise IndexError(f"record {int(positions[bad][0])} out of range: the pack has {self.records} records")
        return np.where(positions < 0, positions + self.records, positions)

    def payloads(self, indices: Sequence[int], verify: bool = False) -> list[memoryview]:
        """Payloads of several records as zero-copy views, prefetching each contiguous run of them
        in one request. Looks the whole batch up in the index at once (no per-record numpy calls)."""
        positions, parts, starts, ends = self._spans(indices)
        out = _cut(self.part_view, parts, starts, ends)
        if verify:
            self._verify(positions, out)
        return out

    def payload_bytes(self, indices: Sequence[int], verify: bool = False) -> list[bytes]:
        """Payloads of several records as ``bytes`` (one copy each, straight from the map: cheaper
        than a view and then ``bytes(view)``), prefetched as :meth:`payloads` does."""
        positions, parts, starts, ends = self._spans(indices)
        if self.backend == "lmdb":  # offsets within the file (chunks all located by _spans): one map
            base = self._chunk_spans(parts)[0]
            out = _cut(lambda _: self._maps[-1], np.zeros_like(parts), starts + base, ends + base)
        else:
            out = _cut(self._shard, parts, starts, ends)
        if verify:
            self._verify(positions, out)
        return out

    def _spans(self, indices: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(record numbers, parts, payload starts, payload ends) of ``indices``, checked against the
        parts' sizes, after prefetching them. Reads single index fields (gathering whole 64-byte
        entries costs ~10× more)."""
        positions = self.positions(indices)
        entries = self.entries
        parts = entries["part"][positions].astype(np.int64)
        starts = entries["payload_offset"][positions].astype(np.int64)
        ends = starts + entries["payload_len"][positions].astype(np.int64)
        if len(positions) > 1:
            self._prefetch(positions, parts, ends)
        if self.backend == "lmdb" and len(parts):
            sizes: int | np.ndarray = self._chunk_spans(parts)[1]
            if (sizes < 0).any():  # a chunk that is not there: the error that names it
                self._part_size(int(parts[np.flatnonzero(sizes < 0)[0]]))
        elif len(parts) and (parts == parts[0]).all():
            sizes = self._part_size(int(parts[0]))
        else:
            known = {part: self._part_size(part) for part in _distinct(parts).tolist()}
            sizes = np.array([known[part] for part in parts.tolist()], dtype=np.int64)
        past = np.flatnonzero(ends > sizes)
        if past.size:
            raise PackFormatError(f"{self.where(int(positions[past[0]]))}: payload runs past the end of its "
                                  "part; the pack is damaged")
        return positions, parts, starts, ends

    def _verify(self, positions: np.ndarray, payloads: Sequence[bytes | memoryview]) -> None:
        """Raise ChecksumError naming the first payload whose CRC-32 is not the index's."""
        crcs = self.entries["payload_crc32"][positions].tolist()
        for k, (payload, crc) in enumerate(zip(payloads, crcs, strict=True)):
            if zlib.crc32(payload) != crc:
                raise ChecksumError(f"{self.where(int(positions[k]))}: checksum mismatch, the stored bytes are "
                                    "damaged; re-copy the pack or re-pack the source")

    def _prefetch(self, positions: np.ndarray, parts: np.ndarray, ends: np.ndarray) -> None:
        """Fetch what the given records need that was not asked for yet: each record's 128 KiB
        granules, cut at the edges of its group of ``_BLOCK_RECORDS`` consecutive records (a
        ``PackSampler`` block, so a shuffled read does not fetch the neighbouring blocks' bytes
        too), each run of them as one range: ``POSIX_FADV_WILLNEED`` on local disks, parallel
        positioned reads on network and FUSE storage (:class:`_ParallelFetcher`). Every run is
        fetched, small ones too, so a batch's requests overlap where page faults would wait one
        round trip each (README, "Slow storage"). A batch whose pieces were all asked for already
        (most batches of a sampler window) costs one lookup in a per-record table (a byte per
        record). On network and FUSE storage a piece announced by :meth:`advise` counts as asked
        for once the background has read it: until then a batch that needs it reads it itself.
        ``parts`` and ``ends`` (where each payload ends) are the caller's, as int64."""
        asked = self._asked_table()
        if asked[positions].all():
            return  # every piece of these records was asked for already
        self._prefetch_pieces(positions, parts, ends)
        asked[positions] = True

    def _storage_fetcher(self) -> _ParallelFetcher:
        """This reader's fetcher, decided once: 16 threads on network and FUSE storage
        (:func:`parallel_reads`), none elsewhere."""
        if self._fetcher is None:
            self._fetcher = _ParallelFetcher() if parallel_reads(self.path) else _ParallelFetcher(0)
        return self._fetcher

    def _asked_table(self) -> np.ndarray:
        """One flag per record: all its pieces asked for (by a batch's prefetch or by ``advise``)."""
        if self._asked is None:
            self._asked = np.zeros(self.records, dtype=bool)
        return self._asked

    def _prefetch_pieces(self, positions: np.ndarray, parts: np.ndarray, ends: np.ndarray) -> None:
        """``_prefetch``'s work: the pieces of these records not asked for yet, asked for."""
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
        ranges = self._file_ranges(piece_parts[heads_at], lo[heads_at], stops)[0]
        fetcher = self._storage_fetcher()
        if fetcher.threads:
            fetcher.fetch(ranges)
        else:  # what MADV_WILLNEED on the map does too, without locating each range in it
            for fd, offset, length in ranges:
                os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)

    def _fresh_pieces(self, positions: np.ndarray, parts: np.ndarray,
                      ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """The pieces these records need that were not asked for yet (not in ``_advised``): each
        one's key, part, and byte range in the part (``lo``, ``hi``); None if there are none."""
        entries = self.entries
        starts = np.maximum(entries["record_offset"][positions].astype(np.int64), 0)  # a damaged offset must not
        keep = (ends > starts) & (ends - starts <= _PREFETCH_RECORD_LIMIT)  # make a huge range, nor a damaged
        if not keep.all():  # length (the read reports it): prefetching it would allocate absurd arrays
            positions, parts, starts, ends = positions[keep], parts[keep], starts[keep], ends[keep]
        # The block's first and last record bound what is fetched (when they lie in the same part).
        blocks = positions // _BLOCK_RECORDS
        heads = blocks * _BLOCK_RECORDS
        tails = np.minimum(heads + _BLOCK_RECORDS, self.records) - 1
        head_parts = entries["part"][heads].astype(np.int64)
        floor = np.where(head_parts == parts, entries["record_offset"][heads].astype(np.int64), 0)
        ceiling = np.where(entries["part"][tails] == parts,
                           (entries["payload_offset"][tails] + entries["payload_len"][tails]).astype(np.int64),
                           _NO_LIMIT)
        first_g, last_g = starts >> _GRANULE_SHIFT, (ends - 1) >> _GRANULE_SHIFT
        span = last_g - first_g + 1
        # A piece: granule g of block b in part p (key: b, p counted from the block's first part, g
        # from the block's first granule in that part).
        base = blocks << _BLOCK_SHIFT | np.clip(parts - head_parts, 0, _PARTS_IN_BLOCK) << 25
        first_key = base | ((first_g - (floor >> _GRANULE_SHIFT)) & _IN_BLOCK)
        if (span <= 2).all():
            keys = np.concatenate([first_key, first_key + (span - 1)])
            rows = np.concatenate([np.arange(len(span)), np.arange(len(span))])
        else:  # records over two granules: every granule in between too
            rows = np.repeat(np.arange(len(span)), span)
            keys = first_key[rows] + np.arange(span.sum()) - np.repeat(np.cumsum(span) - span, span)
        distinct, first_at = _distinct_first(keys)  # a batch's records share few pieces
        advised = self._advised
        fresh = [key not in advised for key in distinct.tolist()]
        if not any(fresh):
            return None  # asked for already: the kernel has it or is reading it
        if len(advised) > _ADVISED_LIMIT:  # the cache may have dropped early ones: ask again later
            advised.clear()
            self._asked_table()[:] = False
        wanted = np.array(fresh, dtype=bool)
        keys, rows = distinct[wanted], rows[first_at[wanted]]
        granules = (keys & _IN_BLOCK) + (floor[rows] >> _GRANULE_SHIFT)
        lo = np.maximum(granules << _GRANULE_SHIFT, floor[rows])
        hi = np.minimum((granules + 1) << _GRANULE_SHIFT, ceiling[rows])
        return keys, parts[rows], lo, hi

    def advise(self, indices: Sequence[int] | np.ndarray) -> int:
        """Ask the storage for the bytes of records that will be read soon, and return at once.

        Each run of consecutive records in one part (a sampler block, or several) is announced as
        one range, exactly, with ``posix_fadvise(POSIX_FADV_WILLNEED)``, so the kernel reads it in
        large requests while the caller goes on (and reads nothing the records do not need). The
        page cache is shared, so a hint given in the process that runs the sampler serves the
        DataLoader workers too (``PackSampler(prefetch=...)`` does this). Returns the bytes asked for.

        On network and FUSE storage, where the kernel keeps only a request or two in flight for
        such hints, the records' 128 KiB pieces are read instead, in the background, by threads of
        their own (:class:`_ParallelFetcher`): a batch that needs a piece before its turn reads it
        itself, so the announcement never makes a batch wait longer than its own reads would."""
        if self.closed:
            return 0
        positions = self.positions(indices)
        if not len(positions):
            return 0
        entries = self.entries
        parts = entries["part"][positions].astype(np.int64)
        ends = (entries["payload_offset"][positions] + entries["payload_len"][positions]).astype(np.int64)
        if self._storage_fetcher().threads:
            return self._queue_pieces(positions, parts, ends)
        starts = entries["record_offset"][positions].astype(np.int64)
        by_place = np.lexsort((starts, parts))
        parts, starts, ends = parts[by_place], starts[by_place], ends[by_place]
        first = np.ones(len(parts), dtype=bool)  # records that touch the one before join its run
        first[1:] = (parts[1:] != parts[:-1]) | (starts[1:] > ends[:-1] + PAGE)  # records do not overlap
        run_starts = np.flatnonzero(first)
        run_stops = np.maximum.reduceat(ends, run_starts)
        ranges = self._file_ranges(parts[run_starts], starts[run_starts], run_stops)[0]
        for fd, offset, length in ranges:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
        self._asked_table()[positions] = True  # a batch of them need not ask again (see _prefetch)
        return sum(length for _, _, length in ranges)

    def _queue_pieces(self, positions: np.ndarray, parts: np.ndarray, ends: np.ndarray) -> int:
        """``advise`` on network and FUSE storage: the records' pieces not asked for yet, queued for
        reading in the background. Each goes into ``_advised`` once read, so a batch that comes to
        it earlier finds it fresh and reads it itself (the records are not marked as asked)."""
        fresh = self._fresh_pieces(positions, parts, ends)
        if fresh is None:
            return 0
        keys, piece_parts, lo, hi = fresh
        ranges, kept = self._file_ranges(piece_parts, lo, hi)
        self._storage_fetcher().queue(ranges, keys[kept].tolist(), self._advised)
        return sum(length for _, _, length in ranges)

    def _file_ranges(self, parts: np.ndarray, starts: np.ndarray,
                     stops: np.ndarray) -> tuple[list[tuple[int, int, int]], np.ndarray]:
        """``(fd, file offset, length)`` of bytes ``starts:stops`` of each of ``parts`` (int64 arrays),
        clipped to the part, and which of the inputs they are; empty ranges, and LMDB chunks that
        cannot be located (the read that needs them reports it), are left out."""
        distinct = _distinct(parts)
        listed = distinct.tolist()
        if self.backend == "lmdb":
            bases, sizes = self._chunk_spans(distinct)
            fds = [self._fd(-1)] * len(listed)
        else:
            for part in listed:  # map each shard and read its header now: behind the ranges about to
                self._shard(part)  # be queued, that small read would wait for all of them
            sizes = np.array([self._part_size(part) for part in listed], np.int64)
            bases = np.zeros(len(listed), np.int64)
            fds = [self._fd(part) for part in listed]
        at = np.searchsorted(distinct, parts)
        starts = np.maximum(starts, 0)
        stops = np.minimum(stops, sizes[at])
        kept = np.flatnonzero(stops > starts)
        return list(zip([fds[k] for k in at[kept].tolist()], (bases[at] + starts)[kept].tolist(),
                        (stops - starts)[kept].tolist(), strict=True)), kept

    def _fd(self, key: int) -> int:
        """A descriptor of shard ``key`` (-1: the LMDB file), for positioned reads and hints."""
        fd = self._fds.get(key)
        if fd is None:
            fd = self._fds[key] = os.open(self.path / self.part_names[key] if key >= 0 else self.path, os.O_RDONLY)
        return fd

    def _locate_chunks(self, parts: list[int]) -> None:
        """File offsets of LMDB chunks not located yet (:meth:`_chunk`; reads only B-tree pages)."""
        for part in parts:
            if part not in self._chunk_offsets:
                try:
                    self._chunk(part)
                except PackFormatError:
                    pass  # the read that needs it reports it

    def index_bytes(self) -> bytes:
        """The index exactly as stored (for checksums)."""
        if self.backend == "shards":
            return bytes(self._index_map)
        return bytes(self._value(LMDB_INDEX_KEY, "the index"))

    def close(self) -> None:
        """Release the maps and the LMDB environment."""
        self.closed = True
        self._chunks = {}
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
