"""The progress of transfers (``packload.core.transfer_progress``): a bar of the megabytes moved, told
by many threads at once, and the fsspec callback of an upload, whose count a retried attempt takes
back: exact arithmetic on the callback, and real uploads through ``RemoteStore.upload`` to fsspec's
memory filesystem (an attempt cut off halfway, then retried) and local one (which reports nothing)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from packload.core import remote
from packload.core.transfer_progress import TransferBar, sent_callback

fsspec = pytest.importorskip("fsspec", reason="fsspec is not installed (pip install -e '.[s3]')")


# -- the bar ---------------------------------------------------------------------------------------
def test_the_bar_counts_megabytes_from_many_threads(capsys: pytest.CaptureFixture[str]) -> None:
    with TransferBar("upload p.shards", 8_000_000, progress=False) as bar:
        assert bar.bar.total == 8.0 and bar.bar.unit == "MB"

        def send() -> None:
            for _ in range(1000):
                bar(1000)

        threads = [threading.Thread(target=send) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert bar.bar.n == pytest.approx(8.0)
    assert capsys.readouterr().err == ""  # progress off: nothing said


def test_the_bar_says_its_end_once_in_a_log(capsys: pytest.CaptureFixture[str]) -> None:
    with TransferBar("download p.lmdb", 2_500_000, progress=True) as bar:
        bar(2_500_000)
    bar.__exit__(None, None, None)  # closed again: no second line
    lines = capsys.readouterr().err.splitlines()  # stderr is no terminal here: plain lines
    assert len(lines) == 1 and lines[0].startswith("download p.lmdb: done 2.5/2.5 MB (100%)")


# -- the callback's arithmetic -----------------------------------------------------------------------
def test_no_callback_without_a_listener() -> None:
    assert sent_callback(None) is None


def test_each_increment_is_told_once() -> None:
    sent: list[int] = []
    callback = sent_callback(sent.append)
    callback.set_size(100)
    callback.relative_update(30)
    callback.relative_update(20)
    callback.absolute_update(50)  # no progress: nothing told
    callback.relative_update(50)
    callback.finish(100)  # all told already
    assert sent == [30, 20, 50] and sum(sent) == 100


def test_a_retried_attempt_takes_back_what_the_failed_one_told() -> None:
    sent: list[int] = []
    callback = sent_callback(sent.append)
    callback.set_size(100)
    callback.relative_update(40)  # the first attempt fails here
    callback.set_size(100)  # the retry sizes its transfer again
    callback.relative_update(100)
    assert sent == [40, -40, 100] and sum(sent) == 100
    callback.set_size(100)  # a third attempt: the second's 100 taken back
    assert sent[-1] == -100 and sum(sent) == 0


def test_finish_tops_up_to_the_size_and_never_takes_back() -> None:
    sent: list[int] = []
    callback = sent_callback(sent.append)
    callback.finish(70)  # a filesystem that reported nothing
    assert sent == [70]
    callback.finish(50)  # smaller than told: nothing
    callback.finish(90)
    assert sent == [70, 20]


# -- real uploads -------------------------------------------------------------------------------------
class BreaksOnce:
    """A file written to the store whose ``break_at``-th write fails with a reset connection."""

    def __init__(self, target: Any, break_at: int | None) -> None:
        self.target, self.break_at, self.writes = target, break_at, 0

    def write(self, data: bytes) -> int:
        self.writes += 1
        if self.writes == self.break_at:
            raise ConnectionResetError("connection reset by peer")
        return self.target.write(data)

    def __enter__(self) -> BreaksOnce:
        return self

    def __exit__(self, *exc: object) -> None:
        self.target.__exit__(*exc)


def test_an_upload_retried_after_a_reset_counts_its_bytes_once(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """fsspec's generic ``put_file`` (the memory filesystem's) reports each block written; the first
    attempt breaks on its third block, the retry sends all five: what the first told is taken back."""
    monkeypatch.setattr(remote, "RETRY_PAUSE", 0.001)
    local = tmp_path / "shard-00000.bin"
    data = bytes(range(250)) * 18  # 4,500 bytes: four blocks of 1,000 and one of 500
    local.write_bytes(data)
    store = remote.RemoteStore(f"memory://{tmp_path.name}/p.shards", {"skip_instance_cache": True})
    fs = store.fs
    monkeypatch.setattr(fs, "blocksize", 1000)
    opened: list[BreaksOnce] = []
    real_open = type(fs).open

    def open_breaking_the_first(path: str, mode: str = "rb", **kwargs: Any) -> BreaksOnce:
        opened.append(BreaksOnce(real_open(fs, path, mode, **kwargs), 3 if not opened else None))
        return opened[-1]

    monkeypatch.setattr(fs, "open", open_breaking_the_first)
    sent: list[int] = []
    with TransferBar("upload", len(data), progress=False) as bar:
        store.upload(local, "shard-00000.bin", lambda n: (sent.append(n), bar(n)))
    assert len(opened) == 2 and sent == [1000, 1000, -2000, 1000, 1000, 1000, 1000, 500]
    assert bar.bar.n == pytest.approx(len(data) / 1e6)
    assert store.read_object("shard-00000.bin") == data


def test_an_upload_to_a_filesystem_that_reports_nothing_is_counted_whole(tmp_path: Any) -> None:
    local = tmp_path / "index.npy"
    local.write_bytes(b"\x93NUMPY" + bytes(3000))
    (tmp_path / "out").mkdir()
    sent: list[int] = []
    remote.RemoteStore(f"file://{tmp_path}/out").upload(local, "index.npy", sent.append)
    assert sent == [3006] and (tmp_path / "out" / "index.npy").read_bytes() == local.read_bytes()
