"""Collect index entries and paths as records are written, for either backend.

Each entry is packed to its 64 bytes as it is added (one ``struct`` call), so a pack of a million
files holds its index in 64 MB plus the paths, and finishing it is one copy. ``add_record`` also
builds the record's header, in one pass over the record's fields: the writers' per-record cost is
most of what packing small files costs.
"""

from __future__ import annotations

import zlib

import numpy as np

from packload.core.errors import PackFormatError
from packload.core.format import (
    FORMAT_CODE,
    INDEX_ENTRY,
    INDEX_ENTRY_STRUCT,
    RECORD_HEADER,
    RECORD_HEADER_BODY,
    RECORD_MAGIC,
    U32,
    RecordMeta,
    encode_index,
    encode_index_header,
    index_entry,
)
from packload.packer.encode import Encoded

_HEADER_SIZE = RECORD_HEADER.itemsize
_OTHER = FORMAT_CODE["other"]


class IndexBuilder:
    """Grows the pack's index one record at a time; ``to_bytes`` gives the finished index."""

    def __init__(self) -> None:
        self._entries = bytearray()  # INDEX_ENTRY rows, packed
        self._paths = bytearray()
        self.count = 0  # records added so far; also the number of the next record
        self.payload_bytes = 0

    def add(self, meta: RecordMeta, part: int, record_offset: int, payload_len: int, payload_crc: int) -> None:
        """Note that ``meta``'s record was written at ``record_offset`` of ``part``."""
        if meta.record != self.count:
            raise ValueError(f"record {meta.record} added out of order (expected {self.count})")
        self._entries += INDEX_ENTRY_STRUCT.pack(*index_entry(meta, part, record_offset, payload_len, payload_crc,
                                                  len(self._paths)))
        self._paths += meta.path.encode("utf-8")
        self.count += 1
        self.payload_bytes += payload_len

    def add_record(self, path: str, label: int, width: int, height: int, fmt: str, mode: str, orientation: int,
                   payload_len: int, payload_crc: int, part: int, record_offset: int) -> bytes:
        """Number the next record, note it at ``record_offset`` of ``part`` and return its header and
        path bytes (what ``format.encode_record`` returns for it; the payload follows them)."""
        path_bytes = path.encode("utf-8")
        path_len = len(path_bytes)
        if path_len > 0xFFFF:
            raise PackFormatError(f"{path[:80]}...: path longer than 65535 bytes; shorten it")
        code = FORMAT_CODE.get(fmt, _OTHER)
        mode_bytes = mode.encode("ascii")
        body = RECORD_HEADER_BODY.pack(self.count, payload_len, payload_crc, label, width, height, path_len, code,
                                 orientation, mode_bytes, 0)
        self._entries += INDEX_ENTRY_STRUCT.pack(part, label, record_offset + _HEADER_SIZE + path_len, payload_len,
                                     record_offset, payload_crc, width, height, len(self._paths), path_len, code,
                                     orientation, mode_bytes)
        self._paths += path_bytes
        self.count += 1
        self.payload_bytes += payload_len
        return b"".join((RECORD_MAGIC, U32.pack(zlib.crc32(path_bytes, zlib.crc32(body))), body, path_bytes))

    def add_many(self, items: list[Encoded], first: int, part: int, offset: int, limit: int,
                 empty: bool) -> tuple[list[bytes], int, int]:
        """``add_record`` for ``items[first:]``, written one after the other from ``record_offset``
        ``offset`` of ``part``, stopping before a record that would take the part past ``limit``
        bytes (unless the part is ``empty``: holds no record yet). Returns the pieces to write (each
        record's header and path, then its payload), the position in ``items`` where it stopped, and
        the offset after the last record added: the writers' whole per-record work, in one loop.
        The caller checks path lengths first (``has_long_path``)."""
        pieces: list[bytes] = []
        entries, paths = self._entries, self._paths
        count, payload_bytes, paths_len = self.count, self.payload_bytes, len(paths)
        pack_body, pack_entry, pack_u32, crc32 = RECORD_HEADER_BODY.pack, INDEX_ENTRY_STRUCT.pack, U32.pack, zlib.crc32
        codes, magic, head_size = FORMAT_CODE, RECORD_MAGIC, _HEADER_SIZE
        modes: dict[str, bytes] = {}
        position = first
        try:
            for position in range(first, len(items)):
                item = items[position]
                payload = item.payload
                path_bytes = item.path.encode("utf-8")
                path_len, payload_len = len(path_bytes), len(payload)
                end = offset + head_size + path_len + payload_len
                if end > limit and (pieces or not empty):
                    break
                if path_len > 0xFFFF:
                    raise PackFormatError(f"{item.path[:80]}...: path longer than 65535 bytes; shorten it")
                mode = item.mode
                mode_bytes = modes.get(mode)
                if mode_bytes is None:
                    mode_bytes = modes[mode] = mode.encode("ascii")
                code = codes.get(item.format, _OTHER)
                crc, label, width, height, orientation = item.crc32, item.label, item.width, item.height, item.orientation
                body = pack_body(count, payload_len, crc, label, width, height, path_len, code, orientation,
                                 mode_bytes, 0)
                entries += pack_entry(part, label, offset + head_size + path_len, payload_len, offset, crc, width,
                                      height, paths_len, path_len, code, orientation, mode_bytes)
                paths += path_bytes
                pieces += (magic + pack_u32(crc32(path_bytes, crc32(body))) + body + path_bytes, payload)
                paths_len += path_len
                count += 1
                payload_bytes += payload_len
                offset = end
            else:
                position = len(items)
        finally:
            self.count, self.payload_bytes = count, payload_bytes
        return pieces, position, offset

    @staticmethod
    def has_long_path(items: list[Encoded]) -> bool:
        """True if a path of ``items`` may be too long for the format (over 65535 bytes as UTF-8):
        such a run goes through ``add_record`` one record at a time, which refuses the first one."""
        return any(len(item.path) > 0x3FFF for item in items)  # at most 4 bytes a character

    def labels(self) -> np.ndarray:
        """The class index of every record so far."""
        return np.frombuffer(self._entries, INDEX_ENTRY)["label"].astype(np.int64)

    def to_bytes(self) -> bytes:
        """The index blob described in ``packload.core.format``."""
        return encode_index(np.frombuffer(bytes(self._entries), INDEX_ENTRY), bytes(self._paths))

    def take_bytes(self) -> bytearray:
        """``to_bytes``, built in the entries' own buffer rather than in copies of it (a million
        records' index is 75 MB): what a writer's ``finish`` calls once, after which this builder
        is spent."""
        paths_len = len(self._paths)
        out, self._entries = self._entries, bytearray()
        out += self._paths
        self._paths = bytearray()
        out[0:0] = encode_index_header(self.count, paths_len)
        return out
