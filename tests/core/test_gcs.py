"""Packs at gs:// URLs through gcsfs, on a GCS-compatible server (gcp-storage-emulator, on 127.0.0.1):
``pack`` (from Python and the command line), reading back, ``verify``, ``info``, ``unpack`` and
``merge``, an LMDB pack fetched into the cache, a DataLoader with two workers, and the errors."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys

import pytest
from torch.utils.data import DataLoader

from tests import gcs_store  # noqa: I001 - before gcsfs: it chooses the filesystem gcsfs gives fsspec

pytest.importorskip("gcsfs", reason="gcsfs is not installed (pip install -e '.[dev]')")
pytest.importorskip("gcp_storage_emulator", reason="gcp-storage-emulator is not installed (pip install -e '.[dev]')")

import fsspec.config  # noqa: E402

from packload.cli import main  # noqa: E402
from packload.core.errors import PackloadError  # noqa: E402
from packload.loaders.dataset import PackedImageFolder  # noqa: E402
from packload.loaders.read import PackReader  # noqa: E402
from packload.loaders.read_remote import DEFAULT_BLOCK_SIZE  # noqa: E402
from packload.packer.pipeline import pack  # noqa: E402
from tests.image_factory import make_image_folder  # noqa: E402

BUCKET = "gbkt"
SHARD = 1 << 16


@pytest.fixture(scope="module")
def store():
    with gcs_store.GcsStore() as s:
        s.make_bucket(BUCKET)
        yield s


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """An image folder, and a shards pack and an LMDB pack of it on local disk."""
    root = tmp_path_factory.mktemp("gcs")
    make_image_folder(root / "src", classes=("ant", "bee", "cow"), per_class=12)
    pack(root / "src", root / "p.shards", shard_size=SHARD, progress=False)
    pack(root / "src", root / "p.lmdb", progress=False)
    return root


@pytest.fixture
def env(store, monkeypatch, tmp_path):
    """The command line finds the server as users point gcsfs at one: STORAGE_EMULATOR_HOST, and
    the other options as fsspec reads them from FSSPEC_GS_* when it is imported (here already)."""
    for key, value in store.environment.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setitem(fsspec.config.conf, "gs", {"token": "anon", "project": gcs_store.PROJECT})
    monkeypatch.setenv("PACKLOAD_CACHE", str(tmp_path / "cache"))
    return store


def _run(capsys, argv, expect=0):
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == expect, (out, err)
    return out, err


def _records(path, **kw):
    with PackReader(path, **kw) as reader:
        return reader.labels().tolist(), [bytes(v) for v in reader.payloads(list(range(reader.records)))], \
            [reader.path_of(i) for i in range(reader.records)]


def _local_items(path):
    ds = PackedImageFolder(path, output="bytes")
    return [ds[i] for i in range(len(ds))]


def test_pack_from_python_reads_back_equal_to_the_local_pack(store, local, tmp_path):
    url = f"gs://{BUCKET}/{tmp_path.name}/train.shards"
    summary = pack(local / "src", url, shard_size=SHARD, progress=False, storage_options=store.options)
    assert summary["destination"] == url and summary["records"] == 36
    stored = store.filesystem().ls(f"{BUCKET}/{tmp_path.name}/train.shards", detail=False)
    names = sorted(p.rsplit("/", 1)[-1] for p in stored)
    assert names == sorted(p.name for p in (local / "p.shards").iterdir())
    before = store.proxy.count("GET", f"/download/storage/v1/b/{BUCKET}/o/{tmp_path.name}%2Ftrain.shards%2Fshard-",
                               ranged=True)
    ds = PackedImageFolder(url, output="bytes", storage_options=store.options, cache_dir=tmp_path / "cache")
    assert ds.reader().ranged and ds.classes == ["ant", "bee", "cow"]
    assert [ds[i] for i in range(len(ds))] == _local_items(local / "p.shards")
    assert ds.targets == PackedImageFolder(local / "p.shards").targets
    # Read by ranged requests of blocks, not whole shards.
    ranged = store.proxy.count("GET", f"/download/storage/v1/b/{BUCKET}/o/{tmp_path.name}%2Ftrain.shards%2Fshard-",
                               ranged=True) - before
    shards = list((local / "p.shards").glob("shard-*"))
    assert len(shards) >= 2 and all(f.stat().st_size < DEFAULT_BLOCK_SIZE for f in shards)
    assert ranged == len(shards)  # one block each


@pytest.mark.parametrize("name", ["c.shards", "c.lmdb"])
def test_cli_pack_info_verify_unpack(env, local, tmp_path, capsys, name):
    url = f"gs://{BUCKET}/{tmp_path.name}/{name}"
    summary = json.loads(_run(capsys, ["pack", str(local / "src"), url, "--shard-size", "64K", "--json"])[0])
    assert summary["destination"] == url and summary["records"] == 36
    want = _records(local / ("p" + name[1:]))
    assert _records(url) == want
    info = json.loads(_run(capsys, ["info", url, "--json"])[0])
    assert info["records"] == 36 and info["classes"] == ["ant", "bee", "cow"] and info["backend"] == name[2:]
    report = json.loads(_run(capsys, ["verify", url, "--json"])[0])
    assert report["ok"] and report["path"] == url
    _run(capsys, ["unpack", url, str(tmp_path / "out"), "--quiet"])
    for rel in want[2]:
        assert (tmp_path / "out" / rel).read_bytes() == (local / "src" / rel).read_bytes()


def test_cli_in_a_new_process_takes_everything_from_the_environment(store, local, tmp_path):
    """A fresh ``packload`` process, configured as a user's shell configures it (fsspec reads
    FSSPEC_GS_TOKEN when it is imported)."""
    url = f"gs://{BUCKET}/{tmp_path.name}/e.shards"
    environment = {**os.environ, **store.environment, "PACKLOAD_CACHE": str(tmp_path / "cache")}
    for argv in (["pack", str(local / "src"), url, "--quiet"], ["info", url, "--json"]):
        done = subprocess.run([sys.executable, "-m", "packload", *argv], env=environment, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["records"] == 36
    assert _records(url, storage_options=store.options) == _records(local / "p.shards")


def test_merge_from_and_to_gs(env, local, tmp_path, capsys):
    base = f"gs://{BUCKET}/{tmp_path.name}"
    _run(capsys, ["pack", str(local / "src"), f"{base}/one.shards", "--quiet", "--shard-size", "64K"])
    summary = json.loads(_run(capsys, ["merge", f"{base}/both.shards", f"{base}/one.shards",
                                        str(local / "p.lmdb"), "--json"])[0])
    assert summary["destination"] == f"{base}/both.shards" and summary["records"] == 72
    labels, payloads, _ = _records(f"{base}/both.shards")
    one = _records(local / "p.lmdb")
    assert labels == one[0] * 2 and payloads == one[1] * 2
    assert json.loads(_run(capsys, ["verify", f"{base}/both.shards", "--json"])[0])["ok"]


def test_verify_finds_a_damaged_shard_on_gs(env, local, tmp_path, capsys):
    url = f"gs://{BUCKET}/{tmp_path.name}/d.shards"
    _run(capsys, ["pack", str(local / "src"), url, "--quiet", "--shard-size", "64K"])
    fs = env.filesystem()
    key = f"{BUCKET}/{tmp_path.name}/d.shards/shard-00001.bin"
    data = bytearray(fs.cat(key))
    data[-3] ^= 0x55
    fs.pipe_file(key, bytes(data))
    report = json.loads(_run(capsys, ["verify", url, "--json"], expect=1)[0])
    assert not report["ok"]
    assert {"file": "shard-00001.bin", "problem": "sha256 differs from the manifest"} in report["bad_files"]


def test_lmdb_pack_is_fetched_into_the_cache(store, local, tmp_path):
    url = f"gs://{BUCKET}/{tmp_path.name}/p.lmdb"
    store.filesystem().put_file(str(local / "p.lmdb"), url[len("gs://"):])
    cache = tmp_path / "cache"
    with PackReader(url, storage_options=store.options, cache_dir=cache, check_index=True) as remote:
        assert remote.backend == "lmdb"
        assert cache in remote.local_path.parents
        assert remote.local_path.stat().st_size == (local / "p.lmdb").stat().st_size
    assert _records(url, storage_options=store.options, cache_dir=cache) == _records(local / "p.lmdb")
    path = f"/download/storage/v1/b/{BUCKET}/o/{tmp_path.name}%2Fp.lmdb"
    def object_gets() -> int:  # of the LMDB object itself (an open also asks for a manifest beside it)
        return sum(1 for m, p, _ in store.proxy.requests if m == "GET" and p.split("?")[0] == path)

    before = object_gets()
    assert before >= 1
    with PackReader(url, storage_options=store.options, cache_dir=cache) as again:
        assert again.records == 36
    assert object_gets() == before  # the cached copy, not a second download


def _first(batch):
    return batch


def test_two_workers_read_every_sample_once(store, local, tmp_path):
    url = f"gs://{BUCKET}/{tmp_path.name}/w.shards"
    store.filesystem().put(str(local / "p.shards"), url[len("gs://"):], recursive=True)
    ds = PackedImageFolder(url, output="bytes", storage_options=store.options, cache_dir=tmp_path / "cache")
    sampler = ds.sampler(shuffle=True, seed=4)
    order = list(ds.sampler(shuffle=True, seed=4))
    loader = DataLoader(ds, batch_size=5, sampler=sampler, num_workers=2, collate_fn=_first,
                        multiprocessing_context=multiprocessing.get_context("fork"))
    got = [item for batch in loader for item in batch]
    want = _local_items(local / "p.shards")
    assert sorted(order) == list(range(36))  # every sample once ...
    assert got == [want[i] for i in order]  # ... in the sampler's order, the local pack's bytes


def test_missing_object_and_bucket_are_one_line(store, local, tmp_path):
    with pytest.raises(PackloadError, match="no such pack") as missing:
        PackReader(f"gs://{BUCKET}/nothing.shards", storage_options=store.options, cache_dir=tmp_path)
    with pytest.raises(PackloadError, match="bucket does not exist") as no_bucket:
        PackReader("gs://no-such-bucket/p.shards", storage_options=store.options, cache_dir=tmp_path)
    with pytest.raises(PackloadError, match="bucket does not exist") as no_bucket_pack:
        pack(local / "src", "gs://no-such-bucket/x.shards", progress=False, storage_options=store.options)
    for error, url in ((missing, f"gs://{BUCKET}/nothing.shards"), (no_bucket, "gs://no-such-bucket/p.shards"),
                       (no_bucket_pack, "gs://no-such-bucket/x.shards")):
        assert "\n" not in str(error.value) and str(error.value).startswith(url)


def test_cli_missing_object_and_bucket_exit_1_with_one_line(env, local, capsys):
    nothing, lmdb, no_bucket = f"gs://{BUCKET}/nothing.shards", f"gs://{BUCKET}/nothing.lmdb", "gs://no-such-bucket/x.shards"
    for argv, url, words in ((["info", nothing], nothing, "no such pack"),
                             (["verify", lmdb], lmdb, "no such pack"),
                             (["pack", str(local / "src"), no_bucket, "--quiet"], no_bucket, "bucket does not exist")):
        _, err = _run(capsys, argv, expect=1)
        assert err.startswith(f"packload: error: {url}: ") and words in err and err.count("\n") == 1


def test_missing_credentials_are_one_line_naming_the_variable(store, tmp_path, monkeypatch):
    """gcsfs asked for Google's default credentials, where the file they name is not there."""
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-such-key.json"))
    options = {**store.options, "token": "google_default"}
    url = f"gs://{BUCKET}/p.shards"
    with pytest.raises(PackloadError, match="no credentials") as info:
        PackReader(url, storage_options=options, cache_dir=tmp_path)
    text = str(info.value)
    assert "\n" not in text and text.startswith(url) and "GOOGLE_APPLICATION_CREDENTIALS" in text and "AWS_" not in text


@pytest.fixture
def fresh_filesystems():
    """fsspec keeps one filesystem per set of options, and the endpoint from STORAGE_EMULATOR_HOST is
    not among them: one made for another endpoint must not answer here, nor this one afterwards."""
    import gcsfs  # noqa: PLC0415

    gcsfs.GCSFileSystem.clear_instance_cache()
    yield
    gcsfs.GCSFileSystem.clear_instance_cache()


def test_cli_unreachable_store_is_one_line(env, fresh_filesystems, monkeypatch, capsys):
    """Nothing listens at the endpoint: gcsfs retries the connection itself (and logs each failure
    with a traceback, kept off stderr); packload does not retry it again, and says so in one line."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{gcs_store.closed_port()}")
    url = f"gs://{BUCKET}/p.shards"
    _, err = _run(capsys, ["info", url], expect=1)
    assert err.startswith(f"packload: error: {url}: could not connect to the object store")
    assert "STORAGE_EMULATOR_HOST" in err and err.count("\n") == 1


@pytest.mark.parametrize("status, words", [(401, "no credentials"), (403, "access denied")])
def test_refused_requests_are_not_retried_and_name_the_fix(status, words):
    """gcsfs's own errors for a 401 (an ``HttpError``) and a 403 (a plain ``OSError``), raised by
    its code from the answer a server gives."""
    from gcsfs.retry import validate_response  # noqa: PLC0415

    from packload.core.remote import retried  # noqa: PLC0415

    calls = []

    def refused():
        calls.append(1)
        body = json.dumps({"error": {"code": status, "message": "Anonymous caller does not have "
                                                               "storage.objects.get access"}}).encode()
        validate_response(status, body, "b/bkt/o/p.shards%2Fmanifest.json")

    with pytest.raises(PackloadError, match=words) as info:
        retried(refused, "gs://bkt/p.shards")
    assert len(calls) == 1 and "\n" not in str(info.value) and str(info.value).startswith("gs://bkt/p.shards")
    if status == 401:
        assert "GOOGLE_APPLICATION_CREDENTIALS" in str(info.value) and "AWS_" not in str(info.value)


def test_shards_larger_than_a_simple_upload_go_up_resumable_and_read_back_by_blocks(store, tmp_path):
    """Noise images (they do not compress) make a shard over gcsfs's 5 MiB simple-upload limit: it
    goes up in a resumable upload, and comes back in 8 MiB ranged reads, the last one short."""
    import numpy as np  # noqa: PLC0415
    from PIL import Image  # noqa: PLC0415

    rng = np.random.default_rng(7)
    for k in range(6):
        noise = rng.integers(0, 256, size=(1100, 1000, 3), dtype=np.uint8)
        (tmp_path / "src" / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(noise).save(tmp_path / "src" / f"c{k % 2}" / f"n{k}.png")
    pack(tmp_path / "src", tmp_path / "big.shards", shard_size=64 << 20, progress=False)
    shard = tmp_path / "big.shards" / "shard-00000.bin"
    assert shard.stat().st_size > DEFAULT_BLOCK_SIZE + (5 << 20)  # two blocks, the second partial
    url = f"gs://{BUCKET}/{tmp_path.name}/big.shards"
    pack(tmp_path / "src", url, shard_size=64 << 20, progress=False, storage_options=store.options)
    resumable = [path for method, path, _ in store.proxy.requests if method == "POST" and "uploadType=resumable" in path
                 and f"{tmp_path.name}/big.shards/shard-00000.bin" in path.replace("%2F", "/")]
    chunks = [path for path in resumable if "upload_id=" in path]
    assert len(resumable) - len(chunks) == 1 and chunks  # started once, its bytes sent under the upload's id
    before = store.proxy.count("GET", ranged=True)
    ds = PackedImageFolder(url, output="bytes", storage_options=store.options, cache_dir=tmp_path / "cache")
    assert [ds[i] for i in range(len(ds))] == _local_items(tmp_path / "big.shards")
    assert store.proxy.count("GET", ranged=True) - before >= 2


def test_a_pack_replaced_under_an_open_reader_is_refused(store, local, tmp_path):
    """The emulator serves the current object whatever generation is asked for (GCS itself would
    refuse an old one): the records' own CRC-32s find the other pack's bytes, and the manifest there
    now says it is another pack. Never the other pack's records, never a 'damaged' message."""
    from packload.core.errors import ChecksumError, PackChangedError  # noqa: PLC0415

    make_image_folder(tmp_path / "other", classes=("dog", "emu"), per_class=18, seed=4)
    pack(tmp_path / "other", tmp_path / "other.shards", shard_size=SHARD, progress=False)
    fs = store.filesystem()
    url = f"gs://{BUCKET}/{tmp_path.name}/p.shards"
    fs.put(str(local / "p.shards"), f"{BUCKET}/{tmp_path.name}/p.shards", recursive=True)
    expected = _records(local / "p.shards")[1]
    reader = PackReader(url, storage_options=store.options, cache_dir=tmp_path / "cache", block_size=8192)
    try:
        assert bytes(reader.payload(0)) == expected[0]
        for name in os.listdir(tmp_path / "other.shards"):  # every object of the other pack, over this one's
            fs.put_file(str(tmp_path / "other.shards" / name), f"{BUCKET}/{tmp_path.name}/p.shards/{name}")
        refused = 0
        for i in range(reader.records):
            try:
                assert bytes(reader.payload(i)) == expected[i]
            except PackChangedError as exc:
                assert not isinstance(exc, ChecksumError) and "changed since it was opened" in str(exc)
                refused += 1
        assert refused > 0
    finally:
        reader.close()
