"""The contract every backend and encoding keeps: pack real images, read each record back, and
compare with what PIL reads from the original file."""

from __future__ import annotations

import os

import numpy as np
import pytest
from PIL import Image

from packload import EncodeOptions, PackedImageFolder, PackReader, pack
from packload.core.scan import IMG_EXTENSIONS, scan_folder
from tests.image_factory import (
    make_image_folder,
    write_broken_files,
    write_hidden_and_stray,
    write_odd_images,
)

BACKENDS = ("lmdb", "shards")
ENCODINGS = ("keep", "png", "raw", "jpeg")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A tree with normal, odd, broken, hidden and stray files, and what each should become."""
    root = tmp_path_factory.mktemp("src")
    make_image_folder(root, classes=("ant", "bee", "cat"), per_class=4, seed=1)
    odd = write_odd_images(root / "bee")
    broken = write_broken_files(root / "cat")
    write_hidden_and_stray(root)
    (root / "ant" / "deeper" / "more").mkdir(parents=True)
    Image.new("RGB", (20, 10), (1, 2, 3)).save(root / "ant" / "deeper" / "more" / "nested.png")
    return root, odd, broken


@pytest.fixture(scope="module", params=[(b, e) for b in BACKENDS for e in ENCODINGS], ids=lambda p: f"{p[0]}-{p[1]}")
def packed(request, source, tmp_path_factory):
    backend, encoding = request.param
    root, _, _ = source
    dst = tmp_path_factory.mktemp("dst") / ("p.lmdb" if backend == "lmdb" else "p.shards")
    summary = pack(root, dst, options=EncodeOptions(encoding=encoding), workers=2, progress=False,
                   shard_size=1 << 16)
    return backend, encoding, dst, summary


def test_every_good_image_round_trips(packed, source):
    backend, encoding, dst, summary = packed
    root, odd, broken = source
    scan = scan_folder(root)
    expected = [s for s in scan.samples if s.path.rsplit("/", 1)[-1] not in broken]
    ds = PackedImageFolder(dst)
    assert summary["records"] == len(ds) == len(expected)
    assert ds.classes == ["ant", "bee", "cat"] and ds.class_to_idx == {"ant": 0, "bee": 1, "cat": 2}
    assert [ds.path(i) for i in range(len(ds))] == [s.path for s in expected]
    assert ds.targets == [s.label for s in expected]
    raw_ds = PackedImageFolder(dst, output="bytes")
    for i, sample in enumerate(expected):
        original = root / sample.path
        with Image.open(original) as im:
            want = np.asarray(im.convert("RGB"))
        got = np.asarray(ds[i][0])
        if encoding == "keep":
            assert raw_ds[i][0] == original.read_bytes()
        if encoding == "jpeg":
            assert got.shape == want.shape
            assert np.abs(got.astype(int) - want.astype(int)).mean() < 12, sample.path
        else:
            assert np.array_equal(got, want), sample.path


def test_broken_files_are_skipped_and_listed(packed, source):
    _, _, dst, summary = packed
    _, _, broken = source
    with PackReader(dst) as reader:
        skipped = {item["path"].rsplit("/", 1)[-1]: item["reason"] for item in reader.manifest["skipped"]}
        ignored = {item["path"]: item["reason"] for item in reader.manifest["ignored"]}
    assert set(skipped) == set(broken)
    assert summary["skipped"] == len(broken)
    assert "truncated JPEG" in skipped[next(n for n, k in broken.items() if "jpeg" in k.lower() and "trunc" in k)]
    assert any("decompression bomb" in reason and "--max-pixels" in reason for reason in skipped.values())
    assert any("empty file" in reason for reason in skipped.values())
    assert ignored["stray.jpg"] == "file outside the class folders"
    assert any(reason == "hidden file" for reason in ignored.values())
    assert any(reason == "hidden folder" for reason in ignored.values())
    assert any(reason == "not an image extension" for reason in ignored.values())


def test_raw_and_size_options(source, tmp_path):
    root, _, _ = source
    dst = tmp_path / "r.shards"
    pack(root, dst, options=EncodeOptions(encoding="raw", size=(8, 12)), workers=1, progress=False)
    ds = PackedImageFolder(dst, output="numpy")
    assert {ds[i][0].shape for i in range(len(ds))} == {(8, 12, 3)}


def test_max_side_shrinks_and_keeps_aspect(tmp_path):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    Image.new("RGB", (400, 100), (200, 10, 10)).save(src / "a" / "wide.jpg")
    Image.new("RGB", (30, 60), (10, 200, 10)).save(src / "a" / "small.png")
    pack(src, tmp_path / "m.lmdb", options=EncodeOptions(encoding="jpeg", max_side=64), workers=1, progress=False)
    ds = PackedImageFolder(tmp_path / "m.lmdb")
    assert ds[0][0].size == (30, 60)  # already small: unchanged
    assert ds[1][0].size == (64, 16)


def test_unlabelled_folder(tmp_path):
    src = tmp_path / "flat"
    src.mkdir()
    for k in range(3):
        Image.new("L", (9, 9), k * 40).save(src / f"{k}.png")
    summary = pack(src, tmp_path / "flat.shards", workers=1, progress=False)
    ds = PackedImageFolder(tmp_path / "flat.shards")
    assert summary["classes"] == 0 and ds.classes == [] and ds.targets == [-1, -1, -1]
    assert ds.manifest["labelled"] is False


def test_scan_matches_imagefolder_order(tmp_path):
    """Folders sorted by path string, files by name within each: torchvision's make_dataset order."""
    for rel in ["c/a-b/x.jpg", "c/a/y.jpg", "c/a/b/w.jpg", "c/z.JPG", "c/a.png", "d/q.webp"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    scan = scan_folder(tmp_path)
    assert scan.classes == ["c", "d"]
    # "c/a-b" sorts before "c/a/b" as a string ("-" < "/"), although a walk visits c/a/b first.
    assert [s.path for s in scan.samples] == ["c/a.png", "c/z.JPG", "c/a/y.jpg", "c/a-b/x.jpg", "c/a/b/w.jpg",
                                              "d/q.webp"]
    assert ".webp" in IMG_EXTENSIONS


def test_symlinks_and_loops(tmp_path):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    Image.new("RGB", (5, 5)).save(tmp_path / "outside.png")
    (src / "a" / "link.png").symlink_to(tmp_path / "outside.png")
    (src / "a" / "dangling.png").symlink_to(tmp_path / "missing.png")
    (src / "a" / "loop").symlink_to(src / "a")
    summary = pack(src, tmp_path / "s.shards", workers=1, progress=False)
    ds = PackedImageFolder(tmp_path / "s.shards")
    assert [ds.path(i) for i in range(len(ds))] == ["a/link.png"]
    assert summary["skipped"] == 1  # the dangling link, listed with its reason
    assert any("symlink loop" in item["reason"] for item in ds.manifest["ignored"])


def test_keep_pack_size_is_close_to_source(tmp_path):
    src = tmp_path / "src"
    make_image_folder(src, classes=("a", "b"), per_class=40, seed=3)
    for backend in BACKENDS:
        summary = pack(src, tmp_path / f"k.{backend}", backend=backend, workers=1, progress=False)
        assert summary["pack_bytes"] <= summary["source_bytes"] * 1.10 + 64 * 1024


def test_names_that_are_not_utf8_are_listed_not_fatal(tmp_path):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    Image.new("RGB", (6, 6)).save(src / "a" / "good.png")
    bad_dir = os.fsencode(src / "a") + b"/bad\xff.png"
    Image.new("RGB", (6, 6)).save(bad_dir.decode("utf-8", "surrogateescape"))
    os.makedirs(os.fsencode(src) + b"/cls\xfe", exist_ok=True)
    summary = pack(src, tmp_path / "u.lmdb", workers=1, progress=False)
    ds = PackedImageFolder(tmp_path / "u.lmdb")
    assert summary["records"] == 1 and ds.classes == ["a"]
    reasons = {item["path"]: item["reason"] for item in ds.manifest["ignored"]}
    assert "not valid UTF-8" in reasons["a/bad\\xff.png"]
    assert "not valid UTF-8" in reasons["cls\\xfe"]


def test_lmdb_map_grows_when_full(tmp_path):
    """A map far smaller than the data is grown on MapFullError, not an error."""
    from packload.packer.encode import Encoded
    from packload.packer.write_lmdb import LmdbWriter

    writer = LmdbWriter(tmp_path / "g.lmdb", map_size=256 << 10, chunk_size=64 << 10)
    payloads = [os.urandom(50_000 + k) for k in range(60)]  # ~3 MB into a 256 KiB map
    for k, payload in enumerate(payloads):
        import zlib

        writer.write(Encoded(f"a/{k}.bin", 0, payload, 1, 1, "L", "other", 0, len(payload), zlib.crc32(payload)))
    writer.finish({"format": "packload", "version": 1, "backend": "lmdb", "encoding": "keep", "records": 60,
                   "classes": ["a"], "skipped": []})
    with PackReader(tmp_path / "g.lmdb") as reader:
        assert [bytes(reader.payload(k, verify=True)) for k in range(60)] == payloads
