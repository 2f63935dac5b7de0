"""The shards backend of ``PackReader``: a folder holding ``manifest.json``, ``index.bin`` and
``shard-NNNNN.bin`` files, each mapped read-only when first used.

Every file is opened through one descriptor of the folder, taken when the pack is opened: if the
path is given to another pack later (``pack B DEST --overwrite`` renames the old folder away), this
reader goes on reading the pack it opened, or fails with a clear error once its files are gone,
and never mixes the two. Only regular files are opened, never blocking (a FIFO in place of
``index.bin`` is an error, not a hang), and the manifest is refused before parsing when it is
larger than ``MANIFEST_LIMIT``.
"""

from __future__ import annotations

import mmap
import os
import stat
from pathlib import Path

import numpy as np

from packload.core.display import pack_phrase
from packload.core.errors import IncompletePackError, PackFormatError, UsageError
from packload.core.format import (
    FIELDS_NAME,
    FORMAT_VERSION,
    INDEX_ENTRY,
    INDEX_NAME,
    MANIFEST_NAME,
    PARTIAL_SUFFIX,
    PROGRESS_NAME,
    SHARD_HEADER,
    check_entries_fit,
    check_parts_reached,
    decode_index,
    decode_shard_header,
    shard_number,
)
from packload.core.manifest import MANIFEST_LIMIT, Manifest, check_listed_size, decode_manifest, shard_parts
from packload.core.safe_files import (
    FileChangedError,
    FileTooLargeError,
    NotRegularFileError,
    open_regular,
    read_regular,
)
from packload.loaders.prefetch import ParallelFetcher, cut

_MAPS_KEPT = 256  # shards kept mapped: each map holds a descriptor, and a pack may have thousands of shards
_HINT_FDS_KEPT = 16  # shard descriptors kept open for hints when no background reads use them
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


def _damaged_file(path: Path, exc: OSError) -> PackFormatError:
    """Our error for a pack file that is not a plain, stable, reasonably sized file."""
    if isinstance(exc, NotRegularFileError | FileTooLargeError):
        return PackFormatError(f"{path}: {exc.strerror}; the pack is damaged or not a packload pack")
    if isinstance(exc, FileChangedError):
        return PackFormatError(f"{path}: {exc.strerror}; is a pack being written there? wait for it, then retry")
    return PackFormatError(f"{path}: cannot read ({exc.strerror or exc}); the pack is damaged or incomplete")


class ShardsPack:
    """One open shards folder: its manifest, index and shards (mapped on first use)."""

    backend = "shards"
    manifest_bytes = 0
    _fields_map: mmap.mmap | None = None

    def __init__(self, path: Path, fetcher: ParallelFetcher) -> None:
        self.path = path
        self._fetcher = fetcher
        self._maps: dict[int, mmap.mmap] = {}
        self._fds: dict[int, int] = {}
        self._index_map: mmap.mmap | None = None
        self._dir = os.open(path, _DIR_FLAGS)
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        self.manifest = self._read_manifest()
        if self.manifest.backend != "shards":
            raise PackFormatError(f"{self.path / MANIFEST_NAME}: manifest is for {pack_phrase(self.manifest.backend)}")
        index_path = self.path / INDEX_NAME
        # Every size is checked against what can be true before anything is read: the shards' sizes
        # against the manifest, the index's against the manifest and its header against both, each
        # shard against where its records end.
        self.part_names, sizes = self._shard_list()
        self.part_sizes = np.array(sizes, dtype=np.int64)
        try:
            fd, info = open_regular(INDEX_NAME, dir_fd=self._dir)
        except OSError as exc:
            raise _damaged_file(index_path, exc) from None
        try:
            if info.st_size == 0:
                raise PackFormatError(f"{index_path}: empty; the pack is damaged")
            check_listed_size(info.st_size, self.manifest.index.get("size"), str(index_path))
            if self._fetcher.threads:  # network/FUSE: faulting it in waits ~2 requests at a time
                self._fetcher.fetch([(fd, 0, info.st_size)])
            self._index_map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        self.entries, self.paths = decode_index(self._index_map, str(index_path), self.manifest.records,
                                                sum(sizes))
        check_entries_fit(self.entries, self.part_sizes.astype(np.uint64), str(index_path))
        check_parts_reached(self.entries, self.part_sizes, self.part_names, str(self.path))

    def _read_manifest(self) -> Manifest:
        manifest_path = self.path / MANIFEST_NAME
        try:
            raw = read_regular(MANIFEST_NAME, limit=MANIFEST_LIMIT, dir_fd=self._dir)
        except FileNotFoundError:
            if self._exists(PROGRESS_NAME) or self.path.name.endswith(PARTIAL_SUFFIX):
                raise IncompletePackError(f"{self.path}: no {MANIFEST_NAME}: this pack did not finish; "
                                          "finish it with `pack SRC DEST --resume`") from None
            if any(shard_number(name) is not None for name in os.listdir(self._dir)):
                raise IncompletePackError(f"{self.path}: {MANIFEST_NAME} is missing, so the pack cannot be "
                                          "trusted; copy it again in full, or pack the images again") from None
            raise UsageError(f"{self.path}: not a pack (no {MANIFEST_NAME}); give a folder that `pack` wrote") from None
        except OSError as exc:
            raise _damaged_file(manifest_path, exc) from None
        self.manifest_bytes = len(raw)
        return decode_manifest(raw, str(manifest_path))

    def _exists(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self._dir, follow_symlinks=False)
        except OSError:
            return False
        return True

    def _shard_list(self) -> tuple[list[str], list[int]]:
        """The shards' names and sizes from the manifest, each checked against the file there."""
        manifest_path = self.path / MANIFEST_NAME
        parts = shard_parts(self.manifest, str(manifest_path))
        names, sizes = [], []
        for part in parts:
            name = part["name"]
            try:
                info = os.stat(name, dir_fd=self._dir)
            except OSError:
                raise PackFormatError(f"{self.path / name}: shard missing; the pack is incomplete, "
                                      "copy it again") from None
            if not stat.S_ISREG(info.st_mode):
                raise PackFormatError(f"{self.path / name}: not a regular file; the pack is damaged")
            if info.st_size != part.get("size"):
                raise PackFormatError(f"{self.path / name}: {info.st_size} bytes, the manifest says "
                                      f"{part.get('size')}; the shard is truncated or changed, copy it again")
            names.append(name)
            sizes.append(info.st_size)
        return names, sizes

    # -- parts -----------------------------------------------------------------------------
    def shard(self, part: int) -> mmap.mmap:
        """Shard ``part``, mapped read-only (on first use), its header checked."""
        mapped = self._maps.get(part)
        if mapped is not None:
            return mapped
        path = self.path / self.part_names[part]
        try:
            fd, info = open_regular(self.part_names[part], dir_fd=self._dir)
        except FileNotFoundError:
            raise PackFormatError(f"{path}: gone since the pack was opened (replaced or deleted); "
                                  "open the pack again") from None
        except OSError as exc:
            raise _damaged_file(path, exc) from None
        try:
            if info.st_size != int(self.part_sizes[part]):
                raise PackFormatError(f"{path}: {info.st_size} bytes, {int(self.part_sizes[part])} when the pack was "
                                      "opened; the shard changed: copy the pack again")
            mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            # Read, not faulted in: a fault with a cold cache would read megabytes around it.
            head = os.pread(fd, SHARD_HEADER.itemsize, 0)
        finally:
            os.close(fd)
        header = decode_shard_header(head)
        if header is None or header[1] != part:
            mapped.close()
            raise PackFormatError(f"{path}: not shard {part} of this pack; the pack is damaged")
        if header[0] != FORMAT_VERSION:
            mapped.close()
            raise PackFormatError(f"{path}: shard format version {header[0]}, this packload "
                                  f"reads version {FORMAT_VERSION}; upgrade packload or re-pack")
        if len(self._maps) >= _MAPS_KEPT:  # the oldest map is freed (with its descriptor) once no view holds it
            del self._maps[next(iter(self._maps))]
        self._maps[part] = mapped
        return mapped

    def part_view(self, part: int) -> memoryview:
        """The whole of shard ``part``, as a zero-copy view."""
        return memoryview(self.shard(part))

    def part_sizes_of(self, parts: np.ndarray) -> np.ndarray:
        """Bytes in each of shards ``parts`` (an int64 array), as checked when the pack was opened."""
        return self.part_sizes[parts]

    def part_label(self, part: int) -> str:
        """How messages name part ``part``."""
        return self.part_names[part]

    def payload_bytes(self, parts: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[bytes]:
        """``bytes`` of each range of each shard (one copy each, straight from the map)."""
        return cut(self.shard, parts, starts, ends)

    def file_places(self, parts: list[int]) -> tuple[list[int], np.ndarray]:
        """For each of these parts: the descriptor of its file and where the part starts in it."""
        for part in parts:  # map each shard and read its header now: behind the ranges about to
            self.shard(part)  # be queued, that small read would wait for all of them
        if not self._fetcher.threads:  # the hints of earlier calls are given: their descriptors can go
            wanted = set(parts)
            for old in [part for part in self._fds if part not in wanted][: max(0, len(self._fds) - _HINT_FDS_KEPT)]:
                os.close(self._fds.pop(old))
        return [self.fd(part) for part in parts], np.zeros(len(parts), np.int64)

    def fd(self, part: int) -> int:
        """A descriptor of shard ``part``, for positioned reads and hints. Hints use theirs at once,
        so without parallel reads only the last few are kept open (every mapped shard holds a
        descriptor already: a pack of many shards must not take two each)."""
        fd = self._fds.get(part)
        if fd is None:
            try:
                fd = self._fds[part] = open_regular(self.part_names[part], dir_fd=self._dir)[0]
            except OSError as exc:
                raise _damaged_file(self.path / self.part_names[part], exc) from None
        return fd

    def index_bytes(self) -> bytes:
        """The index exactly as stored (for checksums)."""
        return bytes(self._index_map) if self._index_map is not None else b""

    def fields_bytes(self) -> memoryview:
        """``fields.bin`` (a pack made from a table), mapped on first use, its size checked against
        the manifest's."""
        if self._fields_map is None:
            path = self.path / FIELDS_NAME
            try:
                fd, info = open_regular(FIELDS_NAME, dir_fd=self._dir)
            except FileNotFoundError:
                raise PackFormatError(f"{path}: missing, though the manifest lists the pack's fields; the pack is "
                                      "incomplete, copy it again") from None
            except OSError as exc:
                raise _damaged_file(path, exc) from None
            try:
                check_listed_size(info.st_size, self.manifest.fields.get("size"), str(path))
                self._fields_map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            finally:
                os.close(fd)
        return memoryview(self._fields_map)

    def pack_bytes(self) -> int:
        """Bytes of the manifest, the index and the shards, as checked at open (no other file counts)."""
        index = len(self._index_map) if self._index_map is not None else 0
        return self.manifest_bytes + index + int(self.part_sizes.sum())

    def __del__(self) -> None:
        try:
            self.close()  # descriptors are plain integers: nothing else would close them
        except Exception:  # noqa: BLE001 - interpreter shutdown: they close with the process
            pass

    def close(self) -> None:
        """Release the maps and descriptors (a map a caller still views is freed with the view)."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}
        for mapped in self._maps.values():
            try:
                mapped.close()
            except BufferError:
                pass  # a caller still holds a payload view; the map is freed with that view
        self._maps.clear()
        if self._fields_map is not None:
            try:
                self._fields_map.close()
            except BufferError:
                pass  # a caller still holds a column; the map is freed with it
            self._fields_map = None
        if self._index_map is not None:
            self.entries = np.zeros(0, INDEX_ENTRY)
            try:
                self._index_map.close()
            except BufferError:
                pass  # a caller still holds a view of the index; it is freed with that view
            self._index_map = None
        if self._dir >= 0:
            os.close(self._dir)
            self._dir = -1
