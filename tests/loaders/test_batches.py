"""Whole-batch reads (``get_batch``, ``batch_loader``) give exactly what the per-sample path gives."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from packload import ChecksumError, EncodeOptions, PackedImageFolder, PackReader, batch_loader, pack
from packload.loaders.transforms import ResizeCenterCrop
from tests.image_factory import make_image_folder, write_odd_images

BACKENDS = ("p.lmdb", "p.shards")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    make_image_folder(root, classes=("a", "b", "c"), per_class=7, seed=9)
    write_odd_images(root / "b")
    return root


@pytest.fixture(scope="module", params=BACKENDS)
def raw_pack(request, source, tmp_path_factory):
    dst = tmp_path_factory.mktemp("raw") / request.param
    pack(source, dst, options=EncodeOptions(encoding="raw", size=(12, 10)), workers=1, progress=False,
         shard_size=1 << 16)
    return dst


def per_sample(ds: PackedImageFolder, indices: list[int]) -> np.ndarray:
    return np.stack([np.asarray(ds[i][0]).transpose(2, 0, 1) for i in indices])


@pytest.mark.parametrize("channels_last", [False, True])
def test_raw_batch_equals_per_sample_path(raw_pack, channels_last):
    ds = PackedImageFolder(raw_pack, output="numpy")
    indices = [5, 0, len(ds) - 1, 3, 3, -2]
    images, labels = ds.get_batch(indices, channels_last=channels_last)
    assert images.dtype == torch.uint8 and images.shape == (6, 3, 12, 10)
    assert images.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    assert np.array_equal(images.numpy(), per_sample(ds, indices))
    assert labels.tolist() == [ds.targets[i] for i in indices]


def test_encoded_batch_goes_through_transform(source, tmp_path):
    pack(source, tmp_path / "k.shards", workers=1, progress=False)
    crop = ResizeCenterCrop(16)
    ds = PackedImageFolder(tmp_path / "k.shards", transform=crop)
    images, labels = ds.get_batch([0, 4, 9])
    plain = PackedImageFolder(tmp_path / "k.shards")
    want = np.stack([crop(plain[i][0]).transpose(2, 0, 1) for i in (0, 4, 9)])
    assert np.array_equal(images.numpy(), want)
    with pytest.raises(ValueError, match="one size"):
        PackedImageFolder(tmp_path / "k.shards").get_batch([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])


def test_raw_images_of_different_sizes_are_refused(source, tmp_path):
    pack(source, tmp_path / "r.lmdb", options=EncodeOptions(encoding="raw"), workers=1, progress=False)
    ds = PackedImageFolder(tmp_path / "r.lmdb")
    with pytest.raises(ValueError, match="--size"):
        ds.get_batch(list(range(len(ds))))


def test_out_of_range_index(raw_pack):
    ds = PackedImageFolder(raw_pack)
    with pytest.raises(IndexError, match="out of range"):
        ds.get_batch([0, len(ds)])


@pytest.mark.parametrize("workers", [0, 2])
def test_batch_loader_covers_an_epoch_in_sampler_order(raw_pack, workers):
    ds = PackedImageFolder(raw_pack)
    sampler = ds.sampler(shuffle=True, seed=3)
    loader = batch_loader(ds, 8, sampler=sampler, num_workers=workers)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        batches = list(loader)
        order = sampler.epoch_order(epoch).tolist()
        assert [len(labels) for _, labels in batches] == [8] * (len(ds) // 8) + ([len(ds) % 8] if len(ds) % 8 else [])
        got = torch.cat([images for images, _ in batches]).numpy()
        assert np.array_equal(got, per_sample(ds, order))
        assert torch.cat([labels for _, labels in batches]).tolist() == [ds.targets[i] for i in order]


def test_damaged_raw_record(raw_pack, tmp_path):
    copy = tmp_path / raw_pack.name
    if raw_pack.is_dir():
        import shutil

        shutil.copytree(raw_pack, copy)
    else:
        copy.write_bytes(raw_pack.read_bytes())
    with PackReader(copy) as reader:
        entry = reader.entries[2]
        view = reader.part_view(int(entry["part"]))
        start = int(entry["payload_offset"])
        # find the byte's place in the file: for shards it is the offset; for LMDB search the bytes
        needle = bytes(view[start : start + 64])
        path_in_pack = reader.path_of(2)
    target = copy / reader.part_names[int(entry["part"])] if copy.is_dir() else copy
    data = bytearray(target.read_bytes())
    at = data.index(needle) + 10
    data[at] ^= 0xFF
    target.write_bytes(bytes(data))
    strict = PackedImageFolder(copy, verify=True)
    with pytest.raises(ChecksumError, match=path_in_pack):
        strict.get_batch([1, 2, 3])
    lenient = PackedImageFolder(copy, verify=True, on_error="skip")
    with pytest.warns(UserWarning, match="skipping damaged"):
        images, _ = lenient.get_batch([1, 2, 3])
    clean = PackedImageFolder(raw_pack)
    assert np.array_equal(images.numpy(), clean.get_batch([1, 3, 3])[0].numpy())


def test_close_lets_go_and_reading_reopens(raw_pack):
    ds = PackedImageFolder(raw_pack, output="numpy")
    first = ds[0][0].copy()
    reader = ds.reader()
    ds.close()
    assert reader.closed
    assert np.array_equal(ds[0][0], first)  # reopened on demand
    ds.reader().close()  # closed behind the dataset's back: still reopens
    assert np.array_equal(ds[0][0], first)


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_loader_encoded_hands_over_the_stored_bytes(source, tmp_path, backend):
    """``encoded=True``: each batch crosses from a worker as (data, offsets, labels), holding every
    record's stored bytes in the sampler's order, the same as the per-sample path gives."""
    pack(source, tmp_path / backend, workers=1, progress=False)
    ds = PackedImageFolder(tmp_path / backend, output="bytes")
    sampler = ds.sampler(shuffle=True, seed=4)
    loader = batch_loader(PackedImageFolder(tmp_path / backend), 5, sampler=sampler, encoded=True, num_workers=2)
    got = []
    for data, offsets, labels in loader:
        assert data.dtype == torch.uint8 and offsets.dtype == labels.dtype == torch.int64
        assert offsets[0] == 0 and offsets[-1] == len(data) and len(offsets) == len(labels) + 1
        got += [(bytes(data[a:b].numpy()), int(label)) for a, b, label in
                zip(offsets[:-1].tolist(), offsets[1:].tolist(), labels.tolist(), strict=True)]
    assert got == [ds[i] for i in sampler.epoch_order().tolist()]
    with pytest.raises(ValueError, match="crop"):
        batch_loader(ds, 4, encoded=True, crop=8)


def test_batch_loader_batches_say_they_are_split_by_rank(raw_pack):
    """Lightning leaves a DistributedSampler alone and calls its set_epoch: batch_loader's batch
    sampler is one when its sampler is, and forwards set_epoch to it."""
    from torch.utils.data import BatchSampler, DistributedSampler, SequentialSampler

    from packload.loaders.batches import RankBatchSampler

    ds = PackedImageFolder(raw_pack)
    sampler = ds.sampler(rank=1, world_size=2, seed=4)
    loader = batch_loader(ds, 4, sampler=sampler)
    assert isinstance(loader.sampler, RankBatchSampler) and isinstance(loader.sampler, DistributedSampler)
    assert (loader.sampler.num_replicas, loader.sampler.rank, loader.sampler.seed) == (2, 1, 4)
    assert loader.sampler.num_samples == len(sampler) and loader.sampler.total_size == sampler.total_size
    loader.sampler.set_epoch(5)
    assert sampler.epoch == loader.sampler.epoch == 5
    got = [i for images, labels in loader for i in labels.tolist()]
    assert got == [ds.targets[i] for i in sampler.epoch_order(5)]
    plain = batch_loader(ds, 4, sampler=SequentialSampler(range(len(ds))))
    assert type(plain.sampler) is BatchSampler  # not split by rank: a framework may split it
