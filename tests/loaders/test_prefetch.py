"""Asking the storage for a pack's bytes before they are read (``packload.loaders.prefetch``): what
is fetched covers every byte a batch needs, is asked for once, announcements ask for exactly the
records' runs, reads go in 128 KiB pieces, and payloads are cut from the right parts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from packload import pack
from packload.loaders import prefetch
from packload.loaders.prefetch import (
    GRANULE_SHIFT,
    ParallelFetcher,
    Prefetcher,
    cut,
    distinct,
    distinct_first,
)
from packload.loaders.read import PackReader
from tests.image_factory import write_image


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("prefetch")
    for k in range(12):
        write_image(root / "src" / "ab"[k % 2] / f"img{k:02d}.png", size=(160, 120), seed=k)
    pack(root / "src", root / "p.shards", workers=1, progress=False, shard_size=128 << 10)
    return root / "p.shards"


class Recorder(ParallelFetcher):
    """A fetcher with threads that notes what it is asked to fetch, and reads nothing."""

    def __init__(self) -> None:
        super().__init__(threads=1)
        self.fetched: list[tuple[int, int, int]] = []

    def fetch(self, ranges: list[tuple[int, int, int]]) -> None:
        self.fetched += ranges


def _record_spans(reader: PackReader, positions: list[int]) -> list[tuple[int, int, int]]:
    """(fd, file start, file end) of each record's header and payload."""
    e = reader.entries
    parts = e["part"][positions].astype(np.int64)
    starts = e["record_offset"][positions].astype(np.int64)
    ends = (e["payload_offset"][positions] + e["payload_len"][positions]).astype(np.int64)
    ranges, _ = reader.file_ranges(parts, starts, ends)
    return [(fd, offset, offset + length) for fd, offset, length in ranges]


def test_a_batch_fetches_every_byte_it_needs_once(shards: Path) -> None:
    with PackReader(shards, parallel_reads=False) as reader:
        assert len(set(reader.entries["part"].tolist())) >= 3
        fetcher = Recorder()
        prefetcher = Prefetcher(reader.entries, fetcher)
        positions = [1, 2, 5, 9, 10]
        e = reader.entries
        args = (np.array(positions), e["part"][positions].astype(np.int64),
                (e["payload_offset"][positions] + e["payload_len"][positions]).astype(np.int64), reader.file_ranges)
        prefetcher.before_batch(*args)
        fetched = fetcher.fetched
        for fd, start, end in _record_spans(reader, positions):
            assert any(f == fd and o <= start and end <= o + n for f, o, n in fetched), (start, end)
        fetcher.fetched = []
        prefetcher.before_batch(*args)
        assert fetcher.fetched == [], "asked for already: not again"


def test_an_announcement_asks_for_exactly_the_records_runs(shards: Path) -> None:
    with PackReader(shards, parallel_reads=False) as reader:
        prefetcher = Prefetcher(reader.entries, ParallelFetcher(0))
        positions = np.arange(reader.records)
        spans = _record_spans(reader, positions.tolist())
        by_file: dict[int, tuple[int, int]] = {}
        for fd, start, end in spans:  # consecutive records of a shard make one run
            lo, hi = by_file.get(fd, (start, end))
            by_file[fd] = (min(lo, start), max(hi, end))
        assert prefetcher.advise(positions, reader.file_ranges) == sum(hi - lo for lo, hi in by_file.values())
        assert prefetcher.advise(np.zeros(0, np.int64), reader.file_ranges) == 0
        calls: list[object] = []
        prefetcher.before_batch(positions[:4], reader.entries["part"][:4].astype(np.int64),
                                np.zeros(4, np.int64), lambda *a: calls.append(a) or ([], np.zeros(0)))
        assert calls == [], "announced records need no fetch before their batch"


def test_fetches_go_in_128_kib_pieces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pieces: list[tuple[int, int, int]] = []
    monkeypatch.setattr(prefetch, "read_piece", pieces.append)
    fetcher = ParallelFetcher(threads=2)
    try:
        fetcher.fetch([(7, 10, 300_000), (8, 0, 5)])
    finally:
        fetcher.close()
    step = 1 << GRANULE_SHIFT
    assert sorted(pieces) == [(7, 10, step), (7, 10 + step, step), (7, 10 + 2 * step, 300_000 - 2 * step), (8, 0, 5)]


def test_cut_and_distinct() -> None:
    parts = {0: b"abcdefgh", 1: b"ABCDEFGH"}
    assert cut(parts.__getitem__, np.array([0, 0]), np.array([1, 4]), np.array([3, 8])) == [b"bc", b"efgh"]
    assert cut(parts.__getitem__, np.array([1, 0, 1]), np.array([0, 2, 6]), np.array([2, 3, 8])) == [
        b"AB", b"c", b"GH"]
    values = np.array([5, 3, 5, 1, 3, 9])
    assert distinct(values).tolist() == np.unique(values).tolist() and distinct(values[:0]).tolist() == []
    uniq, first = distinct_first(values)
    assert uniq.tolist() == [1, 3, 5, 9] and first.tolist() == [3, 1, 0, 5]
