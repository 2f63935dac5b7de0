"""The fast paths of packing give what the plain ones give: record headers and index built in one
pass, the end-marker shortcut, whole-file reads, and re-encoding with libjpeg-turbo plus PyTorch's
resize instead of PIL's."""

from __future__ import annotations

import hashlib
import io
import json
import os
import threading
import zlib

import numpy as np
import pytest
from PIL import Image

from packload import EncodeOptions, PackedImageFolder, pack
from packload.core import torch_private
from packload.core.format import INDEX_ENTRY, RecordMeta, encode_index, encode_record, index_entry
from packload.core.scan import Sample, scan_folder
from packload.packer import append_file, encode_stream
from packload.packer import encode as encode_module
from packload.packer.encode import (
    Encoded,
    Skipped,
    _read_file,
    _reencode,
    encode_file,
    resize_rgb,
    truncation_problem,
)
from packload.packer.encode_stream import use_threads
from packload.packer.index_builder import IndexBuilder
from packload.packer.write_lmdb import LmdbWriter
from packload.packer.write_shards import ShardsWriter
from tests.image_factory import make_image_folder, textured_rgb, write_broken_files, write_odd_images


def _jpeg(pixels: np.ndarray, mode: str = "RGB", quality: int = 92) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(out, "JPEG", quality=quality)
    return out.getvalue()


def test_add_record_matches_encode_record_and_index_entry():
    builder = IndexBuilder()
    rows, paths = [], b""
    cases = [("a/x.jpg", "JPEG", "RGB", 0), ("b/é ü.png", "PNG", "LA", 6), ("c/z.bin", "not-a-format", "L", 0),
             ("d/raw", "raw", "RGB", 3)]
    for i, (path, fmt, mode, orientation) in enumerate(cases):
        payload = bytes(range(i * 37 % 256)) * 3
        crc = zlib.crc32(payload)
        head = builder.add_record(path, i - 1, 30 + i, 40 + i, fmt, mode, orientation, len(payload), crc, i % 2,
                                  1000 * i)
        meta = RecordMeta(i, i - 1, 30 + i, 40 + i, fmt, mode, orientation, path)
        assert head == encode_record(meta, payload, crc)[0]
        rows.append(index_entry(meta, i % 2, 1000 * i, len(payload), crc, len(paths)))
        paths += path.encode("utf-8")
    assert builder.count == len(cases)
    assert builder.to_bytes() == encode_index(np.array(rows, dtype=INDEX_ENTRY), paths)
    assert builder.labels().tolist() == [-1, 0, 1, 2]


def test_add_and_add_record_share_numbering():
    builder = IndexBuilder()
    builder.add(RecordMeta(0, 1, 2, 3, "JPEG", "RGB", 0, "p0"), 0, 16, 5, 7)
    builder.add_record("p1", 1, 2, 3, "JPEG", "RGB", 0, 5, 7, 0, 100)
    with pytest.raises(ValueError, match="out of order"):
        builder.add(RecordMeta(5, 1, 2, 3, "JPEG", "RGB", 0, "p5"), 0, 200, 5, 7)
    assert builder.count == 2 and builder.payload_bytes == 10


def test_truncation_shortcut_agrees_with_the_search():
    good = _jpeg(textured_rgb((40, 30)))
    assert good.endswith(b"\xff\xd9") and truncation_problem(good, "JPEG") is None
    assert truncation_problem(good + b"trailing bytes", "JPEG") is None  # end marker, then junk
    assert "truncated JPEG" in truncation_problem(good[: len(good) * 2 // 3], "JPEG")
    assert "truncated JPEG" in truncation_problem(good[:-2], "JPEG")


def test_read_file_reads_whole_files(tmp_path):
    for size in (0, 1, 4096, 3 << 20):
        path = tmp_path / f"f{size}"
        data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
        path.write_bytes(data)
        assert _read_file(str(path)) == data
    with pytest.raises(OSError):
        _read_file(str(tmp_path / "missing"))
    with pytest.raises(OSError):
        _read_file(str(tmp_path))  # a folder


@pytest.mark.parametrize("shape", [(302, 308), (500, 375), (257, 256), (64, 1000)])
def test_resize_rgb_follows_pil(shape, monkeypatch):
    """PyTorch's antialiased kernel against PIL's filter of the same name (``RESIZE``, bilinear):
    at most 1 grey level apart, in the kernel's channels-last form and in the public fallback."""
    assert encode_module.RESIZE == Image.Resampling.BILINEAR
    pixels = textured_rgb((shape[1], shape[0]), seed=shape[0])
    target = (max(1, round(shape[1] * 256 / max(shape))), max(1, round(shape[0] * 256 / max(shape))))
    got = resize_rgb(pixels, target)
    want = np.asarray(Image.fromarray(pixels).resize(target, Image.Resampling.BILINEAR, reducing_gap=3.0))
    assert got.shape == want.shape == (target[1], target[0], 3) and got.dtype == np.uint8
    assert got.flags["C_CONTIGUOUS"]
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
    monkeypatch.setattr(torch_private, "_upsample_out", {"bilinear": None})  # a torch without the out= operator
    assert np.array_equal(resize_rgb(pixels, target), got)


def test_resize_rgb_enlarges_with_pil():
    pixels = textured_rgb((10, 8))
    want = np.asarray(Image.fromarray(pixels).resize((20, 30), Image.Resampling.BILINEAR))
    assert np.array_equal(resize_rgb(pixels, (20, 30)), want)


def test_keep_chunk_gives_what_encode_file_gives(tmp_path):
    """The one-loop ``keep`` path decides every file as ``encode_file`` does: plain, odd and broken."""
    make_image_folder(tmp_path, classes=("a",), per_class=5, seed=2)
    write_odd_images(tmp_path / "b")
    write_broken_files(tmp_path / "c")
    big = tmp_path / "d" / "big.png"  # larger than the first read
    big.parent.mkdir()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (300, 300, 3), np.uint8)).save(big)
    assert big.stat().st_size > encode_module.FIRST_READ
    samples = [Sample(path, label) for path, label in scan_folder(tmp_path).samples]
    options = EncodeOptions()
    got = encode_module.encode_chunk(str(tmp_path), samples, options)
    want = [encode_file(str(tmp_path), sample, options) for sample in samples]
    assert got == want
    assert any(isinstance(item, Skipped) for item in got) and any(isinstance(item, Encoded) for item in got)


def _items(count: int) -> list[Encoded]:
    rng = np.random.default_rng(count)
    items = []
    for i in range(count):
        payload = rng.integers(0, 256, int(rng.integers(1, 3000)), np.uint8).tobytes()
        items.append(Encoded(f"c{i % 3}/{i}.png", i % 3, payload, 10 + i, 20, ("RGB", "L", "P")[i % 3],
                             ("PNG", "JPEG", "other")[i % 3], i % 9, len(payload), zlib.crc32(payload)))
    return items


@pytest.mark.parametrize("backend", ["shards", "lmdb"])
def test_write_many_writes_what_write_writes(tmp_path, backend):
    """Records written a run at a time land in the same parts, at the same offsets, as one at a time."""
    items = _items(200)
    outputs = []
    for how in ("one", "many"):
        if backend == "shards":
            folder = tmp_path / f"{how}.shards"
            folder.mkdir()
            writer = ShardsWriter(folder, 64 << 10)
        else:
            writer = LmdbWriter(tmp_path / f"{how}.lmdb", 1 << 26, chunk_size=16 << 10)
        if how == "one":
            for item in items:
                writer.write(item)
        else:
            for start in range(0, len(items), 64):
                writer.write_many(items[start : start + 64])
        manifest = writer.finish({"records": writer.index.count})
        parts = manifest["parts"]
        outputs.append((writer.index.to_bytes(), parts, writer.index.payload_bytes))
    assert outputs[0] == outputs[1]
    assert len(outputs[0][1]) > 1 if backend == "shards" else outputs[0][1]["chunks"] > 1  # runs crossed parts


def test_appender_survives_short_writes(tmp_path, monkeypatch):
    """Large pieces go out with ``writev``; a short write goes on from where it stopped."""
    real = os.writev

    def short(fd, buffers):
        return real(fd, [bytes(b"".join(bytes(b) for b in buffers)[:5000])])

    monkeypatch.setattr(append_file.os, "writev", short)
    pieces = [os.urandom(n) for n in (100, 20000, 0, 9000, 1, 70000) * 5]
    appender = append_file.HashingAppender(tmp_path / "f", direct=False)  # the page-cache path
    for piece in pieces:
        appender.write(piece)
    digest = appender.close()
    data = b"".join(pieces)
    assert (tmp_path / "f").read_bytes() == data and digest == hashlib.sha256(data).hexdigest()


def test_slow_reads_move_to_worker_threads(tmp_path, monkeypatch):
    """Reading starts on the writing thread and moves to worker threads when runs are slow; the pack
    is the same either way."""
    make_image_folder(tmp_path / "src", classes=("a", "b"), per_class=20, seed=4)
    write_broken_files(tmp_path / "src" / "b")
    monkeypatch.setattr(encode_stream, "CHUNK_FILES", 4)
    packs = {}
    for name, seconds in (("inline", 1.0), ("threads", 0.0)):
        monkeypatch.setattr(encode_stream, "INLINE_SECONDS_PER_FILE", seconds)
        threads = []
        real = encode_stream.encode_chunk

        def noting(root, samples, options, real=real, threads=threads):
            threads.append(threading.current_thread() is threading.main_thread())
            return real(root, samples, options)

        monkeypatch.setattr(encode_stream, "encode_chunk", noting)
        pack(tmp_path / "src", tmp_path / f"{name}.shards", workers=2, progress=False)
        packs[name] = tmp_path / f"{name}.shards"
        assert all(threads) if name == "inline" else threads[: encode_stream.SLOW_RUNS] == [True] * encode_stream.SLOW_RUNS
        assert name == "inline" or not any(threads[encode_stream.SLOW_RUNS :])
    for file in ("index.bin", "shard-00000.bin"):
        assert (packs["inline"] / file).read_bytes() == (packs["threads"] / file).read_bytes()
    manifests = [json.loads((path / "manifest.json").read_text()) for path in packs.values()]
    for manifest in manifests:
        del manifest["created"], manifest["id"]
    assert manifests[0] == manifests[1] and manifests[0]["skipped"]


needs_simplejpeg = pytest.mark.skipif(encode_module.simplejpeg is None, reason="simplejpeg not installed")


@needs_simplejpeg
@pytest.mark.parametrize("encoding", ["jpeg", "raw", "png"])
@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("size", [(500, 375), (375, 500), (300, 200), (200, 120), (1100, 700)])
def test_fast_reencode_is_close_to_pil(tmp_path, encoding, mode, size):
    """libjpeg-turbo + PyTorch's resize vs PIL's draft + resize: the same size, nearly the same pixels."""
    data = _jpeg(textured_rgb(size, seed=size[0]), mode)
    (tmp_path / "x.jpg").write_bytes(data)
    options = EncodeOptions(encoding=encoding, max_side=256)
    fast = encode_file(str(tmp_path), Sample("x.jpg", 0), options)
    with Image.open(io.BytesIO(data)) as image:
        payload, width, height, out_mode, fmt = _reencode(image, options)
    assert (fast.width, fast.height, fast.mode, fast.format) == (width, height, out_mode, fmt)
    assert max(width, height) == min(256, max(size)) and fast.crc32 == zlib.crc32(fast.payload)
    if encoding == "raw":
        got, want = (np.frombuffer(p, np.uint8).reshape(height, width, 3) for p in (fast.payload, payload))
    else:
        got, want = (np.asarray(Image.open(io.BytesIO(p)).convert("RGB")) for p in (fast.payload, payload))
    assert got.shape == want.shape
    diff = np.abs(got.astype(int) - want.astype(int))
    if encoding == "jpeg":  # two JPEG encoders' rounding on top of the resize's
        assert diff.mean() < 0.5, (size, mode)
    else:  # lossless: only the resize differs, by at most 1
        assert diff.max() <= 1, (size, mode)
    if mode == "L":
        assert np.array_equal(got[..., 0], got[..., 2])


@needs_simplejpeg
def test_fast_reencode_leaves_bad_files_to_pil(tmp_path):
    data = _jpeg(textured_rgb((300, 200)))
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) // 2])
    (tmp_path / "cmyk.jpg").write_bytes(_jpeg(textured_rgb((300, 200)), "CMYK"))
    options = EncodeOptions(encoding="jpeg", max_side=128)
    assert "truncated JPEG" in encode_file(str(tmp_path), Sample("cut.jpg", 0), options).reason
    cmyk = encode_file(str(tmp_path), Sample("cmyk.jpg", 0), options)
    assert (cmyk.width, cmyk.mode) == (128, "RGB")


@needs_simplejpeg
def test_max_side_pack_on_threads(tmp_path):
    """Re-encoding runs on threads when libjpeg-turbo is there; the pack reads back at the right sizes."""
    src = tmp_path / "src"
    sizes = [(400, 300), (300, 400), (100, 80), (640, 100)]
    for k, size in enumerate(sizes):
        (src / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
        (src / f"c{k % 2}" / f"{k}.jpg").write_bytes(_jpeg(textured_rgb(size, seed=k)))
    for encoding in ("jpeg", "raw"):
        options = EncodeOptions(encoding=encoding, max_side=200)
        assert use_threads(options, scan_folder(src).samples)
        dst = tmp_path / f"{encoding}.shards"
        pack(src, dst, options=options, workers=2, progress=False)
        ds = PackedImageFolder(dst, output="numpy")
        got = sorted(ds[i][0].shape[:2] for i in range(len(ds)))
        assert got == sorted([(150, 200), (200, 150), (80, 100), (31, 200)])


@needs_simplejpeg
def test_png_sources_are_reencoded_in_processes(tmp_path, monkeypatch):
    """PIL decodes PNGs holding the GIL: re-encoding a folder of mostly PNGs goes to processes, a
    folder of mostly JPEGs to threads, and the pack is the same either way."""
    pngs = [Sample(f"c/{k}.png", 0) for k in range(30)]
    jpegs = [Sample(f"c/{k}.JPG", 0) for k in range(30)]
    raw = EncodeOptions(encoding="raw")
    assert not use_threads(raw, pngs) and not use_threads(raw, pngs + jpegs[:10])
    assert use_threads(raw, jpegs) and use_threads(raw, jpegs + pngs)
    assert use_threads(EncodeOptions(), pngs)  # keep: reading and checking only
    make_image_folder(tmp_path / "src", classes=("a", "b"), per_class=6, seed=8)
    packs = {}
    for name, threads in (("processes", False), ("threads", True)):
        monkeypatch.setattr(encode_stream, "use_threads", lambda options, samples=(), threads=threads: threads)
        pack(tmp_path / "src", tmp_path / f"{name}.shards", options=raw, workers=2, progress=False)
        ds = PackedImageFolder(tmp_path / f"{name}.shards", output="bytes")
        packs[name] = [ds[i] for i in range(len(ds))]
    assert packs["processes"] == packs["threads"] and len(packs["threads"]) == 12
