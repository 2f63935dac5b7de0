"""Commands on packs at a URL report every phase a user waits for: the upload after packing, the
download before verify, unpack and merge; the time and rate `pack` reports are the whole command's;
and Ctrl-C never suggests a ``--resume`` that would be refused. Against moto's S3 server on
127.0.0.1, through the command line as users type it (stderr is not a terminal here: plain lines)."""

from __future__ import annotations

import json
import threading

import pytest

pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[dev]')")
pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")

from packload import pack  # noqa: E402
from packload.cli import EXIT_INTERRUPTED, main  # noqa: E402
from packload.core import remote  # noqa: E402
from packload.packer import encode_stream, pack_url  # noqa: E402
from tests.image_factory import make_image_folder  # noqa: E402
from tests.object_store import ObjectStore, point_cli_at  # noqa: E402

BUCKET = "bkt-progress"  # moto keeps one store per process: a bucket of this file's own


@pytest.fixture(scope="module")
def store():
    with ObjectStore() as s:
        s.make_bucket(BUCKET)
        yield s


@pytest.fixture
def env(store, monkeypatch, tmp_path):
    point_cli_at(store, monkeypatch, tmp_path / "cache")
    return store


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("progress")
    make_image_folder(root, classes=("ant", "bee"), per_class=12, seed=4)
    return root


def _lines(err: str, phase: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith(phase)]


class _UploadClock:
    """``time`` for pack_url: it stands still but for the uploads, each of which moves it on 0.4 s (a
    store that takes its time), so the command's reported time is known exactly."""

    def __init__(self) -> None:
        self.now, self.uploads = 0.0, 0
        self.lock = threading.Lock()  # shards are uploaded on the uploader's thread

    def perf_counter(self) -> float:
        return self.now

    def upload_took(self, seconds: float) -> None:
        with self.lock:
            self.now += seconds
            self.uploads += 1

    def restart(self) -> None:
        self.uploads = 0


@pytest.mark.parametrize("suffix", ["shards", "lmdb"])
def test_pack_to_a_url_shows_its_upload_and_reports_the_whole_time(env, source, capsys, monkeypatch, suffix):
    """The upload after the packing bar has its own lines, ending at 100 %; a store that takes its
    time (0.4 s per upload, on a virtual clock that nothing else moves) is in the reported seconds,
    all of it and nothing else, and the rate is over them."""
    clock = _UploadClock()
    monkeypatch.setattr(pack_url, "time", clock)
    real = remote.RemoteStore.upload

    def slow(self, local, name, sent=None):
        real(self, local, name, sent)
        clock.upload_took(0.4)

    monkeypatch.setattr(remote.RemoteStore, "upload", slow)
    url = f"s3://{BUCKET}/timed-{suffix}.{suffix}"
    assert main(["pack", str(source), url]) == 0
    out, err = capsys.readouterr()
    upload = _lines(err, f"upload timed-{suffix}.{suffix}")
    assert upload and upload[-1].startswith(f"upload timed-{suffix}.{suffix}: done") and "(100%)" in upload[-1], err
    assert err.index("pack ") < err.index("upload "), "the upload follows the packing bar"
    seconds = float(out.split(" in ")[1].split(" s:")[0])
    assert clock.uploads >= 1 and seconds == pytest.approx(0.4 * clock.uploads, abs=0.05), out  # shown to 0.1 s

    # the same figure from Python and --json: the whole call's
    clock.restart()
    summary = pack(source, url, overwrite=True, progress=False)
    assert summary["seconds"] == pytest.approx(0.4 * clock.uploads, abs=0.0005)  # rounded to the millisecond
    assert summary["files_per_s"] == pytest.approx(summary["files_this_run"] / summary["seconds"], rel=0.01)
    clock.restart()
    assert main(["pack", str(source), url, "--overwrite", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["seconds"] == pytest.approx(0.4 * clock.uploads, abs=0.0005) and err == ""


@pytest.mark.parametrize("suffix", ["shards", "lmdb"])
def test_verify_unpack_and_merge_show_their_download(env, source, tmp_path, capsys, suffix):
    url = f"s3://{BUCKET}/fetched.{suffix}"
    assert main(["pack", str(source), url, "--quiet", "--overwrite"]) == 0
    capsys.readouterr()
    for argv, then in ((["verify", url], "verify "), (["unpack", url, str(tmp_path / "out")], "unpack "),
                       (["merge", str(tmp_path / "m.shards"), url], "merge ")):
        assert main(argv) == 0, argv
        err = capsys.readouterr().err
        download = _lines(err, f"download fetched.{suffix}")
        assert download and download[-1].startswith(f"download fetched.{suffix}: done"), (argv, err)
        assert "(100%)" in download[-1]
        assert err.index("download ") < err.index(then), (argv, err)
    # quiet and --json: no progress at all
    for argv in (["verify", url, "--quiet"], ["verify", url, "--json"]):
        assert main(argv) == 0
        assert "download" not in capsys.readouterr().err


def test_merge_to_a_url_shows_its_upload(env, source, tmp_path, capsys):
    first, second = tmp_path / "a.shards", tmp_path / "b.lmdb"
    pack(source, first, progress=False)
    pack(source, second, progress=False)
    assert main(["merge", f"s3://{BUCKET}/merged.shards", str(first), str(second), "--overwrite"]) == 0
    err = capsys.readouterr().err
    assert _lines(err, "upload merged.shards")[-1].startswith("upload merged.shards: done"), err


@pytest.mark.parametrize("where", ["url", "local"])
def test_ctrl_c_suggests_only_what_is_accepted(env, source, tmp_path, capsys, monkeypatch, where):
    """Interrupted, a pack at a URL (this machine's engine) publishes nothing and keeps nothing to
    resume: the message says to run the command again, and the store holds nothing of it. A local
    pack keeps its unfinished pack, and the message names --resume, which then finishes it."""
    real = encode_stream.encode_chunk
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(encode_stream, "encode_chunk", interrupted)
    monkeypatch.setattr(encode_stream, "CHUNK_FILES", 4)
    dst = f"s3://{BUCKET}/stopped.shards" if where == "url" else str(tmp_path / "stopped.shards")
    assert main(["pack", str(source), dst, "--quiet", "--workers", "1"]) == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    monkeypatch.setattr(encode_stream, "encode_chunk", real)
    if where == "url":
        assert "interrupted" in err and "--resume" not in err and "again" in err, err
        assert not env.filesystem().ls(f"{BUCKET}/", refresh=True) or not any(
            "stopped.shards" in key for key in env.filesystem().ls(f"{BUCKET}/", refresh=True)), "nothing left at the URL"
        assert main(["pack", str(source), dst, "--quiet"]) == 0  # the same command, run again
    else:
        assert "--resume" in err, err
        assert main(["pack", str(source), dst, "--quiet", "--resume"]) == 0
