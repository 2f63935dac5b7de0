"""``pack``, ``verify``, ``info``, ``merge`` and ``unpack`` with packs at URLs, on an S3-compatible
server (moto, on 127.0.0.1)."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[dev]')")
pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")

from packload.cli import main  # noqa: E402
from packload.core.errors import IncompletePackError, WriteError  # noqa: E402
from packload.loaders.read import PackReader  # noqa: E402
from packload.packer import pipeline, upload  # noqa: E402
from packload.packer.pack_destination import PackDestination  # noqa: E402
from packload.packer.pack_url import pack_to_url as pack_to_url_with  # noqa: E402
from tests.image_factory import make_image_folder  # noqa: E402
from tests.object_store import ObjectStore, point_cli_at  # noqa: E402

SHARD = 1 << 16


def pack_to_url(src, url, **kw):
    """``pack()`` to a URL, with the staging folder of the test's choosing."""
    return pack_to_url_with(src, url, local_pack=pipeline.pack, backend="shards", **kw)


@pytest.fixture(scope="module")
def store():
    with ObjectStore() as s:
        s.make_bucket("upl")
        yield s


@pytest.fixture
def env(store, monkeypatch, tmp_path):
    """The command line finds the server as users point it at theirs: AWS_ENDPOINT_URL."""
    point_cli_at(store, monkeypatch, tmp_path / "cache")
    return store


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    src = tmp_path_factory.mktemp("up") / "src"
    make_image_folder(src, classes=("ant", "bee", "cow"), per_class=12)
    return src


def _run(capsys, argv, expect=0):
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == expect, (out, err)
    return out, err


def _records(path, **kw):
    with PackReader(path, **kw) as reader:
        return reader.labels().tolist(), [bytes(v) for v in reader.payloads(list(range(reader.records)))], \
            [reader.path_of(i) for i in range(reader.records)]


@pytest.mark.parametrize("name", ["a.shards", "a.lmdb"])
def test_pack_to_s3_reads_back_equal_to_the_local_pack(env, images, tmp_path, capsys, name):
    local = tmp_path / name
    _run(capsys, ["pack", str(images), str(local), "--shard-size", "64K", "--quiet"])
    url = f"s3://upl/{tmp_path.name}/{name}"
    out, _ = _run(capsys, ["pack", str(images), url, "--shard-size", "64K", "--json"])
    summary = json.loads(out)
    assert summary["destination"] == url and summary["records"] == 36 and summary["pack_bytes"] > 0
    assert _records(url) == _records(local)
    info = json.loads(_run(capsys, ["info", url, "--json"])[0])
    assert info["records"] == 36 and info["classes"] == ["ant", "bee", "cow"]
    assert info["pack_bytes"] == summary["pack_bytes"] - (len(env.filesystem().cat(f"upl/{tmp_path.name}/{name}/manifest.json"))
                                                          if name.endswith(".shards") else 0)
    report = json.loads(_run(capsys, ["verify", url, "--json"])[0])
    assert report["ok"] and report["path"] == url
    _run(capsys, ["unpack", url, str(tmp_path / "out"), "--quiet"])
    for rel in _records(local)[2]:
        assert (tmp_path / "out" / rel).read_bytes() == (images / rel).read_bytes()


def test_shards_leave_staging_as_they_are_uploaded(env, images, tmp_path, monkeypatch):
    staged_counts = []
    send = upload.ShardUploader._send

    def counting(self, path):
        staged_counts.append(sum(1 for p in path.parent.iterdir() if p.name.startswith("shard-")))
        send(self, path)

    monkeypatch.setattr(upload.ShardUploader, "_send", counting)
    staging = tmp_path / "staging"
    staging.mkdir()
    url = f"s3://upl/{tmp_path.name}/s.shards"
    pack_to_url(images, url, shard_size=SHARD, progress=False, staging_dir=staging)
    listing = env.filesystem().ls(f"upl/{tmp_path.name}/s.shards")
    shards = [p for p in listing if "/shard-" in p]
    assert len(shards) == len(staged_counts) >= 2
    assert max(staged_counts) <= upload.IN_FLIGHT + 1  # never the whole pack waiting locally
    assert list(staging.iterdir()) == []  # the staging folder is gone once the pack is up


def test_failed_pack_to_s3_leaves_nothing_and_the_same_command_starts_again(env, images, tmp_path, monkeypatch,
                                                                            capsys):
    """A pack stopped just before the end removes the shards it uploaded (a pack at a URL cannot be
    resumed by the local engine); one killed outright leaves shards without a manifest, which
    readers refuse and the same command, run again, replaces."""
    def stop(*args):
        raise KeyboardInterrupt  # stopped just before the end
    monkeypatch.setattr(PackDestination, "publish", stop)
    url = f"s3://upl/{tmp_path.name}/k.shards"
    with pytest.raises(KeyboardInterrupt):
        pack_to_url(images, url, shard_size=SHARD, progress=False)
    assert not env.filesystem().exists(f"upl/{tmp_path.name}/k.shards")
    monkeypatch.undo()
    monkeypatch.setenv("AWS_ENDPOINT_URL", env.proxy.endpoint)
    fs = env.filesystem()
    local = tmp_path / "local.shards"
    pipeline.pack(images, local, shard_size=SHARD, progress=False)
    fs.put(str(local / "shard-00000.bin"), f"upl/{tmp_path.name}/k.shards/shard-00000.bin")  # killed: no manifest
    with pytest.raises(IncompletePackError, match="did not finish"):
        PackReader(url)
    _run(capsys, ["pack", str(images), url, "--quiet"])  # the same command: it starts again
    assert len(_records(url)[0]) == 36


def test_failed_upload_is_one_line_and_leaves_nothing(env, images, tmp_path, monkeypatch):
    sent = []
    real = upload.RemoteStore.upload

    def failing(self, local, name):
        sent.append(name)
        if len(sent) == 2:
            raise WriteError(f"{self.url_of(name)}: the object store did not answer after 5 attempts")
        real(self, local, name)

    monkeypatch.setattr(upload.RemoteStore, "upload", failing)
    url = f"s3://upl/{tmp_path.name}/f.shards"
    with pytest.raises(WriteError, match="did not answer"):
        pack_to_url(images, url, shard_size=SHARD, progress=False)
    assert sent[0].startswith("shard-")  # one shard went up before the failure
    assert not env.filesystem().exists(f"upl/{tmp_path.name}/f.shards")  # and was removed after it


def test_pack_refuses_missing_bucket_existing_pack_and_strangers(env, images, tmp_path, capsys):
    _, err = _run(capsys, ["pack", str(images), "s3://no-such-bucket/x.shards", "--quiet"], expect=1)
    assert "bucket does not exist" in err and err.count("\n") == 1
    url = f"s3://upl/{tmp_path.name}/e.shards"
    _run(capsys, ["pack", str(images), url, "--quiet"])
    _, err = _run(capsys, ["pack", str(images), url, "--quiet"], expect=2)
    assert "a pack is there" in err and "--overwrite" in err
    env.filesystem().pipe_file(f"upl/{tmp_path.name}/mine/notes.txt", b"keep me")
    _, err = _run(capsys, ["pack", str(images), f"s3://upl/{tmp_path.name}/mine", "--quiet", "--overwrite"], expect=2)
    assert "not a pack of packload's" in err and env.filesystem().cat(f"upl/{tmp_path.name}/mine/notes.txt") == b"keep me"
    _, err = _run(capsys, ["pack", str(images), f"s3://upl/{tmp_path.name}/mine", "--engine", "ray", "--overwrite"],
                  expect=2)  # the Ray engine refuses the same, before it starts Ray
    assert "not a pack of packload's" in err and env.filesystem().cat(f"upl/{tmp_path.name}/mine/notes.txt") == b"keep me"
    _, err = _run(capsys, ["pack", str(images), url, "--resume"], expect=2)
    assert "--resume does not apply" in err


def test_merge_from_and_to_urls(env, images, tmp_path, capsys):
    base = f"s3://upl/{tmp_path.name}"
    _run(capsys, ["pack", str(images), f"{base}/one.shards", "--quiet", "--shard-size", "64K"])
    _run(capsys, ["pack", str(images), str(tmp_path / "two.lmdb"), "--quiet"])
    summary = json.loads(_run(capsys, ["merge", f"{base}/both.shards", f"{base}/one.shards",
                                        str(tmp_path / "two.lmdb"), "--json"])[0])
    assert summary["destination"] == f"{base}/both.shards" and summary["records"] == 72
    labels, payloads, paths = _records(f"{base}/both.shards")
    one = _records(str(tmp_path / "two.lmdb"))
    assert labels == one[0] * 2 and payloads == one[1] * 2
    assert json.loads(_run(capsys, ["verify", f"{base}/both.shards", "--json"])[0])["ok"]


def test_verify_finds_a_damaged_shard_at_a_url(env, images, tmp_path, capsys):
    url = f"s3://upl/{tmp_path.name}/d.shards"
    _run(capsys, ["pack", str(images), url, "--quiet", "--shard-size", "64K"])
    fs = env.filesystem()
    key = f"upl/{tmp_path.name}/d.shards/shard-00001.bin"
    data = bytearray(fs.cat(key))
    data[-3] ^= 0x55
    fs.pipe_file(key, bytes(data))
    report = json.loads(_run(capsys, ["verify", url, "--json"], expect=1)[0])
    assert not report["ok"] and {"file": "shard-00001.bin", "problem": "sha256 differs from the manifest"} \
        in report["bad_files"]
    assert os.environ["AWS_ENDPOINT_URL"] == env.proxy.endpoint
