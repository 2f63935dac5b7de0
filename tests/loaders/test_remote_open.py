"""Opening a shards pack at a URL (``packload.loaders.remote_open``): the listing, manifest and index
read as one pack (the manifest read with the listing used only when it is the one listed; the index
kept in the cache only when it is the manifest's), opened again from a new listing when what was
read is of two packs, given up on after a few tries; and every shard or index missing or not as
listed named in one line with what to do. Against moto's S3 server on 127.0.0.1."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[dev]')")
pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")

from packload.core.errors import PackChangedError, PackFormatError, UsageError  # noqa: E402
from packload.core.format import INDEX_NAME, MANIFEST_NAME  # noqa: E402
from packload.core.remote import RemoteStore  # noqa: E402
from packload.loaders.read import PackReader  # noqa: E402
from packload.loaders.read_cache import BlockCache, pack_folder_name  # noqa: E402
from packload.loaders.remote_open import OPEN_ATTEMPTS, open_pinned  # noqa: E402
from tests.remote_packs import filesystem, options, other_packs, small_packs, store_with_bucket, upload  # noqa: E402

BUCKET = "bkt-open"  # moto keeps one store per process: a bucket of this file's own


@pytest.fixture(scope="module")
def store():
    with store_with_bucket(BUCKET) as s:
        yield s


@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> dict[str, Path]:
    """Two shards packs of other images, of several shards each, and an LMDB pack of the first's images."""
    root = tmp_path_factory.mktemp("open")
    return {**other_packs(root), "a.lmdb": small_packs(root / "a-lmdb", ("lmdb",))["lmdb"]}


def _open(store, url: str, cache_dir: Path, listing: dict[str, int] | None = None, head: bytes | None = None):
    remote = RemoteStore(url, options(store))
    return open_pinned(remote, BlockCache(cache_dir, limit=1 << 24), remote.listing() if listing is None else listing,
                       head)


def _manifest(pack: Path) -> dict[str, Any]:
    return json.loads((pack / MANIFEST_NAME).read_bytes())


def test_an_open_reads_one_pack_and_keeps_its_index(store, packs, tmp_path):
    url = upload(store, packs["a"], BUCKET, f"{tmp_path.name}/p.shards")
    opened = _open(store, url, tmp_path / "cache")
    manifest = _manifest(packs["a"])
    sha = hashlib.sha256((packs["a"] / MANIFEST_NAME).read_bytes()).hexdigest()
    assert opened.manifest == manifest and opened.pin.manifest_sha256 == sha
    assert opened.key == pack_folder_name("pack", sha)  # the cache's folder of this very manifest
    names = [part["name"] for part in manifest["parts"]]
    assert opened.part_names == names and len(names) >= 2
    assert opened.part_sizes.dtype == np.int64 and opened.part_sizes.tolist() == [(packs["a"] / n).stat().st_size
                                                                                  for n in names]
    assert opened.index == (packs["a"] / INDEX_NAME).read_bytes()
    with PackReader(packs["a"]) as local:
        assert np.array_equal(opened.entries, local.entries) and opened.paths == local.paths
    assert set(opened.listed) == {MANIFEST_NAME, INDEX_NAME, *names} and set(opened.pin.tags) == set(opened.listed)
    kept = BlockCache(tmp_path / "cache").entries()
    assert [(pack, length > len(opened.index)) for _, pack, _, length in kept] == [(opened.key, True)]


def test_the_manifest_read_with_the_listing_is_used_only_when_it_is_the_one_listed(store, packs, tmp_path):
    url = upload(store, packs["a"], BUCKET, f"{tmp_path.name}/p.shards")
    raw = (packs["a"] / MANIFEST_NAME).read_bytes()
    other = bytearray(raw)
    other[len(other) // 2] ^= 0x01  # the same length, other bytes: a manifest read before the pack was replaced
    for head, reads in ((raw, 0), (bytes(other), 1), (raw[:-1], 1), (None, 1)):
        before = store.proxy.count("GET", f"/{BUCKET}/{tmp_path.name}/p.shards/{MANIFEST_NAME}")
        opened = _open(store, url, tmp_path / "cache", head=head)
        assert opened.manifest == _manifest(packs["a"])
        assert store.proxy.count("GET", f"/{BUCKET}/{tmp_path.name}/p.shards/{MANIFEST_NAME}") - before == reads


def test_an_index_damaged_on_the_store_is_given_back_never_kept(store, packs, tmp_path):
    """Its sha256 is not the manifest's while the manifest is the one opened: damage, which the
    reader's index check reports; the cache never keeps it as this pack's index."""
    url = upload(store, packs["a"], BUCKET, f"{tmp_path.name}/p.shards")
    damaged = bytearray((packs["a"] / INDEX_NAME).read_bytes())
    damaged[-1] ^= 0x01  # a letter of the last record's path
    filesystem(store).pipe_file(f"{BUCKET}/{tmp_path.name}/p.shards/{INDEX_NAME}", bytes(damaged))
    opened = _open(store, url, tmp_path / "cache")
    assert opened.index == bytes(damaged) and opened.manifest == _manifest(packs["a"])
    assert BlockCache(tmp_path / "cache").entries() == []


def _shard_missing(fs, where: str, packs: dict[str, Path]) -> tuple[type, str]:
    fs.rm(f"{where}/shard-00001.bin")
    return PackFormatError, "/shard-00001.bin: shard missing; the pack is incomplete, upload it again"


def _shard_truncated(fs, where: str, packs: dict[str, Path]) -> tuple[type, str]:
    data = (packs["a"] / "shard-00001.bin").read_bytes()
    fs.pipe_file(f"{where}/shard-00001.bin", data[:-10])
    return PackFormatError, (f"/shard-00001.bin: {len(data) - 10} bytes, the manifest says {len(data)}; the shard is "
                             "truncated or changed, upload it again")


def _index_missing(fs, where: str, packs: dict[str, Path]) -> tuple[type, str]:
    fs.rm(f"{where}/{INDEX_NAME}")
    return PackFormatError, f"/{INDEX_NAME}: missing; the pack is incomplete, upload it again"


def _index_longer(fs, where: str, packs: dict[str, Path]) -> tuple[type, str]:
    data = (packs["a"] / INDEX_NAME).read_bytes()
    fs.pipe_file(f"{where}/{INDEX_NAME}", data + b"\0")
    return PackFormatError, f"/{INDEX_NAME}: {len(data) + 1} bytes, the manifest says {len(data)}; the pack is damaged"


def _lmdb_manifest(fs, where: str, packs: dict[str, Path]) -> tuple[type, str]:
    with PackReader(packs["a.lmdb"]) as lmdb:  # a whole manifest, of an LMDB pack
        fs.pipe_file(f"{where}/{MANIFEST_NAME}", json.dumps(lmdb.manifest).encode())
    return PackFormatError, f"/{MANIFEST_NAME}: manifest is for an LMDB pack"


def _no_pack(fs, where: str, packs: dict[str, Path]) -> tuple[type, str]:
    fs.rm(where, recursive=True)
    fs.pipe_file(f"{where}/notes.txt", b"mine")
    return UsageError, f": not a pack (no {MANIFEST_NAME}); give a shards folder that `pack` wrote"


@pytest.mark.parametrize("damage", [_shard_missing, _shard_truncated, _index_missing, _index_longer, _lmdb_manifest,
                                    _no_pack], ids=lambda f: f.__name__.strip("_").replace("_", " "))
def test_what_is_missing_or_not_as_the_manifest_says_is_named(store, packs, tmp_path, damage: Callable):
    url = upload(store, packs["a"], BUCKET, f"{tmp_path.name}/p.shards")
    kind, says = damage(filesystem(store), f"{BUCKET}/{tmp_path.name}/p.shards", packs)
    with pytest.raises(kind) as info:
        _open(store, url, tmp_path / "cache")
    assert str(info.value) == url + says


@pytest.mark.parametrize("head", [False, True], ids=["manifest read again", "manifest read with the listing"])
def test_a_listing_of_a_pack_replaced_since_is_made_again(store, packs, tmp_path, head):
    """The listing (and the manifest read with it) are pack A's; B is there now: the reads pinned to
    A's versions are refused, and the open starts again from a new listing, reading B whole."""
    url = upload(store, packs["a"], BUCKET, f"{tmp_path.name}/p.shards")
    remote = RemoteStore(url, options(store))
    listing = remote.listing()
    upload(store, packs["b"], BUCKET, f"{tmp_path.name}/p.shards", replace=True)
    opened = open_pinned(remote, BlockCache(tmp_path / "cache", limit=1 << 24), listing,
                         (packs["a"] / MANIFEST_NAME).read_bytes() if head else None)
    assert opened.manifest == _manifest(packs["b"]) and opened.index == (packs["b"] / INDEX_NAME).read_bytes()


class Churning(RemoteStore):
    """A pack being packed again and again: right after each listing, another manifest is there."""

    def __init__(self, url: str, options: dict[str, Any], manifests: list[bytes], fs: Any) -> None:
        super().__init__(url, options)
        self.manifests, self.writer = manifests, fs
        self.listings = 0

    def listing(self) -> dict[str, int]:
        sizes = super().listing()
        self.listings += 1
        self.writer.pipe_file(f"{self.full(MANIFEST_NAME)}", self.manifests[self.listings % 2])
        return sizes


def test_a_pack_that_keeps_changing_while_it_is_opened_is_given_up_on(store, packs, tmp_path):
    url = upload(store, packs["a"], BUCKET, f"{tmp_path.name}/p.shards")
    remote = Churning(url, options(store), [(packs[n] / MANIFEST_NAME).read_bytes() for n in "ab"],
                      filesystem(store))
    listing = remote.listing()
    with pytest.raises(PackChangedError) as info:
        open_pinned(remote, BlockCache(tmp_path / "cache", limit=1 << 24), listing, None)
    assert remote.listings - 1 == OPEN_ATTEMPTS  # each try after the first starts from a new listing
    assert str(info.value) == (f"{url}: the pack changed while it was being opened (it is being packed again?); "
                               "open it again once it is written")
