"""The images a scan found, held as arrays (``packload.core.samples``): ``SampleList`` built from a
scan's runs, read as a sequence of ``Sample`` (indexing, slicing, iterating past its batches of
65,536), taken in another order with other labels, compared, shown and pickled; paths of more than
one byte a character included."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from packload.core.samples import Sample, SampleList

RUNS = [(["cat/a.jpg", "cat/ünï.png"], 0), ([], 7), (["dog/雪.jpg", "dog/b.jpg", "dog/c.webp"], 1)]
EXPECTED = [Sample("cat/a.jpg", 0), Sample("cat/ünï.png", 0), Sample("dog/雪.jpg", 1), Sample("dog/b.jpg", 1),
            Sample("dog/c.webp", 1)]


@pytest.fixture
def samples() -> SampleList:
    return SampleList.from_runs(RUNS)


def test_from_runs_holds_the_paths_utf8_bytes_back_to_back(samples: SampleList) -> None:
    blob = "".join(p for p, _ in EXPECTED).encode("utf-8")
    assert samples.blob == blob and samples.ends.dtype == np.int64 and samples.labels.dtype == np.int32
    assert samples.ends.tolist() == np.cumsum([len(p.encode("utf-8")) for p, _ in EXPECTED]).tolist()
    assert samples.labels.tolist() == [0, 0, 1, 1, 1]  # the empty run leaves no label behind
    assert [samples.path_bytes(i) for i in range(5)] == [p.encode("utf-8") for p, _ in EXPECTED]


def test_no_runs_or_only_empty_ones_are_no_samples() -> None:
    for runs in ([], [([], 3), ([], 4)]):
        empty = SampleList.from_runs(runs)
        assert len(empty) == 0 and empty.blob == b"" and list(empty) == [] and empty[:] == []


def test_indexing_and_slicing(samples: SampleList) -> None:
    assert [samples[i] for i in range(5)] == EXPECTED and samples[-1] == EXPECTED[-1] and samples[-5] == EXPECTED[0]
    assert isinstance(samples[2], Sample) and samples[2].path == "dog/雪.jpg" and type(samples[2].label) is int
    for where in (slice(1, 4), slice(0, 5, 2), slice(None, None, -1), slice(3, 1), slice(4, 99), slice(-2, None)):
        assert samples[where] == EXPECTED[where], where
    assert samples[np.int64(1)] == EXPECTED[1]


@pytest.mark.parametrize("index", [5, -6, 100])
def test_an_index_out_of_range_says_how_many(samples: SampleList, index: int) -> None:
    with pytest.raises(IndexError) as info:
        samples[index]
    assert str(info.value) == f"sample {index} out of range: 5 samples"


def test_iteration_across_its_batches_of_65536() -> None:
    paths = [f"c/{i:06d}.jpg" for i in range(70_000)]
    samples = SampleList.from_runs([(paths[:40_000], 0), (paths[40_000:], 1)])
    got = list(samples)
    assert len(got) == 70_000 and got[65_535:65_538] == [(paths[k], 1) for k in (65_535, 65_536, 65_537)]
    assert [p for p, _ in got] == paths and [label for _, label in got[39_999:40_001]] == [0, 1]


def test_take_gathers_in_the_order_given(samples: SampleList) -> None:
    taken = samples.take(np.array([4, 0, 0, 2]))
    assert list(taken) == [EXPECTED[4], EXPECTED[0], EXPECTED[0], EXPECTED[2]]
    assert taken.blob == "dog/c.webpcat/a.jpgcat/a.jpgdog/雪.jpg".encode()
    relabelled = samples.take(np.array([1, 3]), np.array([9, 8]))
    assert list(relabelled) == [("cat/ünï.png", 9), ("dog/b.jpg", 8)]
    assert len(samples.take(np.zeros(0, np.int64))) == 0 and samples.take(np.zeros(0, np.int64)).blob == b""


def test_of_keeps_each_samples_label() -> None:
    assert list(SampleList.of(EXPECTED)) == EXPECTED
    assert list(SampleList.of([("x.png", -1), ("y.png", 3)])) == [("x.png", -1), ("y.png", 3)]
    assert len(SampleList.of([])) == 0


def test_equality_with_lists_and_other_sample_lists(samples: SampleList) -> None:
    assert samples == EXPECTED and samples == [tuple(s) for s in EXPECTED] and samples == SampleList.of(EXPECTED)
    assert samples != EXPECTED[:4] and samples != [*EXPECTED[:4], Sample("dog/c.webp", 2)]
    assert samples != SampleList.from_runs([(["cat/a.jpg"], 0)])
    assert samples != "cat/a.jpg" and samples != b"cat/a.jpg"  # a string is no sequence of samples
    with pytest.raises(TypeError):
        hash(samples)  # mutable arrays inside: not hashable


def test_repr_shows_three_and_the_count(samples: SampleList) -> None:
    assert repr(samples) == ("SampleList([Sample(path='cat/a.jpg', label=0), Sample(path='cat/ünï.png', label=0), "
                             "Sample(path='dog/雪.jpg', label=1), ...], 5 samples)")
    assert repr(SampleList.of(EXPECTED[:1])) == "SampleList([Sample(path='cat/a.jpg', label=0)], 1 samples)"


def test_pickles_as_its_arrays(samples: SampleList) -> None:
    copy = pickle.loads(pickle.dumps(samples))
    assert copy == samples and copy.blob == samples.blob and list(copy) == EXPECTED


def test_paths_and_labels_must_pair() -> None:
    with pytest.raises(ValueError) as info:
        SampleList(b"ab", np.array([1, 2]), np.array([0]))
    assert str(info.value) == "2 paths but 1 labels"
