"""The interface every pack backend gives ``PackReader`` (``loaders.read``): ``ShardsPack`` (a
shards folder, memory-mapped), ``LmdbPack`` (an LMDB file, its chunks found in its B-tree) and
``RemoteShardsPack`` (a shards pack at a URL, read block by block through the cache folder).

A backend opens the pack, checks it, and exposes its manifest and index; ``PackReader`` does all
the rest (positions, checksums, batching, read-ahead) the same way whichever backend it holds. A
record's bytes are ``payload_offset : payload_offset + payload_len`` of part ``entries["part"]``: a
shard of a shards pack, a chunk of an LMDB pack.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from packload.core.manifest import Manifest


@runtime_checkable
class PackBackend(Protocol):
    """One open pack, local or at a URL."""

    backend: str  # "shards" or "lmdb"
    manifest: Manifest
    entries: np.ndarray  # the index: one INDEX_ENTRY per record (core.format)
    paths: bytes  # every record's original relative path, one blob (the index points into it)
    part_names: list[str]  # the shards' file names (none for LMDB, whose parts are chunks)

    def part_view(self, part: int) -> memoryview:
        """The whole of shard or chunk ``part``, as a view."""
        ...

    def part_sizes_of(self, parts: np.ndarray) -> np.ndarray:
        """The byte sizes of ``parts``."""
        ...

    def part_label(self, part: int) -> str:
        """How messages name ``part`` (a shard's file, an LMDB chunk)."""
        ...

    def payload_bytes(self, parts: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[bytes]:
        """Bytes ``starts[k]:ends[k]`` of ``parts[k]``, copied, for each k."""
        ...

    def index_bytes(self) -> bytes:
        """The index exactly as stored (for its checksum)."""
        ...

    def fields_bytes(self) -> memoryview | bytes:
        """The fields part of a pack made from a table; ``PackFormatError`` when it is missing."""
        ...

    def close(self) -> None:
        """Let go of the maps, descriptors and threads."""
        ...


@runtime_checkable
class LocalPackBackend(PackBackend, Protocol):
    """A pack in local files (``ShardsPack``, ``LmdbPack``): read-ahead asks the kernel for file ranges."""

    def file_places(self, parts: list[int]) -> tuple[list[int], np.ndarray]:
        """For each of ``parts``, the descriptor of its file and the part's offset in that file."""
        ...

    def pack_bytes(self) -> int:
        """Bytes the pack takes, from the sizes checked when it was opened."""
        ...
