"""The LMDB backend of ``PackReader``: one LMDB file holding the manifest, the index and the chunks
(``c`` + chunk number) of consecutive records.

The file is read through the reader's own read-only map, never through the LMDB library: every
value is located from the B-tree by :class:`loaders.lmdb_pages.LmdbLayout`, which checks each page
it reads against the file first, so a damaged or hostile file gives a clear error and never makes
a read run past the end of the file (which would kill the process with SIGBUS). The B-tree is read
through a second map without readahead (each lookup touches a page or two; with readahead each
would read megabytes around it); values through the first, prefetched as a batch needs them.
"""

from __future__ import annotations

import mmap
import os
from functools import partial
from pathlib import Path

import numpy as np

from packload.core.display import pack_phrase
from packload.core.errors import IncompletePackError, PackFormatError, UsageError
from packload.core.format import (
    INDEX_ENTRY,
    LMDB_FIELDS_KEY,
    LMDB_INDEX_KEY,
    LMDB_MANIFEST_KEY,
    PROGRESS_KEY,
    decode_index,
    lmdb_chunk_key,
)
from packload.core.lmdb_meta import HEADER, MAGIC, current_meta
from packload.core.lmdb_pages import LmdbLayout
from packload.core.manifest import MANIFEST_LIMIT, Manifest, check_listed_size, decode_manifest
from packload.core.safe_files import open_regular
from packload.loaders.prefetch import PAGE, ParallelFetcher, cut, distinct

_MAGIC_AT, _LMDB_MAGIC = HEADER, MAGIC.to_bytes(4, "little")  # what every LMDB file starts with, after a page header


def _fetch_pages(fetcher: ParallelFetcher, fd: int, ranges: list[tuple[int, int]]) -> None:
    """Bring B-tree pages in before they are parsed: by parallel reads on network and FUSE storage
    (one round trip for a whole level of the tree), else left to the page faults."""
    if fetcher.threads and ranges:
        fetcher.fetch([(fd, offset, length) for offset, length in ranges])


class LmdbPack:
    """One open LMDB pack: its manifest, its index, and where each chunk lies in the file."""

    backend = "lmdb"
    part_names: list[str] = []
    used_bytes = 0  # bytes of the file LMDB's pages take (a tail past its last page is never read)

    def __init__(self, path: Path, fetcher: ParallelFetcher) -> None:
        self.path = path
        self._fetcher = fetcher
        self._map: mmap.mmap | None = None
        self._tree: mmap.mmap | None = None
        self._index_view: memoryview | None = None
        self._layout: LmdbLayout | None = None
        try:
            self._fd, info = open_regular(path)
        except OSError as exc:
            raise PackFormatError(f"{path}: cannot open as a pack ({exc.strerror or exc}); give the .lmdb file "
                                  "that `pack` wrote") from None
        try:
            self._open(info.st_size)
        except BaseException:
            self.close()
            raise

    def _open(self, size: int) -> None:
        if size < _MAGIC_AT + 4 or os.pread(self._fd, 4, _MAGIC_AT) != _LMDB_MAGIC:
            raise UsageError(f"{self.path}: not an LMDB file; give the .lmdb file or shards folder that `pack` wrote")
        self._map = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)
        self._tree = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)
        self._tree.madvise(mmap.MADV_RANDOM)
        self._layout = LmdbLayout(self._tree, str(self.path), prefetch=partial(_fetch_pages, self._fetcher, self._fd))
        manifest, index, progress = self._layout.locate_many([LMDB_MANIFEST_KEY, LMDB_INDEX_KEY, PROGRESS_KEY])
        if manifest is None:
            if progress is not None:
                raise IncompletePackError(f"{self.path}: no manifest: this pack did not finish; "
                                          "finish it with `pack SRC DEST --resume`")
            raise IncompletePackError(f"{self.path}: no manifest: not a finished packload pack; finish it with "
                                      "`pack SRC DEST --resume`, or give the .lmdb file that `pack` wrote")
        if manifest[1] > MANIFEST_LIMIT:
            raise PackFormatError(f"{self.path}: manifest of {manifest[1]:,} bytes, more than the "
                                  f"{MANIFEST_LIMIT:,} a packload manifest may take; the pack is damaged")
        self.manifest: Manifest = decode_manifest(self._value(*manifest).tobytes(), str(self.path))
        if self.manifest.backend != "lmdb":
            raise PackFormatError(f"{self.path}: manifest is for {pack_phrase(self.manifest.backend)}")
        if index is None:
            raise PackFormatError(f"{self.path}: no index; the pack is damaged")
        # Sizes checked against what can be true before the index is read (see decode_index).
        check_listed_size(index[1], self.manifest.index.get("size"), f"{self.path}: index")
        self._index_view = self._value(*index)
        self.entries, self.paths = decode_index(self._index_view, str(self.path), self.manifest.records, size)
        meta = current_meta(self._tree, str(self.path))
        self.used_bytes = min(size, (meta.last_pgno + 1) * meta.page_size)  # LMDB's pages: what is ever read
        self._need = self._chunk_needs()
        self._table = np.full((2, len(self._need)), -1, np.int64)  # offset and size of each chunk, once located

    def _chunk_needs(self) -> np.ndarray:
        """How long each chunk must be for the records the index places in it (where the last payload
        in it ends). Chunks are located lazily (a large pack has many thousands), and each is checked
        against this when it is."""
        entries = self.entries
        if not len(entries):
            return np.zeros(0, np.int64)
        parts = entries["part"].astype(np.int64)
        if int(parts.max()) >= len(entries):  # every chunk holds a record: their numbers are below the count
            first = int(np.argmax(parts))
            raise PackFormatError(f"{self.path}: record {first}: chunk {int(parts[first])} is missing (a pack of "
                                  f"{len(entries)} records has fewer chunks); the pack is damaged")
        need = np.zeros(int(parts.max()) + 1, np.int64)
        np.maximum.at(need, parts, (entries["payload_offset"] + entries["payload_len"]).astype(np.int64))
        return need

    def locate(self, parts: np.ndarray) -> None:
        """Locate chunks ``parts`` (an int64 array) not located yet, each checked to hold what the
        index places in it."""
        table = self._table
        if len(parts) and (table[0, parts] >= 0).all():
            return
        unknown = distinct(parts[table[0, parts] < 0]).tolist()
        places = self._layout.locate_many([lmdb_chunk_key(part) for part in unknown])
        for part, place in zip(unknown, places, strict=True):
            if place is None:
                raise PackFormatError(f"{self.path}: chunk {part} is missing; the pack is damaged")
            if place[1] < self._need[part]:
                ends = (self.entries["payload_offset"] + self.entries["payload_len"]).astype(np.int64)
                first = int(np.flatnonzero((self.entries["part"] == part) & (ends > place[1]))[0])
                raise PackFormatError(f"{self.path}: record {first} points past the end of chunk {part} "
                                      f"({place[1]} bytes); the pack is damaged")
            if place[1] > self._need[part]:  # records lie back to back to the chunk's end: a tail is no record's
                raise PackFormatError(f"{self.path}: chunk {part} of {place[1]:,} bytes, but its records end at "
                                      f"{int(self._need[part]):,}; the pack is damaged")
            table[:, part] = place

    def _value(self, offset: int, size: int) -> memoryview:
        """The value at ``offset`` of the file (located and bounds-checked by the layout), fetched
        ahead in large requests when it spans pages."""
        if size > PAGE:
            if self._fetcher.threads:  # faulting it in there keeps only a request or two in flight
                self._fetcher.fetch([(self._fd, offset, size)])
            else:
                os.posix_fadvise(self._fd, offset, size, os.POSIX_FADV_WILLNEED)
        return memoryview(self._map)[offset : offset + size]

    # -- parts -----------------------------------------------------------------------------
    def part_view(self, part: int) -> memoryview:
        """Chunk ``part``, as a zero-copy view of the reader's map."""
        if self._table[0, part] < 0:
            self.locate(np.array([part], np.int64))
        offset, size = self._table[:, part].tolist()
        return memoryview(self._map)[offset : offset + size]

    def part_sizes_of(self, parts: np.ndarray) -> np.ndarray:
        """Bytes in each of chunks ``parts`` (an int64 array)."""
        self.locate(parts)
        return self._table[1, parts]

    def part_label(self, part: int) -> str:
        """How messages name part ``part``."""
        return f"chunk {part}"

    def payload_bytes(self, parts: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[bytes]:
        """``bytes`` of each range of each chunk (one copy each, straight from the one map)."""
        self.locate(parts)
        base = self._table[0, parts]
        return cut(lambda _: self._map, np.zeros_like(parts), starts + base, ends + base)

    def file_places(self, parts: list[int]) -> tuple[list[int], np.ndarray]:
        """For each of these chunks: the file's descriptor and where the chunk starts in it."""
        located = np.asarray(parts, dtype=np.int64)
        self.locate(located)
        return [self._fd] * len(parts), self._table[0, located]

    def index_bytes(self) -> bytes:
        """The index exactly as stored (for checksums)."""
        return self._index_view.tobytes() if self._index_view is not None else b""

    def fields_bytes(self) -> memoryview:
        """The ``#fields`` value (a pack made from a table), a view of the map, its size checked
        against the manifest's."""
        [place] = self._layout.locate_many([LMDB_FIELDS_KEY])
        if place is None:
            raise PackFormatError(f"{self.path}: no #fields, though the manifest lists the pack's fields; the pack "
                                  "is damaged")
        check_listed_size(place[1], self.manifest.fields.get("size"), f"{self.path}: #fields")
        return self._value(*place)

    def pack_bytes(self) -> int:
        """Bytes of the file LMDB's pages take (``used_bytes``): a tail past them is never read."""
        return int(self.used_bytes)

    def __del__(self) -> None:
        try:
            self.close()  # descriptors are plain integers: nothing else would close them
        except Exception:  # noqa: BLE001 - interpreter shutdown: they close with the process
            pass

    def close(self) -> None:
        """Release the maps and the descriptor (a map a caller still views is freed with the view)."""
        self.entries = np.zeros(0, INDEX_ENTRY)
        if self._index_view is not None:
            try:
                self._index_view.release()
            except BufferError:
                pass  # a caller still holds a view of the index; it is freed with that view
            self._index_view = None
        for mapped in (self._map, self._tree):
            if mapped is not None:
                try:
                    mapped.close()
                except BufferError:
                    pass  # a caller still holds a payload view; the map is freed with that view
        self._map = self._tree = None
        if getattr(self, "_layout", None) is not None:
            self._layout.close()
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)
            self._fd = -1
