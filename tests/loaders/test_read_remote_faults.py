"""Packs at a URL when things go wrong around the reader: the pack packed again under an open reader,
a cache folder shared with the user's files, cached blocks that are not what they say, a store that
never answers or stops halfway, credentials in the URL, a cache folder that cannot be used. Against
moto's S3 server on 127.0.0.1, behind the fault-injecting proxy of ``tests/object_store.py``."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest

pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[dev]')")
pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")

from packload.cli import main  # noqa: E402
from packload.core.errors import ChecksumError, PackChangedError, PackloadError  # noqa: E402
from packload.core.remote_deadlines import RETRIES  # noqa: E402
from packload.loaders.dataset import PackedImageFolder  # noqa: E402
from packload.loaders.read import PackReader  # noqa: E402
from packload.packer.pipeline import pack  # noqa: E402
from tests.image_factory import make_image_folder  # noqa: E402
from tests.object_store import ObjectStore  # noqa: E402

BUCKET = "bkt-faults"  # moto keeps one store per process: a bucket of this file's own
BLOCK = 8192
TIMEOUT = 1.0  # seconds: the deadline the stalled-store tests configure


@pytest.fixture(scope="module")
def store():
    with ObjectStore() as s:
        s.make_bucket(BUCKET)
        yield s


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Two folders that differ in pixels, classes and counts; packed locally, shards and LMDB."""
    root = tmp_path_factory.mktemp("faults")
    make_image_folder(root / "a", classes=("cat", "dog", "emu"), per_class=14)
    make_image_folder(root / "b", classes=("ant", "bee"), per_class=19, seed=7)
    for name in ("a", "b"):
        pack(root / name, root / f"{name}.shards", shard_size=1 << 16, progress=False)
    pack(root / "a", root / "a.lmdb", progress=False)
    return root


def _upload(store, local: Path, key: str) -> str:
    fs = store.filesystem()
    if fs.exists(f"{BUCKET}/{key}"):
        fs.rm(f"{BUCKET}/{key}", recursive=True)
    fs.put(str(local), f"{BUCKET}/{key}", recursive=local.is_dir())
    return f"s3://{BUCKET}/{key}"


def _reader(store, url: str, cache: Path, **kw) -> PackReader:
    kw.setdefault("block_size", BLOCK)
    return PackReader(url, storage_options=store.options, cache_dir=cache, **kw)


def _local(path: Path) -> tuple[list[bytes], list[int]]:
    with PackReader(path) as reader:
        return [bytes(v) for v in reader.payloads(list(range(reader.records)))], reader.labels().tolist()


# -- a pack packed again under an open reader ---------------------------------------------------
@pytest.mark.parametrize("how", ["pack --overwrite", "objects copied over"])
@pytest.mark.parametrize("verify", [False, True])
def test_a_pack_replaced_under_an_open_reader_is_refused_never_mixed(store, sources, tmp_path, monkeypatch,
                                                                     capsys, how, verify):
    """Pack A is open (a few of its blocks cached); B is written over the URL. Every record the open
    reader gives is A's, exactly; the rest raise PackChangedError saying the pack changed and to
    open it again: never B's bytes under A's labels, never a "damaged, re-copy" message."""
    expected, _ = _local(sources / "a.shards")
    url = _upload(store, sources / "a.shards", f"{tmp_path.name}/p.shards")
    reader = _reader(store, url, tmp_path / "cache", check_index=verify)
    try:
        assert bytes(reader.payload(0, verify=verify)) == expected[0]
        if how == "pack --overwrite":
            monkeypatch.setenv("AWS_ENDPOINT_URL", store.proxy.endpoint)
            assert main(["pack", str(sources / "b"), url, "--overwrite", "--quiet", "--shard-size", "64K"]) == 0
            capsys.readouterr()
        else:
            _upload(store, sources / "b.shards", f"{tmp_path.name}/p.shards")
        refused = 0
        for i in range(reader.records):
            try:
                got = bytes(reader.payload(i, verify=verify))
            except PackChangedError as exc:
                assert not isinstance(exc, ChecksumError) and "changed since it was opened" in str(exc)
                assert "open it again" in str(exc) and "\n" not in str(exc)
                refused += 1
                continue
            assert got == expected[i], f"record {i}: bytes of another pack"
        assert refused > 0
        with pytest.raises(PackChangedError, match="changed since it was opened"):
            for part in range(len(reader.part_names)):
                reader.part_view(part)
    finally:
        reader.close()
    b, b_labels = _local(sources / "b.shards")
    with _reader(store, url, tmp_path / "cache") as again:  # a new open reads the new pack, whole
        assert [bytes(v) for v in again.payloads(list(range(again.records)))] == b
        assert again.labels().tolist() == b_labels


def test_the_dataset_refuses_a_pack_replaced_under_it(store, sources, tmp_path):
    expected, labels = _local(sources / "a.shards")
    url = _upload(store, sources / "a.shards", f"{tmp_path.name}/d.shards")
    ds = PackedImageFolder(url, output="bytes", storage_options=store.options, cache_dir=tmp_path / "c")
    assert ds[0] == (expected[0], labels[0])
    _upload(store, sources / "b.shards", f"{tmp_path.name}/d.shards")
    with pytest.raises(PackChangedError, match="changed since it was opened"):
        for i in range(len(ds)):
            assert ds[i] == (expected[i], labels[i])


def test_an_lmdb_pack_replaced_while_it_is_fetched_is_refused(store, sources, tmp_path, monkeypatch):
    from packload.core import remote  # noqa: PLC0415

    url = _upload(store, sources / "a.lmdb", f"{tmp_path.name}/p.lmdb")
    download = remote.RemoteStore.download

    def replaced_first(self, name, size, fd, tag=None):
        store.filesystem().pipe_file(f"{BUCKET}/{tmp_path.name}/p.lmdb", b"another object " * 100)
        return download(self, name, size, fd, tag)

    monkeypatch.setattr(remote.RemoteStore, "download", replaced_first)
    with pytest.raises(PackChangedError, match="changed while it was fetched") as info:
        _reader(store, url, tmp_path / "cache")
    assert "\n" not in str(info.value)


# -- the cache folder and what is in it -------------------------------------------------------
def test_the_users_files_in_cache_dir_survive_a_small_cache_limit(store, sources, tmp_path):
    """``cache_dir`` holds the user's own files, older than anything cached, and ``cache_limit`` is
    below what they take: reading a pack through it deletes none of them."""
    expected, _ = _local(sources / "a.shards")
    url = _upload(store, sources / "a.shards", f"{tmp_path.name}/p.shards")
    folder = tmp_path / "mine"
    folder.mkdir()
    files = {}
    for k in range(20):
        path = folder / f"photo-{k}.jpg"
        path.write_bytes(bytes([k]) * 2000)
        os.utime(path, (1000 + k, 1000 + k))
        files[path] = path.read_bytes()
    for link in (False, True):
        cache = folder
        if link:
            cache = tmp_path / "link"
            cache.symlink_to(folder)
        with _reader(store, url, cache, cache_limit=6 * BLOCK) as remote:
            assert [bytes(v) for v in remote.payloads(list(range(remote.records)))] == expected
    assert all(path.read_bytes() == data for path, data in files.items())
    assert sorted(p.name for p in folder.iterdir()) == sorted([p.name for p in files] + ["packload-blocks"])


def _shard_sizes(path: Path) -> list[int]:
    with PackReader(path) as reader:
        return [int(reader.part_view(p).nbytes) for p in range(len(reader.part_names))]


def _colliding_block_sizes(sizes: list[int]) -> tuple[int, int]:
    """Two block sizes under which block 1 of a shard has the same length at different offsets: 4096
    bytes at 4096 with the first, the shard's last 4096 bytes with the second. Named by the shard
    and the block's number alone, one would be served for the other."""
    largest = max(sizes)
    assert largest - 4096 > 4096
    return 4096, largest - 4096


def test_two_block_sizes_sharing_one_cache_read_their_own_blocks(store, sources, tmp_path):
    expected, _ = _local(sources / "a.shards")
    url = _upload(store, sources / "a.shards", f"{tmp_path.name}/p.shards")
    small, large = _colliding_block_sizes(_shard_sizes(sources / "a.shards"))
    for block_size in (small, large, small):
        with _reader(store, url, tmp_path / "cache", block_size=block_size) as remote:
            order = np.random.default_rng(block_size).permutation(remote.records)
            assert [bytes(v) for v in remote.payloads(order)] == [expected[i] for i in order]


def test_flipped_bytes_in_a_cached_block_are_fetched_again(store, sources, tmp_path, capsys, monkeypatch):
    expected, _ = _local(sources / "a.shards")
    url = _upload(store, sources / "a.shards", f"{tmp_path.name}/p.shards")
    cache = tmp_path / "cache"
    with _reader(store, url, cache) as first:
        assert [bytes(v) for v in first.payloads(list(range(first.records)))] == expected
    blocks = sorted(cache.rglob("*.blk"), key=lambda p: p.stat().st_size)
    assert blocks
    for path in blocks[-3:]:  # 64 bytes flipped in place in the largest blocks, the size kept
        data = bytearray(path.read_bytes())
        at = len(data) // 2
        data[at : at + 64] = bytes(b ^ 0xFF for b in data[at : at + 64])
        path.write_bytes(bytes(data))
    before = store.proxy.count("GET", f"/{BUCKET}/{tmp_path.name}/p.shards/shard-")
    for _ in range(2):  # on every later read
        with _reader(store, url, cache) as again:
            assert [bytes(v) for v in again.payloads(list(range(again.records)))] == expected
    assert store.proxy.count("GET", f"/{BUCKET}/{tmp_path.name}/p.shards/shard-") == before + 3  # refetched once
    monkeypatch.setenv("AWS_ENDPOINT_URL", store.proxy.endpoint)
    capsys.readouterr()
    assert main(["verify", url, "--json"]) == 0
    assert '"ok": true' in capsys.readouterr().out


def test_a_block_file_planted_as_a_link_is_not_followed(store, sources, tmp_path):
    expected, _ = _local(sources / "a.shards")
    url = _upload(store, sources / "a.shards", f"{tmp_path.name}/p.shards")
    cache = tmp_path / "cache"
    with _reader(store, url, cache) as first:
        first.payloads(list(range(first.records)))
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"v" * 10)
    planted = []
    for path in sorted(cache.rglob("*.blk"))[:4]:
        path.unlink()
        path.symlink_to(victim)
        planted.append(path)
    with _reader(store, url, cache) as again:
        assert [bytes(v) for v in again.payloads(list(range(again.records)))] == expected
    assert victim.read_bytes() == b"v" * 10
    assert not any(path.is_symlink() for path in planted)  # replaced by the blocks, never written through


def test_an_lmdb_pack_with_a_cache_folder_that_cannot_be_used_says_why(store, sources, tmp_path):
    url = _upload(store, sources / "a.lmdb", f"{tmp_path.name}/p.lmdb")
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"not a folder")
    with pytest.raises(PackloadError) as info:
        _reader(store, url, blocker)
    text = str(info.value)
    assert "not a folder" in text and "does not fit" not in text and "cache_dir" in text and "\n" not in text
    (tmp_path / "theirs" / "packload-blocks").mkdir(parents=True)
    (tmp_path / "theirs" / "packload-blocks" / "data.db").write_bytes(b"theirs")
    with pytest.raises(PackloadError, match="not packload's") as info:
        _reader(store, url, tmp_path / "theirs")
    assert (tmp_path / "theirs" / "packload-blocks" / "data.db").read_bytes() == b"theirs"


# -- a store that never answers, or stops halfway ---------------------------------------------
@pytest.mark.parametrize("after", [None, 100], ids=["never answers", "stalls mid-body"])
def test_a_stalled_store_fails_in_one_line_within_the_deadline(store, sources, tmp_path, after):
    url = _upload(store, sources / "a.shards", f"{tmp_path.name}/p.shards")
    remote = _reader(store, url, tmp_path / "cache", timeout=TIMEOUT)
    try:
        store.proxy.stall_next(1000, "GET", f"/{BUCKET}/{tmp_path.name}/p.shards/shard-", after=after)
        with pytest.raises(PackloadError) as info:
            remote.payloads(list(range(remote.records)))
    finally:
        store.proxy.release_stalls()
        remote.close()
    text = str(info.value)
    assert "did not answer" in text and "PACKLOAD_TIMEOUT" in text and url in text and "\n" not in text
    _gave_up_within_the_deadline(text)


def _gave_up_within_the_deadline(text: str) -> None:
    """The read gave up after at most ``RETRIES`` attempts, each allowed the deadline given, rather
    than waiting on the stalled store: what bounds its time (the attempts' timing is checked on a
    virtual clock in tests/core/test_remote_deadlines.py); no stopwatch here."""
    attempts = re.search(r"did not answer after (\d+) attempt\(s\)", text)
    assert attempts is not None and 1 <= int(attempts.group(1)) <= RETRIES, text
    assert f"each may take {TIMEOUT:g} s" in text, text


def test_a_stalled_listing_and_lmdb_download_fail_within_the_deadline(store, sources, tmp_path, monkeypatch):
    monkeypatch.setenv("PACKLOAD_TIMEOUT", str(TIMEOUT))
    shards = _upload(store, sources / "a.shards", f"{tmp_path.name}/p.shards")
    lmdb = _upload(store, sources / "a.lmdb", f"{tmp_path.name}/p.lmdb")
    for url, path in ((shards, f"/{BUCKET}?list-type"), (lmdb, f"/{BUCKET}/{tmp_path.name}/p.lmdb")):
        store.proxy.stall_next(1000, "GET", path, after=None)
        try:
            with pytest.raises(PackloadError, match="did not answer") as info:
                _reader(store, url, tmp_path / "cache")
        finally:
            store.proxy.release_stalls()
        assert "\n" not in str(info.value)
        _gave_up_within_the_deadline(str(info.value))


def test_the_timeout_is_checked(store, tmp_path, monkeypatch):
    monkeypatch.setenv("PACKLOAD_TIMEOUT", "soon")
    with pytest.raises(PackloadError, match="PACKLOAD_TIMEOUT='soon'"):
        _reader(store, f"s3://{BUCKET}/x.shards", tmp_path)
    monkeypatch.delenv("PACKLOAD_TIMEOUT")
    with pytest.raises(PackloadError, match="timeout -1"):
        _reader(store, f"s3://{BUCKET}/x.shards", tmp_path, timeout=-1)


# -- credentials in a URL are never shown -------------------------------------------------------
def test_a_signed_url_is_never_shown_with_its_signature(store, sources, tmp_path, monkeypatch, capsys):
    _upload(store, sources / "a.lmdb", f"{tmp_path.name}/p.lmdb")
    signed = store.filesystem().sign(f"{BUCKET}/{tmp_path.name}/p.lmdb", expiration=600)
    query = parse_qs(urlsplit(signed).query)  # signature version 4 or 2, as botocore signs here
    secret = (query.get("X-Amz-Signature") or query["Signature"])[0]
    credential = (query.get("X-Amz-Credential") or query["AWSAccessKeyId"])[0].split("/")[0]
    assert len(secret) >= 16 and credential
    monkeypatch.setenv("PACKLOAD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PACKLOAD_TIMEOUT", "5")
    broken = signed.replace(secret, "0" * len(secret))  # refused by the store: an error that quotes the URL
    for url in (signed, broken, signed.replace("://", "://user:hunter2@")):
        for argv in (["info", url], ["info", url, "--json"], ["verify", url, "--json"]):
            main(argv)
            out, err = capsys.readouterr()
            for text in (out, err):
                assert secret not in text and credential not in text and "hunter2" not in text, argv


def test_a_shards_pack_with_a_cache_folder_that_cannot_be_used_is_read_and_says_so(store, sources, tmp_path):
    expected, _ = _local(sources / "a.shards")
    url = _upload(store, sources / "a.shards", f"{tmp_path.name}/p.shards")
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"not a folder")
    with pytest.warns(UserWarning, match="cache folder cannot be used .*not a folder"):
        reader = _reader(store, url, blocker)
    with reader:
        assert [bytes(v) for v in reader.payloads(list(range(reader.records)))] == expected
    assert blocker.read_bytes() == b"not a folder"
