"""Write records into a folder of shard files, with an index and a manifest published last.

The folder being written is a temporary one (``DEST.partial``); the caller renames it into place
after ``finish``. Until then it has no manifest, so no reader accepts it as a pack.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from packload.core.errors import PackFormatError
from packload.core.format import (
    FIELDS_NAME,
    FORMAT_VERSION,
    INDEX_NAME,
    MANIFEST_NAME,
    PROGRESS_NAME,
    RECORD_HEADER,
    SHARD_HEADER,
    RecordMeta,
    decode_record_header,
    decode_shard_header,
    encode_shard_header,
    shard_name,
    shard_number,
)
from packload.core.manifest import Manifest, encode_manifest, index_entry
from packload.packer.append_file import HashingAppender
from packload.packer.encode import Encoded
from packload.packer.index_builder import IndexBuilder

# A pack's fields part, made when its writer finishes: given where to write its pieces, in order, it
# writes them there and returns the part's entry in the manifest.
FieldsPart = Callable[[Callable[[Any], Any]], dict[str, Any]]


def write_file_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file, fsync and rename: never half a file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_part_atomic(path: Path, part: FieldsPart) -> dict[str, Any]:
    """``write_file_atomic`` for a part written piece by piece (``part``); returns what ``part`` does."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        entry = part(f.write)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return entry


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ShardsWriter:
    """Appends records to ``shard-NNNNN.bin`` files of about ``shard_size`` bytes each."""

    def __init__(self, folder: Path, shard_size: int, shard_sink: Callable[[Path], None] | None = None) -> None:
        """``shard_sink``: called with each shard's path once it is complete (and durable); it takes
        the file away (``packer.upload`` sends it to an object store and deletes it here)."""
        self.folder = folder
        self.shard_size = shard_size
        self.shard_sink = shard_sink
        self.index = IndexBuilder()
        self.parts: list[dict[str, Any]] = []  # finished shards: name, size, sha256, records
        self._file: HashingAppender | None = None
        self._offset = 0
        self._part_records = 0

    # -- writing ---------------------------------------------------------------------------
    def _open_part(self, part: int) -> None:
        self._file = HashingAppender(self.folder / shard_name(part))
        header = encode_shard_header(part)
        self._file.write(header)
        self._offset = len(header)
        self._part_records = 0

    def _close_part(self) -> None:
        digest = self._file.close()
        self._file = None
        part = len(self.parts)
        self.parts.append({"name": shard_name(part), "size": self._offset, "sha256": digest,
                           "records": self._part_records})
        if self.shard_sink is not None:
            path = self.folder / shard_name(part)
            with open(path, "rb") as f:
                os.fsync(f.fileno())
            self.shard_sink(path)

    def write(self, item: Encoded) -> None:
        """Append one record, starting a new shard when this one would pass ``shard_size``."""
        payload = item.payload
        payload_len = len(payload)
        size = RECORD_HEADER.itemsize + len(item.path.encode("utf-8")) + payload_len
        if self._file is None:
            self._open_part(len(self.parts))
        elif self._part_records and self._offset + size > self.shard_size:
            self._close_part()
            self._open_part(len(self.parts))
        head = self.index.add_record(item.path, item.label, item.width, item.height, item.format, item.mode,
                                     item.orientation, payload_len, item.crc32, len(self.parts), self._offset)
        self._file.write_pair(head, payload)
        self._offset += size
        self._part_records += 1

    def write_many(self, items: list[Encoded]) -> None:
        """``write`` each of ``items`` in order (the same records and shards), with less work per record;
        the caller sends records with possibly over-long paths through ``write`` (``has_long_path``)."""
        first = 0
        while first < len(items):
            if self._file is None:
                self._open_part(len(self.parts))
            pieces, stop, offset = self.index.add_many(items, first, len(self.parts), self._offset, self.shard_size,
                                                       self._part_records == 0)
            self._file.write_many(pieces, offset - self._offset)
            self._part_records += stop - first
            self._offset = offset
            first = stop
            if first < len(items):  # the next record would take this shard past shard_size
                self._close_part()

    def checkpoint(self, progress: dict[str, Any]) -> None:
        """Hand the records written so far to the operating system (they survive the process being
        killed) and note ``progress`` for ``--resume``; ``finish`` makes everything durable."""
        if self._file is not None:
            self._file.flush()
        write_file_atomic(self.folder / PROGRESS_NAME, json.dumps(progress).encode("utf-8"))

    def finish(self, manifest: Mapping[str, Any], fields: FieldsPart | None = None) -> Manifest:
        """Close the last shard, write the index (then, for a pack made from a table, the fields part
        ``fields`` writes, with its manifest entry: made once the index's memory is let go), then the
        manifest; return the manifest."""
        if self._file is not None:
            self._close_part()
        for part in self.parts if self.shard_sink is None else []:  # durable before the manifest
            with open(self.folder / part["name"], "rb") as f:
                os.fsync(f.fileno())
        index = self.index.take_bytes()
        write_file_atomic(self.folder / INDEX_NAME, index)
        manifest = Manifest(manifest)
        manifest.parts, manifest.index = self.parts, index_entry(INDEX_NAME, index)
        del index
        if fields is not None:
            manifest.fields = write_part_atomic(self.folder / FIELDS_NAME, fields)
        write_file_atomic(self.folder / MANIFEST_NAME, encode_manifest(manifest))
        (self.folder / PROGRESS_NAME).unlink(missing_ok=True)  # kept until now: a crash before can resume
        fsync_dir(self.folder)
        return manifest

    def close(self) -> None:
        """Release the open shard (after an error); what was written stays for ``--resume``."""
        if self._file is not None:
            self._file.abandon()  # the disk may be full: the error that got us here is the one to report
            self._file = None

    # -- resuming --------------------------------------------------------------------------
    @classmethod
    def resume(cls, folder: Path, shard_size: int) -> tuple[ShardsWriter, list[RecordMeta], dict[str, Any]] | None:
        """Reopen an unfinished shards folder: keep every intact record, cut off the rest.

        Returns the writer positioned after the last intact record, the kept records' metadata
        in order, and the progress noted at the last checkpoint; None when no checkpoint was ever
        made (nothing to keep).
        """
        if not (folder / PROGRESS_NAME).exists():
            return None
        try:
            progress = json.loads((folder / PROGRESS_NAME).read_text("utf-8"))
        except (OSError, ValueError):
            raise PackFormatError(f"{folder}: unreadable {PROGRESS_NAME}; this unfinished pack cannot be "
                                  "resumed: start over with --overwrite") from None
        writer = cls(folder, shard_size)
        kept: list[RecordMeta] = []
        last_digest = hashlib.sha256()
        part = 0
        while (folder / shard_name(part)).exists():
            path = folder / shard_name(part)
            end, records, digest = _intact_prefix(path, part, len(kept))
            if end == 0:
                break
            for meta, offset, length, crc in records:
                writer.index.add(meta, part, offset, length, crc)
                kept.append(meta)
            whole = end == path.stat().st_size
            if not whole:
                os.truncate(path, end)
            writer.parts.append({"name": path.name, "size": end, "sha256": digest.hexdigest(),
                                 "records": len(records)})
            last_digest = digest
            part += 1
            if not whole:
                break
        for stale in folder.iterdir():
            number = shard_number(stale.name)
            if number is not None and number >= part:
                stale.unlink()
        if writer.parts:  # go on appending to the last shard
            last = writer.parts.pop()
            writer._file = HashingAppender(folder / last["name"], "ab", last_digest)
            writer._offset = last["size"]
            writer._part_records = last["records"]
        return writer, kept, progress


def _intact_prefix(path: Path, part: int, first_record: int) -> tuple[int, list[tuple], Any]:
    """Scan shard ``path`` for intact records (header and payload checksums right, numbered on
    from ``first_record``). Returns the byte length of the intact prefix (0 if the shard header
    itself is bad), (meta, offset, payload_len, crc) for each record, and a sha256 of the prefix."""
    records: list[tuple] = []
    size = path.stat().st_size
    digest = hashlib.sha256()
    if size < SHARD_HEADER.itemsize:
        return 0, records, digest
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if decode_shard_header(data[: SHARD_HEADER.itemsize]) != (FORMAT_VERSION, part):
            return 0, records, digest
        offset = SHARD_HEADER.itemsize
        while offset < size:
            try:
                meta, payload_start, payload_len, crc = decode_record_header(data, offset)
            except PackFormatError:
                break
            if meta.record != first_record + len(records):
                break
            if zlib.crc32(data[payload_start : payload_start + payload_len]) != crc:
                break
            records.append((meta, offset, payload_len, crc))
            offset = payload_start + payload_len
        digest.update(data[:offset])
    return offset, records, digest
