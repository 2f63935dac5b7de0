"""Which backend a pack needs, and opening it (``packload.loaders.pack_open``): a local folder or file
by what the path is (through a link too), and a pack at a URL by what is there: a shards pack read
through the cache folder with the block size, limit and timeout given, an LMDB object fetched whole
into it; the listing and the manifest read at once. The URLs against moto's S3 server on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from packload.core.errors import IncompletePackError, UsageError
from packload.core.format import MANIFEST_NAME
from packload.core.remote import RemoteStore
from packload.loaders.pack_open import _listing_and_manifest, detect_backend, open_at_url, open_local
from packload.loaders.prefetch import ParallelFetcher
from packload.loaders.read import PackReader
from packload.loaders.read_lmdb import LmdbPack
from packload.loaders.read_remote import RemoteShardsPack
from packload.loaders.read_shards import ShardsPack
from tests.remote_packs import options, small_packs, store_with_bucket, upload

BUCKET = "bkt-pack-open"  # moto keeps one store per process: a bucket of this file's own


@pytest.fixture(scope="module")
def local(tmp_path_factory) -> dict[str, Path]:
    return small_packs(tmp_path_factory.mktemp("pack-open"), ("shards", "lmdb"), per_class=6)


@pytest.fixture(scope="module")
def store():
    pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[dev]')")
    pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")
    with store_with_bucket(BUCKET) as s:
        yield s


def test_the_backend_is_what_the_path_is_through_a_link_too(local, tmp_path):
    for backend, path in local.items():
        link = tmp_path / f"link.{backend}"
        link.symlink_to(path)
        assert detect_backend(path) == detect_backend(link) == backend


def test_a_path_that_is_no_pack_says_what_to_do(tmp_path):
    (tmp_path / "dangling.lmdb").symlink_to(tmp_path / "gone.lmdb")
    with pytest.raises(UsageError) as info:
        detect_backend(tmp_path / "dangling.lmdb")
    assert str(info.value) == (f"{tmp_path / 'dangling.lmdb'}: no such pack; give the .lmdb file or shards folder "
                               "that `pack` wrote")
    (tmp_path / "half.lmdb.partial").write_bytes(b"")  # an LMDB pack that did not finish: a file
    with pytest.raises(IncompletePackError) as info:
        detect_backend(tmp_path / "half.lmdb")
    assert str(info.value) == (f"{tmp_path / 'half.lmdb'}: not found, but an unfinished pack is at "
                               f"{tmp_path / 'half.lmdb.partial'}; finish it with `pack SRC DEST --resume`")


def test_a_local_pack_opens_with_its_backends_reader(local):
    for backend, opener in (("shards", ShardsPack), ("lmdb", LmdbPack)):
        fetcher = ParallelFetcher(0)
        opened = open_local(local[backend], backend, fetcher)
        try:
            with PackReader(local[backend]) as reader:
                assert isinstance(opened, opener) and opened.index_bytes() == reader.index_bytes()
                assert opened.manifest == reader.manifest and len(opened.entries) == reader.records == 12
        finally:
            opened.close()
            fetcher.close()


def test_a_pack_at_a_url_opens_by_what_is_there(store, local, tmp_path):
    fetcher = ParallelFetcher(0)
    shards = upload(store, local["shards"], BUCKET, f"{tmp_path.name}/p.shards")
    backend, opened, path = open_at_url(shards, fetcher, tmp_path / "cache", 1 << 24, 8192, options(store), 7.0)
    try:
        assert (backend, path) == ("shards", None) and isinstance(opened, RemoteShardsPack)
        assert opened.block_size == 8192 and opened.store.timeout == 7.0
        assert opened.cache.limit == 1 << 24 and opened.cache.root == tmp_path / "cache"
        assert opened.manifest == json.loads((local["shards"] / MANIFEST_NAME).read_bytes())
    finally:
        opened.close()
    lmdb = upload(store, local["lmdb"], BUCKET, f"{tmp_path.name}/p.lmdb")
    backend, opened, path = open_at_url(lmdb, fetcher, tmp_path / "cache", 1 << 24, 8192, options(store), None)
    try:
        assert backend == "lmdb" and isinstance(opened, LmdbPack)
        assert path.read_bytes() == local["lmdb"].read_bytes() and (tmp_path / "cache") in path.parents
    finally:
        opened.close()
        fetcher.close()


def test_the_listing_and_the_manifest_are_read_at_once(store, local, tmp_path):
    shards = upload(store, local["shards"], BUCKET, f"{tmp_path.name}/p.shards")
    listing, head = _listing_and_manifest(RemoteStore(shards, options(store)))
    assert listing == {p.name: p.stat().st_size for p in local["shards"].iterdir()}
    assert head == (local["shards"] / MANIFEST_NAME).read_bytes()
    lmdb = upload(store, local["lmdb"], BUCKET, f"{tmp_path.name}/p.lmdb")
    listing, head = _listing_and_manifest(RemoteStore(lmdb, options(store)))
    assert head is None and MANIFEST_NAME not in listing  # nothing to read: the listing says what it is
    assert _listing_and_manifest(RemoteStore(f"s3://{BUCKET}/{tmp_path.name}/none", options(store))) == ({}, None)
