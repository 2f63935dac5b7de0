"""Tests for loaders.PackedImageFolder as a drop-in for torchvision's ImageFolder.

Real images are written with PIL (``tests.image_factory``), packed with ``packload.pack`` into both backends,
and every record is compared with what ImageFolder's loader would give for the original file:
``Image.open(path).convert("RGB")``. torchvision is not needed; the ImageFolder order is re-derived
here from the source tree (sorted class folders, ``os.walk`` order inside each).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import packload  # noqa: E402
from packload import (  # noqa: E402
    ChecksumError,
    EncodeOptions,
    IncompletePackError,
    PackedImageFolder,
    PackFormatError,
    PackReader,
    SkippedFileError,
    UsageError,
    collate_uint8,
)
from packload.loaders.verify import verify  # noqa: E402
from tests.image_factory import (  # noqa: E402
    EXIF_ORIENTATION,
    make_image_folder,
    write_broken_files,
    write_image,
    write_odd_images,
)

BACKENDS = ["x.lmdb", "x.shards"]
LOSSLESS = ["keep", "png", "raw"]
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
CROP = 24  # every source image is at least 32 pixels on each side
BROKEN = {"dog/" + name for name in ("truncated.jpg", "truncated.png", "empty.jpg", "not_an_image.png", "bomb.png")}


# -- helpers (module level, so spawned DataLoader workers can unpickle them) -------------------------------


class CropTopLeft:
    """Crop a PIL image, HxWx3 array or 3xHxW tensor to its top-left ``size`` x ``size`` pixels."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, image: Any) -> Any:
        s = self.size
        if isinstance(image, Image.Image):
            return image.crop((0, 0, s, s))
        if isinstance(image, torch.Tensor):
            return image[:, :s, :s]
        return image[:s, :s]


class ReaderPidProbe(PackedImageFolder):
    """Returns (this process's pid, the pid its pack reader was opened in, label) for each record."""

    def __getitem__(self, index: int) -> tuple[int, int, int]:
        _, label = super().__getitem__(index)
        return os.getpid(), self.reader().pid, label


def imagefolder_samples(root: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """torchvision ImageFolder's (classes, samples) for ``root``, with relative POSIX paths."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    samples = []
    for label, name in enumerate(classes):
        for dirpath, _, filenames in sorted(os.walk(root / name, followlinks=True)):
            for filename in sorted(filenames):
                if filename.lower().endswith(IMG_EXTENSIONS):
                    samples.append(((Path(dirpath) / filename).relative_to(root).as_posix(), label))
    return classes, samples


def reference_rgb(root: Path, path: str) -> np.ndarray:
    """What ImageFolder's default loader gives for the original file, as an array."""
    with Image.open(root / path) as image:
        return np.asarray(image.convert("RGB"))


def pixels(image: Any) -> np.ndarray:
    return np.asarray(image)


# -- fixtures --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 ordinary classes (JPEG/PNG, one nested file), an ``odd`` class of unusual images, and broken
    files in ``dog`` that the packer must skip."""
    root = tmp_path_factory.mktemp("source")
    make_image_folder(root, classes=("cat", "dog", "eel"), per_class=4, seed=1)
    write_image(root / "cat" / "nested" / "deep.png", size=(40, 36), seed=501)
    write_odd_images(root / "odd")
    write_broken_files(root / "dog")
    return root


@pytest.fixture(scope="module")
def expected(source: Path) -> dict[str, Any]:
    classes, samples = imagefolder_samples(source)
    samples = [(path, label) for path, label in samples if path not in BROKEN]
    return {"classes": classes, "samples": samples, "pixels": {p: reference_rgb(source, p) for p, _ in samples}}


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory, source: Path) -> Callable[[str, str], Path]:
    """``packs(encoding, backend)``: the source packed once per module (small shards: several parts)."""
    root = tmp_path_factory.mktemp("packs")
    cache: dict[tuple[str, str], Path] = {}

    def get(encoding: str, backend: str) -> Path:
        if (encoding, backend) not in cache:
            dst = root / encoding / backend
            dst.parent.mkdir(exist_ok=True)
            summary = packload.pack(source, dst, options=EncodeOptions(encoding=encoding), workers=1,
                                  progress=False, shard_size=64 << 10)
            assert summary["skipped"] == len(BROKEN)
            cache[encoding, backend] = dst
        return cache[encoding, backend]

    return get


@pytest.fixture
def copy_pack(tmp_path: Path) -> Callable[[Path], Path]:
    """A private copy of a pack, to damage."""

    def copy(pack: Path) -> Path:
        dst = tmp_path / pack.name
        if pack.is_dir():
            shutil.copytree(pack, dst)
        else:
            shutil.copy2(pack, dst)
        return dst

    return copy


def index_of(ds: PackedImageFolder, path: str) -> int:
    return [p for p, _ in ds.relative_samples].index(path)


# -- ImageFolder's surface -------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_metadata_matches_imagefolder(packs: Callable, expected: dict, backend: str) -> None:
    ds = PackedImageFolder(packs("keep", backend))
    samples = expected["samples"]
    assert ds.classes == expected["classes"] == ["cat", "dog", "eel", "odd"]
    assert ds.class_to_idx == {"cat": 0, "dog": 1, "eel": 2, "odd": 3}
    assert len(ds) == len(samples) == 4 * 3 + 1 + 18
    assert ds.relative_samples == samples
    full = [(os.path.join(str(ds.root), path), label) for path, label in samples]
    assert ds.samples == ds.imgs == full  # root/class/file, as ImageFolder(root) holds them
    assert ds.targets == [label for _, label in samples]
    assert all(type(t) is int for t in ds.targets)
    assert [ds.path(i) for i in range(len(ds))] == [p for p, _ in samples]
    assert ds.path(-1) == samples[-1][0]
    # nested files follow their class folder's top-level files, as in os.walk order
    assert [p for p, _ in samples if p.startswith("cat/")][-1] == "cat/nested/deep.png"
    assert {s["path"] for s in ds.manifest["skipped"]} == BROKEN
    assert ds.encoding == "keep"
    assert repr(ds).startswith("PackedImageFolder(") and f"records={len(ds)}" in repr(ds)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("encoding", LOSSLESS)
def test_pil_images_identical_to_imagefolder_loader(packs: Callable, expected: dict, encoding: str,
                                                    backend: str) -> None:
    ds = PackedImageFolder(packs(encoding, backend))
    assert ds.encoding == encoding
    for i, (path, label) in enumerate(expected["samples"]):
        image, target = ds[i]
        assert isinstance(image, Image.Image) and image.mode == "RGB", path
        assert target == label and type(target) is int
        assert np.array_equal(pixels(image), expected["pixels"][path]), path
    first, last = ds[-len(ds)], ds[-1]
    assert np.array_equal(pixels(first[0]), pixels(ds[0][0]))
    assert np.array_equal(pixels(last[0]), pixels(ds[len(ds) - 1][0]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_jpeg_encoding_bounded_error(packs: Callable, expected: dict, backend: str) -> None:
    """--encoding jpeg (quality 90) is lossy: measured worst mean abs error 4.8, worst max 30 here."""
    ds = PackedImageFolder(packs("jpeg", backend))
    for i, (path, label) in enumerate(expected["samples"]):
        image, target = ds[i]
        ref = expected["pixels"][path].astype(np.int16)
        got = pixels(image).astype(np.int16)
        assert target == label and got.shape == ref.shape, path
        diff = np.abs(got - ref)
        assert diff.mean() <= 8 and diff.max() <= 64, (path, diff.mean(), diff.max())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("encoding", LOSSLESS)
def test_numpy_tensor_and_bytes_outputs(packs: Callable, source: Path, expected: dict, encoding: str,
                                        backend: str) -> None:
    pack = packs(encoding, backend)
    as_numpy = PackedImageFolder(pack, output="numpy")
    as_tensor = PackedImageFolder(pack, output="tensor")
    as_bytes = PackedImageFolder(pack, output="bytes")
    for i, (path, label) in enumerate(expected["samples"]):
        ref = expected["pixels"][path]
        array, y1 = as_numpy[i]
        tensor, y2 = as_tensor[i]
        payload, y3 = as_bytes[i]
        assert y1 == y2 == y3 == label
        assert isinstance(array, np.ndarray) and array.dtype == np.uint8 and array.shape == ref.shape
        assert np.array_equal(array, ref), path
        assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.uint8
        assert tensor.shape == (3, ref.shape[0], ref.shape[1])
        assert torch.equal(tensor, torch.from_numpy(ref.copy()).permute(2, 0, 1)), path
        assert isinstance(payload, bytes)
        if encoding == "keep":
            assert payload == (source / path).read_bytes(), path
        elif encoding == "png":
            with Image.open(io.BytesIO(payload)) as image:
                assert image.format == "PNG" and np.array_equal(np.asarray(image.convert("RGB")), ref)
        else:
            assert payload == ref.tobytes()


def test_transform_and_target_transform(packs: Callable, expected: dict) -> None:
    seen: list[Any] = []

    def transform(image: Image.Image) -> tuple[str, tuple[int, int]]:
        seen.append(image)
        return "transformed", image.size

    classes = expected["classes"]
    ds = PackedImageFolder(packs("keep", "x.lmdb"), transform=transform, target_transform=lambda y: classes[y])
    for i, (path, label) in enumerate(expected["samples"]):
        ref = expected["pixels"][path]
        assert ds[i] == (("transformed", (ref.shape[1], ref.shape[0])), classes[label])
        assert isinstance(seen[-1], Image.Image) and np.array_equal(pixels(seen[-1]), ref)
    assert len(seen) == len(ds)


def test_bad_options_are_refused(packs: Callable) -> None:
    with pytest.raises(ValueError, match="unknown output 'jpeg'"):
        PackedImageFolder(packs("keep", "x.lmdb"), output="jpeg")
    with pytest.raises(ValueError, match="unknown on_error 'ignore'"):
        PackedImageFolder(packs("keep", "x.lmdb"), on_error="ignore")


# -- EXIF orientation ------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("encoding", LOSSLESS)
def test_exif_transpose(packs: Callable, source: Path, expected: dict, encoding: str, backend: str) -> None:
    pack = packs(encoding, backend)
    plain = PackedImageFolder(pack)
    upright = PackedImageFolder(pack, exif_transpose=True)
    upright_np = PackedImageFolder(pack, exif_transpose=True, output="numpy")
    i = index_of(plain, "odd/exif_rotated.jpg")
    with Image.open(source / "odd/exif_rotated.jpg") as original:
        assert original.getexif()[EXIF_ORIENTATION] == 6 and original.size == (48, 32)
        want = np.asarray(ImageOps.exif_transpose(original).convert("RGB"))
    assert want.shape == (48, 32, 3)  # turned upright: 32 wide, 48 tall
    assert np.array_equal(pixels(plain[i][0]), expected["pixels"]["odd/exif_rotated.jpg"])  # default: as stored
    assert pixels(plain[i][0]).shape == (32, 48, 3)
    assert np.array_equal(pixels(upright[i][0]), want)
    assert np.array_equal(upright_np[i][0], want)
    # images without an orientation are unchanged
    j = index_of(plain, "cat/img_000.jpg")
    assert np.array_equal(pixels(upright[j][0]), expected["pixels"]["cat/img_000.jpg"])


# -- fast JPEG decoding and decode_size ------------------------------------------------------------------


def test_fast_jpeg_matches_pil(packs: Callable, expected: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """simplejpeg (libjpeg-turbo) vs PIL on every JPEG: measured max abs diff 0 (simplejpeg 1.9,
    Pillow 13); allowed up to 2 for other libjpeg-turbo builds."""
    simplejpeg = pytest.importorskip("simplejpeg")
    calls: list[int] = []
    real = simplejpeg.decode_jpeg

    def counting(*args: Any, **kwargs: Any) -> np.ndarray:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(simplejpeg, "decode_jpeg", counting)
    pack = packs("keep", "x.shards")
    fast = PackedImageFolder(pack, output="numpy", fast_jpeg=True)
    slow = PackedImageFolder(pack, output="numpy", fast_jpeg=False)
    reader = fast.reader()
    jpegs = [i for i in range(len(fast)) if reader.format_of(i) == "JPEG"]
    fast_modes = [i for i in jpegs if reader.entries["mode"][i].decode() in ("RGB", "L")]
    assert len(jpegs) >= 8 and len(fast_modes) == len(jpegs) - 1  # all but the CMYK JPEG
    worst = 0
    for i in jpegs:
        path = fast.path(i)
        got, label = fast[i]
        assert label == fast.targets[i]
        assert got.dtype == np.uint8 and got.shape == expected["pixels"][path].shape, path
        worst = max(worst, int(np.abs(got.astype(np.int16) - expected["pixels"][path]).max()))
    assert len(calls) == len(fast_modes)  # simplejpeg really decoded them (CMYK goes through PIL)
    assert worst <= 2
    calls.clear()
    for i in jpegs:
        assert np.abs(slow[i][0].astype(np.int16) - fast[i][0]).max() <= 2
    assert len(calls) == len(fast_modes)  # only the fast dataset's calls


@pytest.fixture(scope="module")
def big_pack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """320x240 JPEG and PNG, and a 256x64 JPEG stored sideways (EXIF orientation 6)."""
    root = tmp_path_factory.mktemp("big")
    write_image(root / "a" / "big.jpg", size=(320, 240), seed=1, quality=92)
    write_image(root / "a" / "big.png", size=(320, 240), seed=2)
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = 6
    write_image(root / "b" / "side.jpg", size=(256, 64), seed=3, exif=exif.tobytes())
    dst = root.parent / (root.name + "-pack.shards")
    packload.pack(root, dst, workers=1, progress=False)
    return root, dst


@pytest.mark.parametrize(("output", "fast_jpeg"), [("pil", False), ("numpy", False), ("numpy", True)])
def test_decode_size_gives_at_least_that_size(big_pack: tuple[Path, Path], output: str, fast_jpeg: bool) -> None:
    if fast_jpeg:
        pytest.importorskip("simplejpeg")
    root, pack = big_pack
    ds = PackedImageFolder(pack, output=output, decode_size=(60, 50), fast_jpeg=fast_jpeg)
    full = PackedImageFolder(pack, output="numpy")
    shapes = {ds.path(i): pixels(ds[i][0]).shape for i in range(len(ds))}
    assert shapes["a/big.png"] == (240, 320, 3)  # not a JPEG: full size
    h, w, _ = shapes["a/big.jpg"]
    assert h >= 60 and w >= 50
    assert (h, w) == (60, 80)  # decoded at 1/4 DCT scale: the largest reduction still >= (60, 50)
    # a reduced decode approximates the full image shrunk to the same size
    shrunk = np.asarray(Image.fromarray(full[0][0]).resize((w, h), Image.Resampling.BOX)).astype(np.int16)
    assert np.abs(pixels(ds[0][0]).astype(np.int16) - shrunk).mean() < 8


def test_decode_size_respects_exif_orientation(big_pack: tuple[Path, Path]) -> None:
    _, pack = big_pack
    ds = PackedImageFolder(pack, output="numpy", exif_transpose=True, decode_size=(8, 60))
    i = index_of(ds, "b/side.jpg")
    h, w, _ = ds[i][0].shape  # upright the image is 64 wide and 256 tall
    assert h >= 8 and w >= 60, (h, w)


# -- DataLoader ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def crop_keys(expected: dict) -> dict[bytes, int]:
    """Record number of each record, keyed by its top-left crop (asserted unique)."""
    keys = {np.ascontiguousarray(expected["pixels"][p][:CROP, :CROP]).tobytes(): i
            for i, (p, _) in enumerate(expected["samples"])}
    assert len(keys) == len(expected["samples"])
    return keys


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("num_workers", "context", "output"),
    [(0, None, "pil"), (2, "fork", "numpy"), (2, "spawn", "tensor")],
    ids=["main-process", "fork", "spawn"],
)
def test_dataloader_epochs(packs: Callable, copy_pack: Callable, expected: dict, crop_keys: dict, backend: str,
                           num_workers: int, context: str | None, output: str) -> None:
    # a private copy, so that no reader another test left open in this process is inherited by fork
    ds = PackedImageFolder(copy_pack(packs("keep", backend)), transform=CropTopLeft(CROP), output=output)
    sampler = ds.sampler(shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=4, sampler=sampler, collate_fn=collate_uint8, num_workers=num_workers,
        multiprocessing_context=context, persistent_workers=num_workers > 0,
    )
    n = len(ds)
    orders = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        seen = []
        for images, labels in loader:
            assert images.dtype == torch.uint8 and images.shape[1:] == (3, CROP, CROP)
            assert labels.dtype == torch.int64 and len(labels) == len(images) <= 4
            for image, label in zip(images, labels, strict=True):
                record = crop_keys[image.permute(1, 2, 0).contiguous().numpy().tobytes()]
                assert int(label) == expected["samples"][record][1]
                seen.append(record)
        assert sorted(seen) == list(range(n)), f"epoch {epoch}"  # every record exactly once
        assert seen == sampler.epoch_order(epoch).tolist()
        orders.append(seen)
    assert orders[0] != orders[1] != orders[2] and orders[0] != list(range(n))  # really shuffled


@pytest.mark.parametrize("backend", BACKENDS)
def test_workers_open_their_own_reader_after_fork(packs: Callable, copy_pack: Callable, backend: str) -> None:
    """The parent reads first (``ds[0]``, or ``ds.samples`` / ``ds.path(i)``, which also open the reader);
    forked DataLoader workers must then open their own reader."""
    ds = ReaderPidProbe(copy_pack(packs("keep", backend)), output="bytes")
    parent = os.getpid()
    assert ds[0] == (parent, parent, ds.targets[0])  # opened in the parent first
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    results = list(loader)
    assert [label for _, _, label in results] == ds.targets
    assert {pid for pid, _, _ in results}.isdisjoint({parent})
    assert all(pid == reader_pid for pid, reader_pid, _ in results)
    assert ds[1] == (parent, parent, ds.targets[1])  # the parent's reader still works


def _mapped_files() -> str:
    return Path("/proc/self/maps").read_text()


@pytest.mark.parametrize("backend", BACKENDS)
def test_pickles_small_and_opens_lazily(packs: Callable, copy_pack: Callable, backend: str) -> None:
    pack = copy_pack(packs("keep", backend))  # a private copy: no other test holds it open
    ds = PackedImageFolder(pack, transform=CropTopLeft(CROP))
    if sys.platform.startswith("linux"):
        assert str(pack) not in _mapped_files()  # construction read the metadata and let go
    blob_closed = pickle.dumps(ds)
    ds[0]
    if sys.platform.startswith("linux"):
        assert str(pack) in _mapped_files()  # now this process maps the pack
    blob = pickle.dumps(ds)  # with the reader open: still picklable, still small
    with PackReader(pack) as reader:
        payload_bytes = int(reader.entries["payload_len"].sum())
        slices = [bytes(reader.payload(i))[len(reader.payload(i)) // 2:][:16] for i in range(reader.records)]
    assert len(blob) < 8192 and len(blob) < payload_bytes / 20, len(blob)
    assert abs(len(blob) - len(blob_closed)) < 64
    assert not any(s in blob for s in slices)
    clone = pickle.loads(blob)
    assert clone._reader is None  # opens on first use in the receiving process
    assert clone.samples == ds.samples and clone.classes == ds.classes
    for i in (0, len(ds) - 1):
        assert np.array_equal(pixels(clone[i][0]), pixels(ds[i][0])) and clone[i][1] == ds[i][1]


# -- bad input -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_missing_path(tmp_path: Path, backend: str) -> None:
    missing = tmp_path / backend
    with pytest.raises(UsageError, match="no such pack") as info:
        PackedImageFolder(missing)
    assert str(missing) in str(info.value)


def test_not_a_pack(tmp_path: Path) -> None:
    text = tmp_path / "notes.lmdb"
    text.write_text("hello\n" * 2000)
    with pytest.raises(UsageError, match="not an LMDB file"):
        PackedImageFolder(text)
    (tmp_path / "empty.shards").mkdir()
    with pytest.raises(UsageError, match="not a pack"):
        PackedImageFolder(tmp_path / "empty.shards")


@pytest.mark.parametrize("backend", BACKENDS)
def test_unfinished_pack(tmp_path: Path, backend: str) -> None:
    """A pack stopped part way (here: --strict meets a broken file) leaves only DEST.partial."""
    src = tmp_path / "src"
    make_image_folder(src, classes=("a",), per_class=3)
    write_broken_files(src / "b")
    dst = tmp_path / backend
    with pytest.raises(SkippedFileError):
        packload.pack(src, dst, workers=1, progress=False, strict=True, checkpoint_every=1)
    partial = tmp_path / (backend + ".partial")
    assert partial.exists() and not dst.exists()
    with pytest.raises(IncompletePackError, match="--resume") as info:
        PackedImageFolder(dst)
    assert str(partial) in str(info.value)
    with pytest.raises(IncompletePackError, match="--resume"):
        PackedImageFolder(partial)


def _lmdb_put(path: Path, key: bytes, value: bytes | None) -> None:
    env = lmdb.open(str(path), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        if value is None:
            assert txn.delete(key)
        else:
            txn.put(key, value)
    env.close()


def _lmdb_get(path: Path, key: bytes) -> bytes:
    env = lmdb.open(str(path), subdir=False, lock=False, readonly=True)
    with env.begin() as txn:
        value = bytes(txn.get(key))
    env.close()
    return value


@pytest.mark.parametrize("backend", BACKENDS)
def test_manifest_deleted(packs: Callable, copy_pack: Callable, backend: str) -> None:
    pack = copy_pack(packs("keep", backend))
    if backend.endswith(".shards"):
        (pack / "manifest.json").unlink()
        match = "manifest.json"
    else:
        _lmdb_put(pack, b"#manifest", None)
        match = "no manifest"
    with pytest.raises(PackFormatError, match=match) as info:
        PackedImageFolder(pack)
    assert str(pack) in str(info.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_manifest_of_a_newer_version(packs: Callable, copy_pack: Callable, backend: str) -> None:
    pack = copy_pack(packs("keep", backend))
    if backend.endswith(".shards"):
        manifest = json.loads((pack / "manifest.json").read_text("utf-8"))
        (pack / "manifest.json").write_text(json.dumps(dict(manifest, version=99)), "utf-8")
    else:
        manifest = json.loads(_lmdb_get(pack, b"#manifest"))
        _lmdb_put(pack, b"#manifest", json.dumps(dict(manifest, version=99)).encode())
    with pytest.raises(PackFormatError, match=r"version 99.*upgrade packload"):
        PackedImageFolder(pack)


@pytest.mark.parametrize("backend", BACKENDS)
def test_index_truncated(packs: Callable, copy_pack: Callable, backend: str) -> None:
    pack = copy_pack(packs("keep", backend))
    if backend.endswith(".shards"):
        index = pack / "index.bin"
        os.truncate(index, index.stat().st_size - 10)
    else:
        _lmdb_put(pack, b"#index", _lmdb_get(pack, b"#index")[:-10])
    with pytest.raises(PackFormatError, match="the pack is damaged"):
        PackedImageFolder(pack)


def test_shard_truncated(packs: Callable, copy_pack: Callable) -> None:
    pack = copy_pack(packs("keep", "x.shards"))
    shards = sorted(pack.glob("shard-*.bin"))
    assert len(shards) >= 2
    victim = shards[-1]
    os.truncate(victim, victim.stat().st_size - 1)
    with pytest.raises(PackFormatError, match="truncated") as info:
        PackedImageFolder(pack)
    assert victim.name in str(info.value)
    victim.unlink()
    with pytest.raises(PackFormatError, match="shard missing") as info:
        PackedImageFolder(pack)
    assert victim.name in str(info.value)


def test_lmdb_file_truncated(packs: Callable, copy_pack: Callable) -> None:
    pack = copy_pack(packs("keep", "x.lmdb"))
    os.truncate(pack, pack.stat().st_size // 2 // 4096 * 4096)
    code = textwrap.dedent("""
        import sys
        from packload import PackedImageFolder
        from packload import PackFormatError
        try:
            ds = PackedImageFolder(sys.argv[1])
            for i in range(len(ds)):
                ds[i]
        except PackFormatError as exc:
            print("PackFormatError:", exc)
    """)
    result = subprocess.run([sys.executable, "-c", code, str(pack)], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))})
    assert result.returncode == 0, (result.returncode, result.stderr[-500:])
    assert "PackFormatError:" in result.stdout




@pytest.mark.parametrize("backend", ["x.lmdb", "x.shards"])
def test_repacked_destination_is_read_fresh(tmp_path: Path, backend: str) -> None:
    """Re-pack over a pack that an older dataset in this process still reads: a new dataset sees the new pack."""
    make_image_folder(tmp_path / "one", classes=("a", "b"), per_class=2)
    make_image_folder(tmp_path / "two", classes=("x", "y", "z"), per_class=3, seed=5)
    dst = tmp_path / backend
    packload.pack(tmp_path / "one", dst, workers=1, progress=False)
    old = PackedImageFolder(dst)
    old_first = pixels(old[0][0])  # the old dataset holds the old pack open
    packload.pack(tmp_path / "two", dst, workers=1, progress=False, overwrite=True)
    new = PackedImageFolder(dst)
    assert new.classes == ["x", "y", "z"] and len(new) == 9
    assert new.path(0) == "x/img_000.jpg"
    assert np.array_equal(pixels(new[0][0]), reference_rgb(tmp_path / "two", "x/img_000.jpg"))
    assert np.array_equal(pixels(old[0][0]), old_first)  # and the old one still reads what it read


@pytest.mark.parametrize("backend", BACKENDS)
def test_index_out_of_range(packs: Callable, backend: str) -> None:
    ds = PackedImageFolder(packs("keep", backend))
    for bad in (len(ds), len(ds) + 10, -len(ds) - 1):
        with pytest.raises(IndexError, match="out of range"):
            ds[bad]
        with pytest.raises(IndexError):
            ds.path(bad)


@pytest.fixture
def flipped(packs: Callable, copy_pack: Callable, request: pytest.FixtureRequest) -> tuple[Path, int, str]:
    """A copy of a keep pack with one byte flipped in the middle of record k's payload."""
    backend = request.param
    pack = copy_pack(packs("keep", backend))
    with PackReader(pack) as reader:
        k = [reader.path_of(i) for i in range(reader.records)].index("cat/img_001.png")
        entry = reader.entries[k]
        payload = bytes(reader.payload(k))
        if reader.backend == "shards":
            target = pack / reader.part_names[int(entry["part"])]
            offset = int(entry["payload_offset"])
        else:  # an LMDB value is stored contiguously: find the payload in the file
            target = pack
            data = pack.read_bytes()
            offset = data.find(payload)
            assert offset > 0 and data.find(payload, offset + 1) < 0
    data = bytearray(target.read_bytes())
    assert data[offset : offset + len(payload)] == payload
    data[offset + len(payload) // 2] ^= 0xFF
    target.write_bytes(data)
    return pack, k, "cat/img_001.png"


@pytest.mark.parametrize("flipped", BACKENDS, indirect=True)
def test_flipped_byte_verify_raises_checksum_error(flipped: tuple[Path, int, str], expected: dict) -> None:
    pack, k, path = flipped
    ds = PackedImageFolder(pack, verify=True)
    with pytest.raises(ChecksumError, match="checksum mismatch") as info:
        ds[k]
    assert path in str(info.value) and f"record {k}" in str(info.value)
    neighbour = expected["samples"][k + 1][0]
    assert np.array_equal(pixels(ds[k + 1][0]), expected["pixels"][neighbour])  # the others still read
    with pytest.raises(ChecksumError, match=path):
        ds.__getitems__([k - 1, k, k + 1])


@pytest.mark.parametrize("flipped", BACKENDS, indirect=True)
def test_flipped_byte_skipped_with_warning(flipped: tuple[Path, int, str], expected: dict) -> None:
    pack, k, path = flipped
    ds = PackedImageFolder(pack, verify=True, on_error="skip")
    with pytest.warns(UserWarning, match=f"skipping damaged record {k} \\({path}\\)"):
        image, label = ds[k]
    neighbour, neighbour_label = expected["samples"][k + 1]
    assert label == neighbour_label
    assert np.array_equal(pixels(image), expected["pixels"][neighbour])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an intact record gives no warning
        assert np.array_equal(pixels(ds[k - 1][0]), expected["pixels"][expected["samples"][k - 1][0]])
    with pytest.warns(UserWarning, match=path):
        batch = ds.__getitems__([k - 1, k, k + 1])
    assert [y for _, y in batch] == [expected["samples"][j][1] for j in (k - 1, k + 1, k + 1)]
    assert len(batch) == 3  # batches keep their size


@pytest.mark.parametrize("flipped", BACKENDS, indirect=True)
def test_verify_reports_exactly_the_flipped_record(flipped: tuple[Path, int, str], packs: Callable) -> None:
    pack, k, path = flipped
    clean = verify(packs("keep", "x.lmdb" if pack.suffix == ".lmdb" else "x.shards"), progress=False)
    assert clean["ok"] and clean["bad_records"] == [] and clean["bad_files"] == []
    report = verify(pack, progress=False)
    assert not report["ok"]
    assert [(r["record"], r["path"]) for r in report["bad_records"]] == [(k, path)]
    assert "checksum mismatch" in report["bad_records"][0]["problem"]
    if pack.suffix == ".shards":  # the shard's whole-file sha256 no longer matches either
        assert [f["file"] for f in report["bad_files"]] == [report["bad_records"][0]["part"]]


def test_samples_are_full_paths_as_imagefolder_holds_them(tmp_path: Path) -> None:
    """``samples``/``imgs`` join root/class/file as ImageFolder does; ``source_root`` gives the packed
    folder's own paths, ``relative_samples`` and ``path(i)`` the relative ones."""
    from PIL import Image

    from packload.packer.pipeline import pack

    images = tmp_path / "images"
    for cls in ("cat", "dog"):
        (images / cls).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (8, 8), (i * 50, 10, 10)).save(images / cls / f"{i}.png")
    pack(images, tmp_path / "p.lmdb", progress=False)
    _, relative = imagefolder_samples(images)
    ds = PackedImageFolder(str(tmp_path / "p.lmdb"))
    assert ds.relative_samples == relative and ds.path(0) == "cat/0.png"
    assert ds.samples == ds.imgs == [(os.path.join(str(tmp_path / "p.lmdb"), p), label) for p, label in relative]
    as_folder = PackedImageFolder(tmp_path / "p.lmdb", source_root=str(images))
    imagefolder_style = [(os.path.join(str(images), cls, name), label)
                         for label, cls in enumerate(("cat", "dog")) for name in ("0.png", "1.png")]
    assert as_folder.samples == imagefolder_style
    assert all(os.path.exists(path) for path, _ in as_folder.samples)
