"""Packs at a URL through the loaders: a DataLoader with worker processes and a prefetching
PackSampler, the sampler's announcements fetching ahead of the reads, and PackLoader's batches."""

from __future__ import annotations

import multiprocessing
from concurrent import futures

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[dev]')")
pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")

from packload.loaders.dataset import PackedImageFolder  # noqa: E402
from packload.loaders.pack_loader import PackLoader  # noqa: E402
from packload.loaders.read_cache import BlockCache  # noqa: E402
from packload.loaders.sampler import PackSampler  # noqa: E402
from packload.packer.encode import EncodeOptions  # noqa: E402
from packload.packer.pipeline import pack  # noqa: E402
from tests.image_factory import make_image_folder  # noqa: E402
from tests.object_store import ObjectStore  # noqa: E402

BUCKET = "bkt-loaders"  # moto keeps one store per process: a bucket of this file's own
SHARD = "/" + BUCKET + "/p.shards/shard-"


@pytest.fixture(scope="module")
def store():
    with ObjectStore() as s:
        s.make_bucket(BUCKET)
        yield s


@pytest.fixture(scope="module")
def packs(tmp_path_factory, store):
    """A JPEG/PNG shards pack and a raw 64x64 one, local and uploaded, several shards each."""
    root = tmp_path_factory.mktemp("remote-loaders")
    make_image_folder(root / "src", classes=("cat", "dog", "emu"), per_class=16)
    pack(root / "src", root / "p.shards", shard_size=1 << 16, progress=False)
    pack(root / "src", root / "raw.shards", shard_size=1 << 16, progress=False,
         options=EncodeOptions(encoding="raw", size=(64, 64)))
    fs = store.filesystem()
    for name in ("p.shards", "raw.shards"):
        fs.put(str(root / name), f"{BUCKET}/{name}", recursive=True)
    return root


def _first(batch):
    return batch


@pytest.fixture
def fresh_filesystems():
    """fsspec keeps one filesystem per set of options: one made for this file's server through the
    environment must not serve another test's URL afterwards."""
    import s3fs  # noqa: PLC0415

    s3fs.S3FileSystem.clear_instance_cache()
    yield
    s3fs.S3FileSystem.clear_instance_cache()


def _url_env(monkeypatch, store, cache, limit: int) -> None:
    """Endpoint, cache folder and limit from the environment, as a user without options sets them:
    every reader (the sampler's, each worker's) then agrees on them."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", store.proxy.endpoint)
    monkeypatch.setenv("PACKLOAD_CACHE", str(cache))
    monkeypatch.setenv("PACKLOAD_CACHE_LIMIT", str(limit))


@pytest.mark.parametrize("limit_blocks", [None, 1])
def test_two_workers_read_every_sample_once_through_the_shared_cache(store, packs, tmp_path, monkeypatch,
                                                                     fresh_filesystems, limit_blocks):
    url = f"s3://{BUCKET}/p.shards"
    local = PackedImageFolder(packs / "p.shards", output="bytes")
    shard_bytes = sum(f.stat().st_size for f in (packs / "p.shards").glob("shard-*"))
    biggest = max(f.stat().st_size for f in (packs / "p.shards").glob("shard-*"))
    index = (packs / "p.shards" / "index.bin").stat().st_size
    # Unbounded: the whole pack fits. Bounded: the index and one shard (one 8 MiB block per shard
    # here), so the two shards cannot both stay: blocks are evicted as the epoch goes on.
    limit = 1 << 30 if limit_blocks is None else limit_blocks * biggest + index + 1000
    assert limit_blocks is None or shard_bytes + index > limit
    cache = tmp_path / "cache"
    _url_env(monkeypatch, store, cache, limit)
    ds = PackedImageFolder(url, output="bytes")
    assert ds.reader().ranged
    sampler = PackSampler(len(ds), shuffle=True, seed=3, prefetch=url)
    order = list(PackSampler(len(ds), shuffle=True, seed=3))  # the same order, nothing announced
    before = store.proxy.count("GET", SHARD)
    loader = DataLoader(ds, batch_size=5, sampler=sampler, num_workers=2, collate_fn=_first,
                        multiprocessing_context=multiprocessing.get_context("fork"))
    got = [item for batch in loader for item in batch]
    assert len(got) == len(local) == 48
    assert sorted(order) == list(range(len(local)))  # every sample once ...
    assert got == [local[i] for i in order]  # ... in the sampler's order, the local pack's bytes
    fetched = store.proxy.count("GET", SHARD) - before
    used = BlockCache(cache).used()
    assert used <= limit
    if limit_blocks is None:
        # Three processes read (the sampler's and two workers), and each block came over once.
        shards = len(list((packs / "p.shards").glob("shard-*")))
        assert fetched == shards
        assert used >= shard_bytes
    else:
        assert fetched >= len(list((packs / "p.shards").glob("shard-*")))


def test_sampler_announcements_fetch_before_the_reads(store, packs, tmp_path):
    ds = PackedImageFolder(f"s3://{BUCKET}/p.shards", output="bytes", cache_dir=tmp_path,
                           storage_options=store.options)
    local = PackedImageFolder(packs / "p.shards", output="bytes")
    sampler = ds.sampler(seed=5)  # announces through this dataset's reader
    before = store.proxy.count("GET", SHARD)
    walk = iter(sampler)
    first = [next(walk) for _ in range(10)]  # what the sampler handed out: announced, not read
    pack_of_url = ds.reader()._pack
    futures.wait(list(pack_of_url._ahead.values()))
    announced = store.proxy.count("GET", SHARD) - before
    assert announced > 0  # requests went out with no read asked for
    assert ds.__getitems__(first) == [local[i] for i in first]
    assert store.proxy.count("GET", SHARD) - before == announced  # the reads found them cached


def test_pack_loader_batches_equal_the_local_packs(store, packs, tmp_path):
    for name, crop in (("p.shards", 12), ("raw.shards", None)):
        remote = PackedImageFolder(f"s3://{BUCKET}/{name}", cache_dir=tmp_path / name, storage_options=store.options)
        local = PackedImageFolder(packs / name)
        got = list(PackLoader(remote, 7, sampler=remote.sampler(seed=2), crop=crop, threads=2))
        want = list(PackLoader(local, 7, sampler=local.sampler(seed=2), crop=crop, threads=2))
        assert len(got) == len(want) == 7
        for (images, labels), (images_local, labels_local) in zip(got, want, strict=True):
            assert torch.equal(labels, labels_local)
            assert images.shape == images_local.shape and torch.equal(images, images_local)
        # By blocks: no whole shard joined in memory for the raw gather or the crops.
        assert not remote.reader()._pack._whole
        assert np.unique(remote.reader().entries["part"]).size > 1
