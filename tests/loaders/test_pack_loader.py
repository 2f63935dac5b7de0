"""``PackLoader`` and ``CenterCrop``: the thread-built fast path gives what the drop-in path gives,
in the sampler's order, with resume and rank split."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from packload import CenterCrop, EncodeOptions, PackedImageFolder, PackFormatError, PackLoader, pack
from packload.loaders.collate import collate_uint8
from tests.image_factory import make_image_folder, write_image, write_odd_images


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    make_image_folder(root, classes=("a", "b", "c"), per_class=9, seed=4)
    write_odd_images(root / "c")
    for k in range(4):  # larger JPEGs, so that a 24-pixel crop decodes them at a reduced DCT scale
        write_image(root / "b" / f"big_{k}.jpg", size=(160 + 16 * k, 120), seed=50 + k, quality=92)
    return root


@pytest.fixture(scope="module", params=["p.shards", "p.lmdb"])
def backend(request):
    return request.param


@pytest.fixture(scope="module")
def packs(source, tmp_path_factory, backend):
    out = tmp_path_factory.mktemp("packs")
    made = {}
    for name, options in {"raw": EncodeOptions(encoding="raw", size=(12, 10)), "png": EncodeOptions(encoding="png"),
                          "keep": EncodeOptions()}.items():
        made[name] = out / f"{name}-{backend}"
        pack(source, made[name], options=options, workers=1, progress=False, shard_size=1 << 16,
             backend="lmdb" if backend.endswith("lmdb") else "shards")
    return made


def drop_in_batches(ds: PackedImageFolder, sampler, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    loader = DataLoader(ds, batch_size=batch_size, sampler=sampler, collate_fn=collate_uint8)
    return list(loader)


@pytest.mark.parametrize("threads", [0, 2])
def test_raw_batches_equal_the_drop_in_path_in_sampler_order(packs, threads):
    fast = PackedImageFolder(packs["raw"])
    slow = PackedImageFolder(packs["raw"], output="numpy")
    loader = PackLoader(fast, 8, sampler=fast.sampler(seed=5), threads=threads)
    for epoch in range(2):
        loader.set_epoch(epoch)
        sampler = slow.sampler(seed=5)
        sampler.set_epoch(epoch)
        want = drop_in_batches(slow, sampler, 8)
        got = list(loader)
        assert len(got) == len(want) == len(loader)
        for (images, labels), (want_images, want_labels) in zip(got, want, strict=True):
            assert images.dtype == torch.uint8 and images.shape[1:] == (3, 12, 10)
            assert images.is_contiguous(memory_format=torch.channels_last)
            assert torch.equal(images, want_images) and torch.equal(labels, want_labels)


@pytest.mark.parametrize("threads", [1, 3])
def test_cropped_png_batches_are_pixel_identical_to_the_transform(packs, threads):
    crop = CenterCrop(24)
    fast = PackedImageFolder(packs["png"])
    slow = PackedImageFolder(packs["png"], transform=crop)
    got = list(PackLoader(fast, 5, sampler=fast.sampler(seed=1), crop=crop, threads=threads, channels_last=False))
    want = drop_in_batches(slow, slow.sampler(seed=1), 5)
    assert [len(labels) for _, labels in got] == [len(labels) for _, labels in want]
    for (images, labels), (want_images, want_labels) in zip(got, want, strict=True):
        assert images.is_contiguous() and images.shape[1:] == (3, 24, 24)
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)


@pytest.fixture(scope="module")
def sized_packs(source, tmp_path_factory, backend):
    """Raw (images of many sizes) and re-encoded JPEG packs, for the per-format fast crop routes."""
    out = tmp_path_factory.mktemp("sized")
    made = {}
    for name, options in {"raw": EncodeOptions(encoding="raw"), "jpeg": EncodeOptions(encoding="jpeg", quality=90)}.items():
        made[name] = out / f"{name}-{backend}"
        pack(source, made[name], options=options, workers=1, progress=False, shard_size=1 << 16,
             backend="lmdb" if backend.endswith("lmdb") else "shards")
    return made


@pytest.mark.parametrize("encoding", ["raw", "jpeg"])
@pytest.mark.parametrize("threads, channels_last, exif", [(0, True, False), (2, True, True), (2, False, False)])
def test_cropped_raw_and_jpeg_batches_are_pixel_identical_to_the_transform(sized_packs, encoding, threads,
                                                                            channels_last, exif):
    """Squares read straight from the map or decoded into one reused buffer: the drop-in path's pixels
    (a crop that enlarges every image, so no JPEG is decoded at a reduced scale)."""
    crop = CenterCrop(112)
    fast = PackedImageFolder(sized_packs[encoding], exif_transpose=exif)
    slow = PackedImageFolder(sized_packs[encoding], transform=crop, exif_transpose=exif)
    got = list(PackLoader(fast, 6, sampler=fast.sampler(seed=3), crop=crop, threads=threads,
                          channels_last=channels_last))
    want = drop_in_batches(slow, slow.sampler(seed=3), 6)
    assert len(got) == len(want)
    for (images, labels), (want_images, want_labels) in zip(got, want, strict=True):
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)


def test_fast_idct_stays_within_a_level_or_two(sized_packs):
    crop = CenterCrop(112)
    ds = PackedImageFolder(sized_packs["jpeg"])
    order = list(range(len(ds)))
    exact = ds.get_batch(order, crop=crop)[0].numpy().astype(np.int16)
    fast = torch.cat([images for images, _ in PackLoader(ds, 8, sampler=ds.sampler(shuffle=False), crop=crop,
                                                          threads=2, channels_last=False, fast_idct=True)])
    diff = np.abs(fast.numpy().astype(np.int16) - exact)
    assert diff.mean() < 2.0  # the documented "about one level"


@pytest.mark.parametrize("threads", [0, 2])
def test_batches_kept_by_the_loop_are_never_overwritten(sized_packs, threads):
    """PackLoader reuses the memory of batches the loop let go of; anything still held stays intact."""
    ds = PackedImageFolder(sized_packs["raw"])
    loader = PackLoader(ds, 4, crop=CenterCrop(40), threads=threads)
    kept, copies, pointers = [], [], []
    for epoch in range(3):
        loader.set_epoch(epoch)
        for step, (images, _) in enumerate(loader):
            pointers.append(images.data_ptr())
            held = {0: images, 1: images[-1], 2: images.numpy()}.get(step % 4)
            if held is not None:
                kept.append(held)
                copies.append(held.numpy().copy() if isinstance(held, torch.Tensor) else held.copy())
    for held, copy in zip(kept, copies, strict=True):
        assert np.array_equal(held.numpy() if isinstance(held, torch.Tensor) else held, copy)
    assert len(set(pointers)) < len(pointers)  # and the others were reused


def test_cropped_jpegs_match_a_full_decode_within_tolerance(packs):
    """Reduced-scale decoding (and libjpeg-turbo instead of PIL) changes JPEG pixels a little."""
    crop = CenterCrop(24)
    fast = PackedImageFolder(packs["keep"])
    slow = PackedImageFolder(packs["keep"], transform=crop, fast_jpeg=False)
    order = list(range(len(fast)))
    images, labels = fast.get_batch(order, crop=crop)
    want = np.stack([slow[i][0].transpose(2, 0, 1) for i in order])
    diff = np.abs(images.numpy().astype(np.int16) - want.astype(np.int16))
    jpeg = [i for i in order if fast.reader().format_of(i) == "JPEG"]
    assert labels.tolist() == fast.targets
    assert len(jpeg) >= 10 and diff[jpeg].mean() < 3.0  # the documented tolerance
    lossless = [i for i in order if fast.reader().format_of(i) == "PNG"]
    assert lossless and not diff[lossless].any()


def test_resume_continues_with_the_remaining_batches(packs):
    ds = PackedImageFolder(packs["raw"])
    whole = [labels for _, labels in PackLoader(ds, 4, sampler=ds.sampler(seed=2), threads=2)]
    first = PackLoader(ds, 4, sampler=ds.sampler(seed=2), threads=2)
    it = iter(first)
    seen = [next(it)[1] for _ in range(3)]
    state = first.state_dict()
    assert state["position"] == 12
    resumed = PackLoader(ds, 4, sampler=ds.sampler(seed=2), threads=2)
    resumed.load_state_dict(state)
    rest = [labels for _, labels in resumed]
    assert torch.equal(torch.cat(seen + rest), torch.cat(whole))
    assert len(rest) == len(whole) - 3


def test_ranks_get_disjoint_equal_shares(packs):
    ds = PackedImageFolder(packs["raw"])
    shares = []
    for rank in range(2):
        sampler = ds.sampler(seed=0, rank=rank, world_size=2, uneven="pad")
        images = torch.cat([im for im, _ in PackLoader(ds, 4, sampler=sampler, threads=1)])
        shares.append(images)
    assert shares[0].shape == shares[1].shape
    everything = torch.cat(shares).reshape(len(shares[0]) * 2, -1)
    assert len({bytes(row.numpy()) for row in everything}) >= len(ds) - 1  # padding repeats at most one


def test_drop_last_and_len(packs):
    ds = PackedImageFolder(packs["raw"])
    loader = PackLoader(ds, 7, drop_last=True, threads=1)
    batches = list(loader)
    assert len(batches) == len(loader) == len(ds) // 7
    assert all(len(labels) == 7 for _, labels in batches)


def test_bad_arguments_and_sizes(packs):
    ds = PackedImageFolder(packs["png"])
    with pytest.raises(ValueError, match="batch_size"):
        PackLoader(ds, 0)
    with pytest.raises(ValueError, match="threads"):
        PackLoader(ds, 4, threads=-1)
    with pytest.raises(TypeError, match="PackedImageFolder"):
        PackLoader([1, 2, 3], 4)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="one size"):
        list(PackLoader(ds, 64, threads=1))  # images of many sizes and no crop
    if not torch.cuda.is_available():
        with pytest.warns(UserWarning, match="CUDA is not available"):
            PackLoader(ds, 4, pin_memory=True)


def test_undecodable_record_is_named_or_replaced(source, tmp_path):
    src = tmp_path / "src"
    make_image_folder(src, classes=("x", "y"), per_class=4, seed=7)
    broken = src / "y" / "img_000.jpg"
    data = bytearray(broken.read_bytes())
    data[len(data) // 2 :] = bytes(len(data) - len(data) // 2)  # the scan data zeroed: a header that lies
    broken.write_bytes(bytes(data))
    pack(src, tmp_path / "p.shards", workers=1, progress=False)
    strict = PackedImageFolder(tmp_path / "p.shards")
    names = [strict.path(i) for i in range(len(strict))]
    if "y/img_000.jpg" not in names:
        pytest.skip("the packer's check already refused the damaged file")
    where = names.index("y/img_000.jpg")
    with pytest.raises(PackFormatError, match="y/img_000.jpg"):
        strict.get_batch([where], crop=CenterCrop(16))
    lenient = PackedImageFolder(tmp_path / "p.shards", on_error="skip")
    with pytest.warns(UserWarning, match="skipping damaged"):
        images, labels = lenient.get_batch([where], crop=CenterCrop(16))
    assert images.shape == (1, 3, 16, 16) and labels.tolist() == [lenient.targets[(where + 1) % len(lenient)]]


def test_center_crop_geometry_and_transform():
    crop = CenterCrop(224)
    assert crop.window(192, 256) == (12, 44, 168)  # FFCV's geometry: int(224/256 * 192) = 168
    assert crop.decode_scale(375, 500) == pytest.approx(224 / (224 / 256 * 375))
    assert crop.decode_scale(192, 256) == 1.0  # enlarging: decode at full size
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (192, 256, 3), dtype=np.uint8))
    out = crop(image)
    assert out.shape == (224, 224, 3) and out.dtype == np.uint8
    # A PIL bilinear resize of the same square agrees closely (different rounding, same filter).
    pil = np.asarray(image.crop((44, 12, 44 + 168, 12 + 168)).resize((224, 224), Image.Resampling.BILINEAR))
    assert np.abs(out.astype(int) - pil).mean() < 2.0
    assert np.array_equal(crop(torch.from_numpy(np.array(image)).permute(2, 0, 1)), out)
    with pytest.raises(ValueError, match="ratio"):
        CenterCrop(10, ratio=1.5)
    with pytest.raises(ValueError, match="size"):
        CenterCrop(0)


def test_encoded_batches_hold_the_stored_bytes(packs):
    ds = PackedImageFolder(packs["keep"], output="bytes")
    loader = PackLoader(PackedImageFolder(packs["keep"]), 6, sampler=ds.sampler(seed=3), encoded=True, threads=2)
    order = ds.sampler(seed=3).epoch_order().tolist()
    got = []
    for data, offsets, labels in loader:
        assert data.dtype == torch.uint8 and offsets[0] == 0 and offsets[-1] == len(data)
        got += [(bytes(data[a:b].numpy()), int(label)) for a, b, label in
                zip(offsets[:-1].tolist(), offsets[1:].tolist(), labels.tolist(), strict=True)]
    assert got == [ds[i] for i in order]
    with pytest.raises(ValueError, match="crop"):
        PackLoader(ds, 4, encoded=True, crop=24)


@pytest.mark.parametrize("threads", [0, 2])
def test_packloader_announces_its_order_a_window_ahead(packs, threads):
    """With the sampler's prefetch (on by default), PackLoader announces every record of the epoch
    before it reads it, in the sampler's order, and the batches do not change."""
    ds = PackedImageFolder(packs["keep"])
    announced: list[int] = []
    reads: list[int] = []

    def announce(indices: np.ndarray) -> int:
        announced.extend(indices.tolist())
        return 0

    sampler = ds.sampler(seed=3, block_size=4, window_blocks=2, prefetch=announce)
    loader = PackLoader(ds, 5, sampler=sampler, crop=8, threads=threads)
    build = loader._build

    def build_after_announcing(indices, draws, images=None):
        assert set(indices.tolist()) <= set(announced)  # announced before it is read
        reads.extend(indices.tolist())
        return build(indices, draws, images)

    loader._build = build_after_announcing
    got = [images.clone() for images, _ in loader]
    assert sorted(announced) == list(range(len(ds))) and reads == sampler.epoch_order().tolist()
    quiet = PackLoader(ds, 5, sampler=ds.sampler(seed=3, block_size=4, window_blocks=2, prefetch=False),
                       crop=8, threads=threads)
    assert all(torch.equal(a, b) for a, b in zip(got, (images for images, _ in quiet), strict=True))


def test_copying_uses_threads_only_where_unannounced_reads_wait(packs, monkeypatch):
    """A copy-only PackLoader builds batches in the loop's thread on a local disk, and on network and
    FUSE storage (forced here as the reader is) when the sampler announces the order (the reader's
    threads then read ahead); in 4 threads there when nothing is announced, as every batch's reads
    would wait a round trip."""
    ds = PackedImageFolder(packs["keep"], parallel_reads=False)
    assert PackLoader(ds, 4, encoded=True).threads == 0
    assert PackLoader(ds, 4, encoded=True, sampler=ds.sampler(prefetch=False)).threads == 0
    ds = PackedImageFolder(packs["keep"], parallel_reads=True)
    assert PackLoader(ds, 4, encoded=True).threads == 0
    remote = PackLoader(ds, 4, encoded=True, sampler=ds.sampler(prefetch=False))
    assert remote.threads == 4 and PackLoader(ds, 4, encoded=True, threads=0).threads == 0
    local = PackLoader(ds, 4, encoded=True, threads=0)
    for (data, offsets, labels), (want_data, want_offsets, want_labels) in zip(remote, local, strict=True):
        assert torch.equal(data, want_data) and torch.equal(offsets, want_offsets) and torch.equal(labels, want_labels)
