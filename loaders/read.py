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
import mmap
import os
import zlib
from collections.abc import Sequence
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
    decode_index,
    decode_manifest,
    entry_path,
    lmdb_chunk_key,
)

PAGE = mmap.PAGESIZE
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

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.backend = detect_backend(self.path)
        self.pid = os.getpid()
        self._maps: dict[int, mmap.mmap] = {}
        self._env: lmdb.Environment | None = None
        self._txn: Any = None
        self._chunk_cache: tuple[int, memoryview] | None = None
        self.closed = False
        self._advised: set[tuple[int, int]] = set()  # (part, MiB) already asked for with MADV_WILLNEED
        try:
            if self.backend == "shards":
                self._open_shards()
            else:
                self._open_lmdb()
            self.records = len(self.entries)
            if self.records != self.manifest["records"]:
                raise PackFormatError(f"{self.path}: manifest says {self.manifest['records']} records, "
                                      f"index holds {self.records}; the pack is damaged")
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
        except lmdb.Error as exc:
            raise UsageError(f"{self.path}: cannot open as an LMDB pack ({exc}); give the .lmdb file "
                             "that `pack` wrote") from None
        self._txn = self._env.begin(buffers=True)
        raw = self._txn.get(LMDB_MANIFEST_KEY)
        if raw is None:
            raise IncompletePackError(f"{self.path}: no manifest: this pack did not finish; "
                                      "finish it with `pack SRC DEST --resume`")
        self.manifest = decode_manifest(bytes(raw), str(self.path))
        if self.manifest["backend"] != "lmdb":
            raise PackFormatError(f"{self.path}: manifest is for a {self.manifest['backend']} pack")
        index = self._txn.get(LMDB_INDEX_KEY)
        if index is None:
            raise PackFormatError(f"{self.path}: no index; the pack is damaged")
        self.entries, self.paths = decode_index(index, str(self.path))
        self.part_names = []

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
        value = self._txn.get(lmdb_chunk_key(part))
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

    def copy_raw(self, positions: np.ndarray, out: np.ndarray, verify: bool = False, chw: bool = False) -> None:
        """Copy the raw pixels of records ``positions`` (in 0..records-1) into ``out``, B×H×W×3
        uint8 (or B×3×H×W with ``chw``), straight from the memory map: the fast path for raw packs."""
        entries = self.entries[positions]
        if len(positions) > 1:
            self._prefetch(entries)
        size = out[0].nbytes if len(out) else 0
        if (entries["payload_len"] != size).any():
            bad = int(positions[np.flatnonzero(entries["payload_len"] != size)[0]])
            raise ValueError(f"{self.where(bad)}: raw payload is not {out.shape[1:]} pixels")
        arrays: dict[int, np.ndarray] = {}
        shape = (out.shape[2], out.shape[3], out.shape[1]) if chw else out.shape[1:]
        for k, (part, start) in enumerate(zip(entries["part"].tolist(), entries["payload_offset"].tolist(),
                                              strict=True)):
            array = arrays.get(part)
            if array is None:
                array = arrays[part] = np.frombuffer(self.part_view(part), np.uint8)
            if start + size > len(array):
                raise PackFormatError(f"{self.where(int(positions[k]))}: payload runs past the end of its part")
            pixels = array[start : start + size].reshape(shape)
            out[k] = pixels.transpose(2, 0, 1) if chw else pixels
            if verify and zlib.crc32(pixels) != int(entries["payload_crc32"][k]):
                raise ChecksumError(f"{self.where(int(positions[k]))}: checksum mismatch, the stored bytes "
                                    "are damaged; re-copy the pack or re-pack the source")

    def _prefetch(self, entries: np.ndarray) -> None:
        """``MADV_WILLNEED`` over each run of the given records that lie close together in one part
        and span at least 64 KiB (smaller runs are covered by a page fault's own read-around)."""
        entries = np.sort(entries, order=["part", "record_offset"])
        parts = entries["part"].astype(np.int64)
        starts = entries["record_offset"].astype(np.int64)
        ends = (entries["payload_offset"] + entries["payload_len"]).astype(np.int64)
        # A new run starts where the part changes or the gap to the previous record is large.
        first = np.ones(len(entries), dtype=bool)
        first[1:] = (parts[1:] != parts[:-1]) | (starts[1:] - ends[:-1] > 256 * 1024)
        run_starts = np.flatnonzero(first)
        run_ends = np.append(run_starts[1:], len(entries)) - 1
        spans = np.maximum.reduceat(ends, run_starts) - starts[run_starts]
        for lo, hi in zip(run_starts[spans >= 64 * 1024].tolist(), run_ends[spans >= 64 * 1024].tolist(),
                          strict=True):
            part, start, stop = int(parts[lo]), int(starts[lo]), int(ends[lo : hi + 1].max())
            granules = {(part, g) for g in range(start >> 20, ((stop - 1) >> 20) + 1)}
            if granules <= self._advised:
                continue  # asked for already: the kernel has it or is reading it
            if len(self._advised) > 1 << 17:
                self._advised.clear()
            self._advised |= granules
            view = self.part_view(part)
            if min(stop, len(view)) > start:
                _madvise_willneed(view[start : min(stop, len(view))])

    def index_bytes(self) -> bytes:
        """The index exactly as stored (for checksums)."""
        if self.backend == "shards":
            return bytes(self._index_map)
        return bytes(self._txn.get(LMDB_INDEX_KEY))

    def close(self) -> None:
        """Release the maps and the LMDB environment."""
        self.closed = True
        self._chunk_cache = None
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
