"""Write records into one LMDB file, as chunks of consecutive records, index and manifest last.

Each LMDB value is a chunk of about ``chunk_size`` bytes of whole records. Large values sit in
contiguous overflow pages, so a chunk reads sequentially, and the pack stays within a fraction
of a percent of the payload size (one value per small image would waste most of a 4 KiB page
each). The file is written under a temporary name; the caller renames it into place after
``finish``. Until then it holds no manifest, so no reader accepts it as a pack.

The index and the fields part are single values of tens of megabytes per million records. LMDB copies a
value into pages of its own (malloc'd) when it is put, and py-lmdb cannot reserve a value's space to
be written in place (``MDB_RESERVE``), so putting one from memory holds two whole copies at once. A
value of ``RESERVE_BYTES`` or more therefore goes first to an unnamed file beside the pack, piece by
piece, and its memory is let go; it is then put as zeros of its size (a fresh zeroed buffer, which
takes no memory until written, so LMDB's copy is the only one), and once that is committed its bytes
are copied into the value's place in the file (``lmdb_pages.file_place`` locates it) a piece at a time. The
layout is the one any put gives; only the manifest, committed last, makes the pack complete.
"""

from __future__ import annotations

import json
import os
import queue
import tempfile
import threading
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import lmdb

from packload.core.errors import PackFormatError, WriteError
from packload.core.format import (
    LMDB_CHUNK_PREFIX,
    LMDB_FIELDS_KEY,
    LMDB_INDEX_KEY,
    LMDB_MANIFEST_KEY,
    PROGRESS_KEY,
    RECORD_HEADER,
    RecordMeta,
    decode_record_header,
    lmdb_chunk_key,
)
from packload.core.lmdb_pages import file_place
from packload.core.manifest import Manifest, encode_manifest, index_entry
from packload.packer.append_file import pwrite_all, start_writeback
from packload.packer.encode import Encoded
from packload.packer.index_builder import IndexBuilder
from packload.packer.write_shards import FieldsPart

CHUNK_SIZE = 1 << 20
# Chunks per write transaction, by size. LMDB allocates a transaction's new pages with malloc and
# frees them when it commits: a transaction of about one chunk reuses the memory the previous one
# freed, while larger ones make the kernel map and zero fresh pages each time (many more page faults,
# a large share of the CPU time of packing small files). Commits are cheap: the file is synced once, at the end.
COMMIT_BYTES = 1 << 20
# Values this large or larger (a pack's index and fields part, past some 15,000 records) are put as
# zeros and written in place (see the module's notes); smaller ones are put as they are.
RESERVE_BYTES = 1 << 20
COPY_PIECE = 1 << 20  # bytes copied at a time from the spilled value into its place


def open_env(path: Path, map_size: int) -> lmdb.Environment:
    """Open (or create) the single-file environment for writing."""
    return lmdb.open(str(path), subdir=False, map_size=map_size, sync=False, metasync=False,
                     readahead=False, meminit=False, max_dbs=0)


def remove_lock_file(path: Path) -> None:
    """LMDB leaves ``NAME-lock`` beside a file it wrote; a finished pack is one file."""
    Path(str(path) + "-lock").unlink(missing_ok=True)


class _CommitThread:
    """Runs every write transaction of the environment on one thread of its own (LMDB wants a write
    transaction used only by the thread that began it), so that LMDB's page copies and disk writes
    run beside the main thread. Sealed chunks queue up and are committed about every
    ``COMMIT_BYTES``; ``commit`` returns once everything handed over before it is committed."""

    def __init__(self, env: lmdb.Environment, path: Path) -> None:
        self.env = env
        self.path = path
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=8)
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0
        self._error: BaseException | None = None
        try:  # to start the disk writing each commit early (see start_writeback)
            self._fd: int | None = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            self._fd = None
        self._thread = threading.Thread(target=self._run, name=f"lmdb {path.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            kind, payload, done = self._queue.get()
            try:
                if self._error is None and kind == "chunk":
                    self._pending.append(payload)
                    self._pending_bytes += len(payload[1])
                    if self._pending_bytes >= COMMIT_BYTES:
                        self._commit({})
                elif self._error is None and kind == "commit":
                    self._commit(payload)
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread, raised there
                self._error = exc
            finally:
                if done is not None:
                    done.set()
            if kind == "stop":
                return

    def _commit(self, extra: dict[bytes, bytes | None]) -> None:
        """Write the queued chunks and ``extra`` keys (None deletes) in one transaction."""
        while True:
            try:
                with self.env.begin(write=True) as txn:
                    for key, value in self._pending:
                        txn.put(key, value)
                    for key, value in extra.items():
                        if value is None:
                            txn.delete(key)
                        else:
                            txn.put(key, value)
                break
            except lmdb.MapFullError:
                self.env.set_mapsize(self.env.info()["map_size"] * 2)
            except lmdb.Error as exc:
                raise WriteError(f"{self.path}: LMDB write failed ({exc}); free disk space (or raise the "
                                 "file-size limit), then rerun with --resume") from None
        self._pending.clear()
        self._pending_bytes = 0
        if self._fd is not None:
            start_writeback(self._fd)

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def add(self, key: bytes, value: bytes) -> None:
        self._raise_error()
        self._queue.put(("chunk", (key, value), None))

    def commit(self, extra: dict[bytes, bytes | None]) -> None:
        done = threading.Event()
        self._queue.put(("commit", extra, done))
        done.wait()
        self._raise_error()

    def stop(self) -> None:
        done = threading.Event()
        self._queue.put(("stop", None, done))
        done.wait()
        self._thread.join()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class LmdbWriter:
    """Appends records to chunks and chunks to an LMDB file, growing the map when it fills."""

    def __init__(self, path: Path, map_size: int, chunk_size: int = CHUNK_SIZE) -> None:
        self.path = path
        self.chunk_size = chunk_size
        self.env = open_env(path, map_size)
        self.index = IndexBuilder()
        self.chunks = 0  # the number of the chunk being filled
        self._pieces: list[bytes] = []  # the chunk being filled: headers and payloads, by reference
        self._chunk_len = 0
        self._committer: _CommitThread | None = None

    def _commits(self) -> _CommitThread:
        if self._committer is None:
            self._committer = _CommitThread(self.env, self.path)
        return self._committer

    def write(self, item: Encoded) -> None:
        """Append one record to the current chunk, sealing the chunk when it is full."""
        payload = item.payload
        payload_len = len(payload)
        size = RECORD_HEADER.itemsize + len(item.path.encode("utf-8")) + payload_len
        if self._chunk_len and self._chunk_len + size > self.chunk_size:
            self._seal_chunk()
        head = self.index.add_record(item.path, item.label, item.width, item.height, item.format, item.mode,
                                     item.orientation, payload_len, item.crc32, self.chunks, self._chunk_len)
        self._pieces += (head, payload)
        self._chunk_len += size

    def write_many(self, items: list[Encoded]) -> None:
        """``write`` each of ``items`` in order (the same records and chunks), with less work per record;
        the caller sends records with possibly over-long paths through ``write`` (``has_long_path``)."""
        first = 0
        while first < len(items):
            pieces, stop, self._chunk_len = self.index.add_many(items, first, self.chunks, self._chunk_len,
                                                                self.chunk_size, self._chunk_len == 0)
            self._pieces += pieces
            first = stop
            if first < len(items):  # the next record would take this chunk past chunk_size
                self._seal_chunk()

    def _chunk_bytes(self) -> bytes:
        return b"".join(self._pieces)

    def _seal_chunk(self) -> None:
        self._commits().add(lmdb_chunk_key(self.chunks), self._chunk_bytes())
        self.chunks += 1
        self._pieces = []
        self._chunk_len = 0

    def checkpoint(self, progress: dict[str, Any]) -> None:
        """Commit the records written so far and note ``progress`` for ``--resume``.

        The commit reaches the page cache (it survives the process being killed; ``finish`` syncs).
        The open chunk is stored as it is but stays open: it is stored again, fuller, when sealed,
        so the chunk layout does not depend on when checkpoints happened."""
        extra: dict[bytes, bytes | None] = {PROGRESS_KEY: json.dumps(progress).encode("utf-8")}
        if self._pieces:
            extra[lmdb_chunk_key(self.chunks)] = self._chunk_bytes()
        self._commits().commit(extra)

    def finish(self, manifest: Mapping[str, Any], fields: FieldsPart | None = None) -> Manifest:
        """Store the last chunk, the index (then, for a pack made from a table, the fields part
        ``fields`` writes, with its manifest entry) and then the manifest; return the manifest."""
        if self._pieces:
            self._seal_chunk()
        final: dict[bytes, Any] = {PROGRESS_KEY: None}
        manifest = Manifest(manifest)
        manifest.parts = {"chunks": self.chunks, "chunk_size": self.chunk_size}
        manifest.index = self._store(LMDB_INDEX_KEY, self._index_part, final)
        if fields is not None:  # made once the index's memory is let go
            manifest.fields = self._store(LMDB_FIELDS_KEY, fields, final)
        # One transaction: the pack is either unfinished (progress, no manifest) or complete.
        self._commits().commit({**final, LMDB_MANIFEST_KEY: encode_manifest(manifest)})
        self.env.sync(True)
        self.close()
        return manifest

    def _index_part(self, write: Callable[[Any], Any]) -> dict[str, Any]:
        """Hand ``write`` the index (after which this writer's index is spent); its manifest entry."""
        index = self.index.take_bytes()
        write(index)
        return index_entry(LMDB_INDEX_KEY.decode(), index)

    def _store(self, key: bytes, part: FieldsPart, final: dict[bytes, Any]) -> dict[str, Any]:
        """Store the value ``part`` writes, piece by piece, under ``key``; return what ``part`` returns.
        The pieces go to an unnamed file beside the pack. A value under ``RESERVE_BYTES`` is read back
        into ``final`` (put with the manifest); a larger one is put now as zeros, in a transaction of its
        own, and its bytes are then copied into its place (the module's notes)."""
        with tempfile.TemporaryFile(prefix=".packload-value-", dir=self.path.parent) as spill:
            entry = part(spill.write)
            size = spill.tell()
            spill.flush()
            if size < RESERVE_BYTES:
                final[key] = os.pread(spill.fileno(), size, 0) if size else b""
                return entry
            self._commits().commit({key: bytes(size)})  # zeros: no page of them is touched before LMDB's copy
            self._fill(key, spill.fileno(), size)
        return entry

    def _fill(self, key: bytes, source: int, size: int) -> None:
        """Copy ``size`` bytes of the file ``source`` over the committed value of ``key``, in place."""
        place = file_place(str(self.path), key)
        if place is None or place[1] != size:
            raise WriteError(f"{self.path}: {key.decode()} is not where LMDB was to put it ({place}); "
                             "pack again with --overwrite")
        fd = os.open(self.path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            for start in range(0, size, COPY_PIECE):
                piece = os.pread(source, min(COPY_PIECE, size - start), start)
                if not piece:
                    raise OSError(f"{self.path}: the spilled {key.decode()} ended early")
                pwrite_all(fd, piece, place[0] + start)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Stop the commit thread, close the environment and remove its lock file; what was
        committed stays for --resume."""
        if self._committer is not None:
            self._committer.stop()
            self._committer = None
        if self.env is not None:
            self.env.close()
            self.env = None
        remove_lock_file(self.path)

    @classmethod
    def resume(cls, path: Path, map_size: int) -> tuple[LmdbWriter, list[RecordMeta], dict[str, Any]] | None:
        """Reopen an unfinished LMDB pack: keep every intact chunk in order, drop the rest.
        None when no checkpoint was ever made (nothing to keep)."""
        writer = cls(path, max(map_size, os.path.getsize(path) * 2))
        with writer.env.begin() as txn:
            raw = txn.get(PROGRESS_KEY)
        if raw is None:
            writer.close()
            return None
        progress = json.loads(raw)
        kept: list[RecordMeta] = []
        stale: list[bytes] = []
        with writer.env.begin() as txn:
            cursor = txn.cursor()
            cursor.set_range(LMDB_CHUNK_PREFIX)
            for key, value in cursor:
                if not key.startswith(LMDB_CHUNK_PREFIX):
                    break
                if stale or key != lmdb_chunk_key(writer.chunks) or not _add_chunk(writer, value, kept):
                    stale.append(key)
                    continue
                writer.chunks += 1
        if stale:
            writer._commits().commit(dict.fromkeys(stale))
        if writer.chunks:  # reopen the last chunk and go on filling it
            writer.chunks -= 1
            with writer.env.begin() as txn:
                last = bytes(txn.get(lmdb_chunk_key(writer.chunks)))
            writer._pieces, writer._chunk_len = [last], len(last)
        return writer, kept, progress


def _add_chunk(writer: LmdbWriter, value: bytes, kept: list[RecordMeta]) -> bool:
    """Add a stored chunk's records to the writer's index if every one is intact."""
    records = []
    offset = 0
    try:
        while offset < len(value):
            meta, payload_start, payload_len, crc = decode_record_header(value, offset)
            if meta.record != len(kept) + len(records) or zlib.crc32(value[payload_start:payload_start + payload_len]) != crc:
                return False
            records.append((meta, offset, payload_len, crc))
            offset = payload_start + payload_len
    except PackFormatError:
        return False
    for meta, record_offset, payload_len, crc in records:
        writer.index.add(meta, writer.chunks, record_offset, payload_len, crc)
        kept.append(meta)
    return True
