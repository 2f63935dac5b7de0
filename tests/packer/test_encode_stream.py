"""The encoding stream (``packer.encode_stream``): every file comes back once, in scan order, whether
it was encoded on this thread, on worker threads or in worker processes; broken files come back as
``Skipped`` in their place; reading that the page cache serves stays on this thread until runs turn
slow; and only a bounded number of runs is ever in flight."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from packload.core.scan import scan_folder
from packload.packer import encode_stream
from packload.packer.encode import Encoded, EncodeOptions, Skipped
from packload.packer.encode_stream import encoded_chunks, encoded_stream, io_bound
from tests.image_factory import make_image_folder, write_broken_files


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stream") / "src"
    make_image_folder(root, classes=("a", "b", "c"), per_class=9, seed=3)
    write_broken_files(root / "b")
    return root


@pytest.mark.parametrize(("options", "workers"), [
    (EncodeOptions(), 1),  # reading and checking, this thread only
    (EncodeOptions(), 2),  # reading and checking: this thread, then threads once runs are slow
    (EncodeOptions(encoding="raw", size=(8, 8)), 2),  # re-encoding: a pool of workers
])
def test_every_file_comes_back_once_in_scan_order(source, options, workers, monkeypatch):
    monkeypatch.setattr(encode_stream, "CHUNK_FILES", 4)
    monkeypatch.setattr(encode_stream, "INLINE_SECONDS_PER_FILE", 0.0)  # every run counts as slow
    samples = scan_folder(source).samples
    for start in (0, 5):
        stream = list(encoded_stream(source, samples, start, options, workers))
        assert [item.path for item in stream] == [s.path for s in samples[start:]]
        broken = {item.path for item in stream if isinstance(item, Skipped)}
        assert broken and all(path.startswith("b/") and "/img_" not in path for path in broken)
        encoded = [item for item in stream if isinstance(item, Encoded)]
        assert len(encoded) + len(broken) == len(samples) - start
        if options.encoding == "raw":
            assert all(len(item.payload) == 8 * 8 * 3 for item in encoded)
        else:
            assert all(item.payload == (source / item.path).read_bytes() for item in encoded)


def test_fast_runs_stay_on_this_thread_and_slow_runs_move_to_threads(source, monkeypatch):
    monkeypatch.setattr(encode_stream, "CHUNK_FILES", 2)
    where: list[bool] = []
    real = encode_stream.encode_chunk

    def noting(root, chunk, options):
        where.append(threading.current_thread() is threading.main_thread())
        return real(root, chunk, options)

    monkeypatch.setattr(encode_stream, "encode_chunk", noting)
    samples = scan_folder(source).samples
    monkeypatch.setattr(encode_stream, "INLINE_SECONDS_PER_FILE", float("inf"))  # never slow
    assert len(list(encoded_chunks(source, samples, 0, EncodeOptions(), 2))) == len(where) > encode_stream.SLOW_RUNS
    assert all(where)
    where.clear()
    monkeypatch.setattr(encode_stream, "INLINE_SECONDS_PER_FILE", 0.0)  # always slow
    list(encoded_chunks(source, samples, 0, EncodeOptions(), 2))
    assert where[: encode_stream.SLOW_RUNS] == [True] * encode_stream.SLOW_RUNS
    assert not any(where[encode_stream.SLOW_RUNS :])


def test_only_a_bounded_number_of_runs_is_in_flight(source, monkeypatch):
    """The stream submits at most four runs per worker ahead of what has been taken from it, so a
    slow writer never has the whole pack's payloads waiting in memory."""
    monkeypatch.setattr(encode_stream, "CHUNK_FILES", 1)
    monkeypatch.setattr(encode_stream, "use_threads", lambda options, samples=(): True)
    calls = 0
    lock = threading.Lock()
    real = encode_stream.encode_chunk

    def counting(root, chunk, options):
        nonlocal calls
        with lock:
            calls += 1
        return real(root, chunk, options)

    monkeypatch.setattr(encode_stream, "encode_chunk", counting)
    samples = scan_folder(source).samples
    workers = 2
    assert len(samples) > 4 * workers + 4
    stream = encoded_chunks(source, samples, 0, EncodeOptions(encoding="raw", size=(4, 4)), workers)
    first = next(stream)
    assert len(first) == 1
    assert calls <= 4 * workers + 1  # never the whole folder submitted at once
    rest = list(stream)
    assert 1 + len(rest) == len(samples) == calls


def test_reading_and_checking_is_the_io_bound_kind_of_work():
    assert io_bound(EncodeOptions())
    assert not io_bound(EncodeOptions(check="full"))
    assert not io_bound(EncodeOptions(encoding="jpeg"))
