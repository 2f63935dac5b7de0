"""Announcing upcoming records to the storage (``packload.loaders.hints``): the bytes asked for are
the records' own, through the dataset's reader when one is shared, the hints pickle as their path,
and a failure is kept, never raised into the sampler."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from packload.loaders.hints import PackHints
from packload.loaders.read import PackReader
from tests.reliability.packs import both_backends


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return both_backends(tmp_path_factory.mktemp("hints"), per_class=4)


@pytest.mark.parametrize("backend", ["lmdb", "shards"])
def test_hints_ask_for_the_records_bytes(packs: dict[str, Path], backend: str) -> None:
    upcoming = np.array([0, 1, 2, 7])
    with PackReader(packs[backend], parallel_reads=False) as reader:
        e = reader.entries
        spans = [(int(e["part"][i]), int(e["record_offset"][i]), int(e["payload_offset"][i] + e["payload_len"][i]))
                 for i in upcoming]
    hints = PackHints(packs[backend])
    try:
        asked = hints(upcoming)
    finally:
        hints.close()
    assert hints.error is None
    assert sum(end - start for _, start, end in spans) <= asked <= sum(end - start for _, start, end in spans) + 4096


def test_a_shared_reader_is_used_and_the_hints_pickle_as_their_path(packs: dict[str, Path]) -> None:
    reader = PackReader(packs["shards"], parallel_reads=False)
    opened: list[int] = []

    def opener() -> PackReader:
        opened.append(1)
        return reader

    try:
        hints = PackHints(packs["shards"], opener=opener)
        assert hints(np.array([3, 4])) > 0 and opened == [1]
        copy = pickle.loads(pickle.dumps(hints))
        assert copy.path == packs["shards"] and copy._opener is None and repr(copy) == f"PackHints({str(packs['shards'])!r})"
        assert copy(np.array([3, 4])) > 0 and opened == [1]  # the copy opened a reader of its own
        copy.close()
    finally:
        reader.close()


def test_a_failure_is_kept_not_raised(tmp_path: Path) -> None:
    hints = PackHints(tmp_path / "missing.shards")
    assert hints(np.array([0, 1])) == 0
    assert hints.error is not None and "no such pack" in str(hints.error)
