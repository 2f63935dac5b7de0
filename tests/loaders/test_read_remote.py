"""Reading packs from an S3-compatible server (moto, on 127.0.0.1) through the local cache."""

from __future__ import annotations

import pickle
import sys
import time
from concurrent import futures
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[dev]')")
pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")

from packload.core.errors import ChecksumError, IncompletePackError, PackloadError  # noqa: E402
from packload.loaders.dataset import PackedImageFolder  # noqa: E402
from packload.loaders.read import PackReader  # noqa: E402
from packload.packer.pipeline import pack  # noqa: E402
from tests.image_factory import make_image_folder  # noqa: E402
from tests.object_store import ObjectStore  # noqa: E402

BLOCK = 8192


@pytest.fixture(scope="module")
def store():
    with ObjectStore() as s:
        s.make_bucket("bkt")
        yield s


@pytest.fixture(scope="module")
def packs(tmp_path_factory, store):
    """A shards pack and an LMDB pack of the same images, local and uploaded."""
    root = tmp_path_factory.mktemp("remote")
    src = root / "src"
    make_image_folder(src, classes=("cat", "dog", "emu"), per_class=14)
    pack(src, root / "p.shards", shard_size=1 << 16, progress=False)
    pack(src, root / "p.lmdb", progress=False)
    fs = store.filesystem()
    fs.put(str(root / "p.shards"), "bkt/p.shards", recursive=True)
    fs.put(str(root / "p.lmdb"), "bkt/p.lmdb")
    return root


def _reader(store, url: str, cache: Path, **kw) -> PackReader:
    return PackReader(url, storage_options=store.options, cache_dir=cache, block_size=BLOCK, **kw)


def _all_bytes(reader: PackReader) -> list[bytes]:
    return [bytes(v) for v in reader.payloads(list(range(reader.records)))]


def test_shards_read_back_equal_to_the_local_pack(store, packs, tmp_path):
    with PackReader(packs / "p.shards") as local, _reader(store, "s3://bkt/p.shards", tmp_path, check_index=True) as remote:
        assert remote.backend == "shards" and remote.records == local.records == 42
        assert remote.labels().tolist() == local.labels().tolist()
        assert remote.classes == local.classes
        assert _all_bytes(remote) == _all_bytes(local)
        assert bytes(remote.payload(-1, verify=True)) == bytes(local.payload(-1))
        order = np.random.default_rng(0).permutation(local.records)
        assert [bytes(b) for b in remote.payload_bytes(order, verify=True)] == \
            [bytes(b) for b in local.payload_bytes(order)]
        assert bytes(remote.part_view(1)) == bytes(local.part_view(1))


def test_dataset_pickles_and_reopens_lazily(store, packs, tmp_path):
    ds = PackedImageFolder("s3://bkt/p.shards/", output="bytes", storage_options=store.options, cache_dir=tmp_path)
    local = PackedImageFolder(packs / "p.shards", output="bytes")
    copy = pickle.loads(pickle.dumps(ds))  # what a spawned DataLoader worker gets
    assert copy._reader is None
    assert [copy[i] for i in range(len(copy))] == [local[i] for i in range(len(local))]
    assert copy.targets == local.targets and copy.classes == local.classes


def test_second_epoch_is_served_from_the_cache(store, packs, tmp_path):
    with _reader(store, "s3://bkt/p.shards", tmp_path) as first:
        before = store.proxy.count("GET", "/bkt/p.shards/shard-")
        expected = _all_bytes(first)
        assert store.proxy.count("GET", "/bkt/p.shards/shard-") > before
    before = store.proxy.count("GET", "/bkt/p.shards/shard-")
    index_before = store.proxy.count("GET", "/bkt/p.shards/index.bin")
    with _reader(store, "s3://bkt/p.shards", tmp_path) as second:
        assert _all_bytes(second) == expected
    assert store.proxy.count("GET", "/bkt/p.shards/shard-") == before  # no shard bytes fetched again
    assert store.proxy.count("GET", "/bkt/p.shards/index.bin") == index_before


def test_cache_never_exceeds_its_limit(store, packs, tmp_path):
    limit = 5 * BLOCK
    cache = tmp_path / "cache"
    with PackReader(packs / "p.shards") as local, _reader(store, "s3://bkt/p.shards", cache, cache_limit=limit) as remote:
        order = np.random.default_rng(1).permutation(local.records)
        for batch in np.array_split(order, 10):
            assert [bytes(b) for b in remote.payloads(batch)] == [bytes(b) for b in local.payloads(batch)]
            used = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file() and f.suffix in (".blk", ".rec"))
            assert 0 < used <= limit  # the cached blocks and their records (the marker and lock file aside)


def test_dropped_connections_mid_read_are_retried(store, packs, tmp_path):
    with PackReader(packs / "p.shards") as local, _reader(store, "s3://bkt/p.shards", tmp_path) as remote:
        before = store.proxy.count("GET", "/bkt/p.shards/shard-")
        store.proxy.cut_next(3, "GET", "/bkt/p.shards/shard-")
        assert _all_bytes(remote) == _all_bytes(local)
        blocks = sum(-(-size // BLOCK) for size in remote._pack.part_sizes.tolist())
        assert store.proxy.count("GET", "/bkt/p.shards/shard-") - before >= blocks + 3  # the cut ones asked again


def test_advise_fetches_ahead_into_the_cache(store, packs, tmp_path):
    with _reader(store, "s3://bkt/p.shards", tmp_path) as remote:
        asked = remote.advise(np.arange(remote.records))
        assert asked > 0
        futures.wait(list(remote._pack._ahead.values()))  # the background fetches
        before = store.proxy.count("GET", "/bkt/p.shards/shard-")
        _all_bytes(remote)
        assert store.proxy.count("GET", "/bkt/p.shards/shard-") == before
        assert remote.advise(np.arange(remote.records)) == 0  # all cached: nothing asked


def test_lmdb_pack_is_fetched_whole_then_opened(store, packs, tmp_path):
    with PackReader(packs / "p.lmdb") as local, _reader(store, "s3://bkt/p.lmdb", tmp_path, check_index=True) as remote:
        assert remote.backend == "lmdb"
        assert remote.local_path.stat().st_size == (packs / "p.lmdb").stat().st_size
        assert tmp_path in remote.local_path.parents
        assert _all_bytes(remote) == _all_bytes(local)
    def object_gets() -> int:  # of the LMDB object itself (an open also asks for a manifest beside it)
        return sum(1 for method, path, _ in store.proxy.requests if method == "GET" and path.split("?")[0] == "/bkt/p.lmdb")

    before = object_gets()
    with _reader(store, "s3://bkt/p.lmdb", tmp_path) as again:
        assert again.records == 42
    assert object_gets() == before  # the cached copy, not a second download


def test_lmdb_larger_than_the_cache_is_refused(store, packs, tmp_path):
    with pytest.raises(PackloadError, match="does not fit the cache") as info:
        _reader(store, "s3://bkt/p.lmdb", tmp_path, cache_limit=1000)
    assert "\n" not in str(info.value) and "cache_limit" in str(info.value)


def test_damaged_shard_is_caught_by_its_checksum(store, packs, tmp_path):
    fs = store.filesystem()
    fs.put(str(packs / "p.shards"), "bkt/bad.shards", recursive=True)
    shard = bytearray((packs / "p.shards" / "shard-00000.bin").read_bytes())
    with PackReader(packs / "p.shards") as local:
        at = int(local.entries["payload_offset"][0]) + 5
    shard[at] ^= 0xFF
    fs.pipe_file("bkt/bad.shards/shard-00000.bin", bytes(shard))
    with _reader(store, "s3://bkt/bad.shards", tmp_path) as remote:
        with pytest.raises(ChecksumError, match="record 0"):
            remote.payloads([0, 1], verify=True)
        with pytest.raises(ChecksumError, match="sha256"):
            remote.part_view(0)


def test_missing_object_bucket_and_unfinished_pack(store, packs, tmp_path):
    with pytest.raises(PackloadError, match="no such pack") as missing:
        _reader(store, "s3://bkt/nothing.shards", tmp_path)
    with pytest.raises(PackloadError, match="bucket does not exist") as no_bucket:
        _reader(store, "s3://no-such-bucket/p.shards", tmp_path)
    fs = store.filesystem()
    fs.put(str(packs / "p.shards" / "shard-00000.bin"), "bkt/half.shards/shard-00000.bin")
    with pytest.raises(IncompletePackError, match="did not finish") as unfinished:
        _reader(store, "s3://bkt/half.shards", tmp_path)
    for error in (missing, no_bucket, unfinished):
        assert "\n" not in str(error.value)


def test_no_credentials_is_one_line(store, tmp_path, monkeypatch):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(PackloadError, match="no credentials") as info:
        PackReader("s3://bkt/p.shards", storage_options=store.options, cache_dir=tmp_path)
    assert "\n" not in str(info.value) and "AWS_ACCESS_KEY_ID" in str(info.value)


def test_url_without_fsspec_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "fsspec", None)  # import fsspec now fails
    with pytest.raises(PackloadError, match=r'pip install -e "\.\[s3\]"'):
        PackReader("s3://bkt/p.shards", cache_dir=tmp_path)


def test_a_batch_and_the_announcements_fetch_each_block_once(store, packs, tmp_path):
    """A batch that needs blocks still queued behind the announcements fetches them on its own
    threads; an announced fetch that starts meanwhile waits for it instead of asking again."""
    with _reader(store, "s3://bkt/p.shards", tmp_path) as remote:
        pack_of_url = remote._pack
        asked: list[tuple[str, int]] = []
        read_range = pack_of_url.store.read_range

        def slow_read_range(name: str, start: int, stop: int, tag: str | None = None) -> bytes:
            asked.append((name, start))
            time.sleep(0.05)  # long enough for both pools to hold requests at once
            return read_range(name, start, stop, tag)

        pack_of_url.store.read_range = slow_read_range
        blocks = sum(-(-size // BLOCK) for size in pack_of_url.part_sizes.tolist())
        assert blocks > 8  # more than the announcements' threads take at once
        remote.advise(np.arange(remote.records))
        got = _all_bytes(remote)  # the batch asks for every block while most are still queued
        futures.wait(list(pack_of_url._ahead.values()))
        with PackReader(packs / "p.shards") as local:
            assert got == _all_bytes(local)
        assert sorted(asked) == sorted(set(asked)) and len(asked) == blocks


def test_the_manifest_is_read_while_the_folder_is_listed(store, packs, tmp_path, monkeypatch):
    """An open asks for the manifest without waiting for the listing: here the listing answers only
    once the manifest has been asked for, so an open that waited for it first would never end."""
    import threading  # noqa: PLC0415

    from packload.core.remote import RemoteStore  # noqa: PLC0415

    asked = threading.Event()
    listing, read_head = RemoteStore.listing, RemoteStore.read_head

    def listing_after_manifest(self):
        assert asked.wait(60), "the listing was asked for alone: the manifest waited for it"
        return listing(self)

    def noting_read_head(self, name, limit):
        asked.set()
        return read_head(self, name, limit)

    monkeypatch.setattr(RemoteStore, "listing", listing_after_manifest)
    monkeypatch.setattr(RemoteStore, "read_head", noting_read_head)
    before = store.proxy.count("GET", "/bkt/p.shards/manifest.json")
    with _reader(store, "s3://bkt/p.shards", tmp_path) as remote:
        assert remote.records == 42
    assert store.proxy.count("GET", "/bkt/p.shards/manifest.json") == before + 1  # and read once
