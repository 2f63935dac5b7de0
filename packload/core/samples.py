"""The images a scan found, held as arrays: one blob of UTF-8 paths, their end offsets and their labels.

A scan of a million files held as a list of ``Sample`` tuples costs about 130 bytes a file in Python
objects (the tuple, the path string, the list's pointer) for as long as the pack is written; held
here it costs the path's bytes and 12 more. ``SampleList`` is a read-only sequence of ``Sample``:
indexing gives one (its path decoded on the spot), slicing gives a list of them (what the packer's
workers are handed, a run at a time), and it compares equal to any sequence of the same samples.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple, overload

import numpy as np

from packload.core.fields import gather_segments


class Sample(NamedTuple):
    """One image to pack: its path relative to the source folder and its class index (-1: none).
    A named tuple: a scan makes one per file, so it must be cheap to create."""

    path: str
    label: int


class SampleList(Sequence[Sample]):
    """Samples as arrays: ``blob`` (the paths' UTF-8 bytes back to back), ``ends`` (int64: where
    each path ends in it) and ``labels`` (int32 class indices, -1: none)."""

    __slots__ = ("blob", "ends", "labels")

    def __init__(self, blob: bytes, ends: np.ndarray, labels: np.ndarray) -> None:
        if len(ends) != len(labels):
            raise ValueError(f"{len(ends)} paths but {len(labels)} labels")
        self.blob = blob
        self.ends = np.asarray(ends, dtype=np.int64)
        self.labels = np.asarray(labels, dtype=np.int32)

    @classmethod
    def from_runs(cls, runs: Iterable[tuple[Sequence[str], int]]) -> SampleList:
        """The samples of ``runs``: each a list of paths and the one label they all have (a class
        folder's listing). Paths are joined into one string and encoded once: no object per path."""
        blobs: list[bytes] = []
        ends: list[np.ndarray] = []
        labels: list[np.ndarray] = []
        at = 0
        for paths, label in runs:
            if not paths:
                continue
            blob = "".join(paths).encode("utf-8")
            if len(blob) == sum(map(len, paths)):  # ASCII: a character is a byte
                lengths = np.fromiter(map(len, paths), np.int64, len(paths))
            else:
                lengths = np.fromiter((len(p.encode("utf-8")) for p in paths), np.int64, len(paths))
            ends.append(np.cumsum(lengths) + at)
            at += len(blob)
            blobs.append(blob)
            labels.append(np.full(len(paths), label, np.int32))
        if not blobs:
            return cls(b"", np.zeros(0, np.int64), np.zeros(0, np.int32))
        return cls(b"".join(blobs) if len(blobs) > 1 else blobs[0], np.concatenate(ends), np.concatenate(labels))

    @classmethod
    def of(cls, samples: Iterable[Sample]) -> SampleList:
        """A ``SampleList`` of any samples (``(path, label)`` pairs)."""
        pairs = list(samples)
        paths = [p for p, _ in pairs]
        out = cls.from_runs([(paths, 0)])
        out.labels = np.fromiter((label for _, label in pairs), np.int32, len(pairs))
        return out

    def __len__(self) -> int:
        return len(self.ends)

    def path(self, i: int) -> str:
        """The path of sample ``i``."""
        return self.path_bytes(i).decode("utf-8")

    def path_bytes(self, i: int) -> bytes:
        """The UTF-8 bytes of sample ``i``'s path."""
        start = int(self.ends[i - 1]) if i > 0 else 0
        return self.blob[start : int(self.ends[i])]

    @overload
    def __getitem__(self, i: int) -> Sample: ...

    @overload
    def __getitem__(self, i: slice) -> list[Sample]: ...

    def __getitem__(self, i: int | slice) -> Sample | list[Sample]:
        if isinstance(i, slice):
            return list(self._iter(*i.indices(len(self))))
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range: {n} samples")
        i %= n
        return Sample(self.path(i), int(self.labels[i]))

    def _iter(self, start: int, stop: int, step: int = 1) -> Iterator[Sample]:
        ends, labels, blob = self.ends, self.labels, self.blob
        if step != 1:
            for i in range(start, stop, step):
                yield self[i]
            return
        if start >= stop:
            return
        bounds = ends[max(start - 1, 0) : stop].tolist()
        if start == 0:
            bounds.insert(0, 0)
        for k, label in enumerate(labels[start:stop].tolist()):
            yield Sample(blob[bounds[k] : bounds[k + 1]].decode("utf-8"), label)

    def __iter__(self) -> Iterator[Sample]:
        for first in range(0, len(self), 65536):  # a run at a time: no list of all the paths
            yield from self._iter(first, min(first + 65536, len(self)))

    def take(self, positions: np.ndarray, labels: np.ndarray | None = None) -> SampleList:
        """The samples at ``positions`` (in that order), with ``labels`` in place of theirs when given."""
        positions = np.asarray(positions, dtype=np.int64)
        starts = self.ends[np.maximum(positions - 1, 0)]
        starts[positions == 0] = 0
        lengths = self.ends[positions]
        lengths -= starts
        ends = np.cumsum(lengths)
        blob = bytearray(int(ends[-1]) if len(ends) else 0)
        gather_segments(np.frombuffer(self.blob, np.uint8), starts, lengths, np.frombuffer(blob, np.uint8), ends)
        del starts, lengths
        return SampleList(bytes(blob), ends, self.labels[positions] if labels is None else labels)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SampleList):
            return (self.blob == other.blob and np.array_equal(self.ends, other.ends)
                    and np.array_equal(self.labels, other.labels))
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(other) == len(self) and all(a == tuple(b) for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        shown = ", ".join(repr(s) for s in self[:3])
        return f"SampleList([{shown}{', ...' if len(self) > 3 else ''}], {len(self)} samples)"

    def __reduce__(self) -> tuple[Any, ...]:
        return (SampleList, (self.blob, self.ends, self.labels))
