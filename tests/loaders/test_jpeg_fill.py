"""A batch's JPEGs decoded, cropped, resized and mirrored in one native call (``loaders/jpeg_fill.py``):
the batches are bit-exact those of the one-by-one route (simplejpeg, then the resize kernel) for
JPEGs of every kind PIL writes (odd sizes, every chroma subsampling, greyscale, progressive,
restart markers, large ones decoded at a reduced scale), for ``CenterCrop`` and
``RandomResizedCrop`` with flips, and PackLoader's batches stay the same; what the batch decoder
does not take (a JPEG with damaged data, PNGs) still comes out as before."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from packload import CenterCrop, EncodeOptions, PackedImageFolder, PackLoader, RandomResizedCrop, pack
from packload.core import jpeg_kernel
from packload.loaders import jpeg_fill
from packload.loaders.decode import fast_jpeg_available
from packload.loaders.random_crop import Draws
from tests.image_factory import textured_rgb

needs_decoder = pytest.mark.skipif(not jpeg_kernel.available() or not fast_jpeg_available(),
                                   reason=f"compiled batch decoder not in use: {jpeg_kernel.unavailable_reason()}")

# (width, height, PIL save options): every subsampling, greyscale, progressive, restarts, odd and tiny sizes
KINDS = [
    ((64, 48), {"subsampling": 2, "quality": 85}),  # 4:2:0
    ((61, 47), {"subsampling": 1, "quality": 90}),  # 4:2:2, odd sides
    ((50, 70), {"subsampling": 0, "quality": 95}),  # 4:4:4, portrait
    ((300, 220), {"subsampling": 2, "quality": 80}),  # decoded at a reduced scale
    ((523, 401), {"subsampling": 2, "quality": 75, "progressive": True}),
    ((97, 131), {"subsampling": 2, "quality": 88, "restart_marker_blocks": 2}),
    ((7, 5), {"quality": 90}),  # smaller than any crop
    ((33, 200), {"subsampling": 1, "quality": 70, "optimize": True}),  # long and thin
]


def _jpeg(size: tuple[int, int], seed: int, mode: str = "RGB", **options: object) -> bytes:
    image = Image.fromarray(textured_rgb(size, seed))
    buffer = io.BytesIO()
    (image.convert("L") if mode == "L" else image).save(buffer, "JPEG", **options)
    return buffer.getvalue()


def _damaged(data: bytes) -> bytes:
    """A JPEG whose entropy-coded data has a few bytes changed (end marker kept): libjpeg-turbo warns."""
    out = bytearray(data)
    start = out.index(b"\xff\xda") + 40
    for k in range(start, start + 30, 3):
        out[k] = 0xFF if out[k] != 0xFF else 0x00
    return bytes(out)


@pytest.fixture(scope="module")
def jpeg_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("jpeg-fill")
    for k, (size, options) in enumerate(KINDS * 3):
        folder = root / "images" / ("a" if k % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{k:02d}.jpg").write_bytes(_jpeg(size, k, **options))
    (root / "images" / "a" / "grey.jpg").write_bytes(_jpeg((80, 60), 99, mode="L"))
    (root / "images" / "b" / "damaged.jpg").write_bytes(_damaged(_jpeg((120, 90), 98, quality=90)))
    Image.fromarray(textured_rgb((40, 30), 97)).save(root / "images" / "a" / "plain.png")
    pack(root / "images", root / "p.shards", options=EncodeOptions(encoding="keep"), workers=1, progress=False)
    return root / "p.shards"


@needs_decoder
def test_an_lmdb_packs_batches_are_the_same_too(jpeg_pack: Path, tmp_path: Path, counted: list[int]) -> None:
    from tests.reliability.packs import pack_small

    lmdb_pack = tmp_path / "p.lmdb"
    pack_small(jpeg_pack.parent / "images", lmdb_pack, options=EncodeOptions(encoding="keep"))  # small chunks
    ds = PackedImageFolder(lmdb_pack)
    assert len(np.unique(ds.reader().entries["part"])) > 1, "records spread over several chunks"
    indices = np.arange(len(ds))[::-1].copy()
    for crop in (CenterCrop(40), RandomResizedCrop(36, flip=0.5)):
        (on, _), (off, _) = _both(lambda crop=crop: ds.get_batch(indices, True, crop=crop, flip=crop.flip
                                                                 if isinstance(crop, RandomResizedCrop) else 0.0))
        assert torch.equal(on, off)
    assert counted and min(counted) > len(ds) // 2


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The records the batch decoder did, per call (it is still called for real)."""
    calls: list[int] = []
    real = jpeg_kernel.decode_boxes

    def counting(*args: object, **kwargs: object) -> np.ndarray:
        done = real(*args, **kwargs)
        calls.append(int(done.sum()))
        return done

    monkeypatch.setattr(jpeg_kernel, "decode_boxes", counting)
    return calls


def _both(build: object) -> tuple[torch.Tensor, torch.Tensor]:
    """``build()`` with the batch decoder on, then off (one image at a time through simplejpeg)."""
    on = build()
    jpeg_kernel.set_enabled(False)
    try:
        off = build()
    finally:
        jpeg_kernel.set_enabled(True)
    return on, off


CROPS = [CenterCrop(24), CenterCrop(64), CenterCrop(160, ratio=1.0), RandomResizedCrop(32, flip=0.5),
         RandomResizedCrop(56, dct_scale=False, flip=1.0), RandomResizedCrop(112, scale=(0.5, 1.0))]


@needs_decoder
@pytest.mark.parametrize("crop", CROPS, ids=repr)
def test_batches_are_bit_exact_those_of_the_one_by_one_route(jpeg_pack: Path, crop: object,
                                                             counted: list[int]) -> None:
    ds = PackedImageFolder(jpeg_pack)
    indices = np.arange(len(ds))
    flip = getattr(crop, "flip", 0.0)
    for epoch in (0, 1):
        (on, labels_on), (off, labels_off) = _both(lambda epoch=epoch: ds.get_batch(
            indices, True, crop=crop, flip=flip, draws=Draws(seed=3, epoch=epoch)))
        assert torch.equal(labels_on, labels_off)
        assert on.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(on, off), f"{crop}: pixels differ from the one-by-one route"
    names = [Path(ds.path(i)).name for i in range(len(ds))]
    jpegs = sum(name.endswith(".jpg") for name in names)
    assert counted and max(counted) >= jpegs - 2 - len(KINDS), "the batch decoder did most JPEGs"
    assert max(counted) < jpegs, "the damaged JPEG was left to the one-by-one route"


@needs_decoder
def test_fast_idct_matches_too(jpeg_pack: Path) -> None:
    ds = PackedImageFolder(jpeg_pack)
    indices = np.arange(len(ds))
    for crop in (CenterCrop(48), RandomResizedCrop(40)):
        (on, _), (off, _) = _both(lambda crop=crop: ds.get_batch(indices, True, crop=crop, fast_idct=True))
        assert torch.equal(on, off)


@needs_decoder
def test_pack_loader_gives_the_same_batches_and_resumes(jpeg_pack: Path) -> None:
    ds = PackedImageFolder(jpeg_pack)

    def epoch(state: dict | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        loader = PackLoader(ds, 5, sampler=ds.sampler(seed=7), crop=RandomResizedCrop(40), flip=True, threads=2)
        if state is not None:
            loader.load_state_dict(state)
        with loader:
            return [(images.clone(), labels) for images, labels in loader]

    on, off = _both(epoch)
    assert len(on) == len(off) == -(-len(ds) // 5)
    for (a, la), (b, lb) in zip(on, off, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
    loader = PackLoader(ds, 5, sampler=ds.sampler(seed=7), crop=RandomResizedCrop(40), flip=True, threads=2)
    with loader:
        it = iter(loader)
        next(it), next(it)
        state = loader.state_dict()
    resumed = epoch(state)
    for (a, la), (b, lb) in zip(resumed, on[2:], strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)


@needs_decoder
def test_only_jpegs_are_done_and_nothing_where_the_decoder_is_off(jpeg_pack: Path) -> None:
    ds = PackedImageFolder(jpeg_pack)
    reader = ds.reader()
    names = [Path(ds.path(i)).name for i in range(len(ds))]
    records = np.array([names.index("00.jpg"), names.index("plain.png"), names.index("01.jpg")])
    out = torch.zeros((3, 3, 16, 16), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    entries = reader.entries[records]
    zeros, full = np.zeros(3, dtype=np.int64), np.full(3, 8)
    # each image's corner, at most 2x the slot (the kernel's limit)
    corner = np.stack([zeros, zeros, np.minimum(entries["height"], 32), np.minimum(entries["width"], 32)], axis=1)
    mirror, raw = np.array([True, False, False]), np.zeros(3, dtype=bool)
    jpeg_kernel.set_enabled(False)
    try:
        assert not jpeg_fill.fill_jpegs(reader, records, np.arange(3), full, corner, out, mirror, False, raw).any()
    finally:
        jpeg_kernel.set_enabled(True)
    assert not out.any()
    done = jpeg_fill.fill_jpegs(reader, records, np.arange(3), full, corner, out, mirror, False, raw)
    assert done.tolist() == [True, False, True]
    assert out[0].any() and out[2].any() and not out[1].any()
    unmirrored = torch.zeros_like(out)
    jpeg_fill.fill_jpegs(reader, records, np.arange(3), full, corner, unmirrored, ~mirror & False, False, raw)
    assert torch.equal(out[0], unmirrored[0].flip(2)) and torch.equal(out[2], unmirrored[2])


def test_payload_addresses_point_at_the_payloads(jpeg_pack: Path) -> None:
    reader = PackedImageFolder(jpeg_pack).reader()
    records = np.array([5, 0, 3])
    addresses, lengths = jpeg_fill.payload_addresses(reader, records, [])
    for address, length, view in zip(addresses.tolist(), lengths.tolist(), reader.payloads(records), strict=True):
        assert length == len(view)
        assert address == np.frombuffer(view, np.uint8).ctypes.data


@needs_decoder
@pytest.mark.parametrize("crop", [RandomResizedCrop(24, flip=0.5), RandomResizedCrop(40, scale=(0.3, 1.0), flip=1.0)],
                         ids=repr)
def test_raw_boxes_are_resized_from_the_map_in_the_same_call(tmp_path: Path, crop: RandomResizedCrop,
                                                             counted: list[int]) -> None:
    for k, size in enumerate([(50, 40), (33, 61), (64, 64), (7, 9), (120, 90)] * 2):
        folder = tmp_path / "images" / ("a" if k % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(textured_rgb(size, k)).save(folder / f"{k}.png")
    pack(tmp_path / "images", tmp_path / "raw.shards", options=EncodeOptions(encoding="raw"), workers=1,
         progress=False)
    ds = PackedImageFolder(tmp_path / "raw.shards")
    indices = np.arange(len(ds))
    (on, _), (off, _) = _both(lambda: ds.get_batch(indices, True, crop=crop, flip=crop.flip, draws=Draws(seed=5)))
    assert torch.equal(on, off)
    assert counted and counted[0] >= len(ds) // 2, "the batch decoder resized the raw boxes"
