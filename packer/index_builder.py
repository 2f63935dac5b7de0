"""Collect index entries and paths as records are written, for either backend."""

from __future__ import annotations

import numpy as np

from .format import INDEX_ENTRY, RecordMeta, encode_index, index_entry


class IndexBuilder:
    """Grows the pack's index one record at a time; ``to_bytes`` gives the finished index."""

    def __init__(self) -> None:
        self._rows: list[tuple] = []
        self._paths = bytearray()
        self.payload_bytes = 0

    @property
    def count(self) -> int:
        """Records added so far; also the number of the next record."""
        return len(self._rows)

    def add(self, meta: RecordMeta, part: int, record_offset: int, payload_len: int, payload_crc: int) -> None:
        """Note that ``meta``'s record was written at ``record_offset`` of ``part``."""
        if meta.record != len(self._rows):
            raise ValueError(f"record {meta.record} added out of order (expected {len(self._rows)})")
        self._rows.append(index_entry(meta, part, record_offset, payload_len, payload_crc, len(self._paths)))
        self._paths += meta.path.encode("utf-8")
        self.payload_bytes += payload_len

    def labels(self) -> np.ndarray:
        """The class index of every record so far."""
        return np.array([row[1] for row in self._rows], dtype=np.int64)

    def to_bytes(self) -> bytes:
        """The index blob described in ``packer.format``."""
        entries = np.array(self._rows, dtype=INDEX_ENTRY) if self._rows else np.zeros(0, INDEX_ENTRY)
        return encode_index(entries, bytes(self._paths))
