"""The compiled batch decoder (``packload/core/jpeg_kernel.py``): given JPEG payloads and their boxes it
writes simplejpeg's pixels resized by the resize kernel (mirrored where asked) into the slots,
nothing outside them, and leaves alone what it must not take: bytes that are not a JPEG, a JPEG of
another size than the geometry says, CMYK, damaged data; switched off, or unbuilt, it does nothing
and says why."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from packload.core import jpeg_kernel, resize_kernel
from packload.loaders.decode import dct_scales
from tests.image_factory import textured_rgb

simplejpeg = pytest.importorskip("simplejpeg", reason="simplejpeg (the dev extra) gives the reference pixels")
needs_decoder = pytest.mark.skipif(not jpeg_kernel.available(),
                                   reason=f"compiled batch decoder not in use: {jpeg_kernel.unavailable_reason()}")

OUT = 32


def _jpeg(width: int, height: int, seed: int, mode: str = "RGB", **options: object) -> bytes:
    image = Image.fromarray(textured_rgb((width, height), seed)).convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90, **options)
    return buffer.getvalue()


def _reference(data: bytes, min_size: tuple[int, int], box: tuple[int, int, int, int], mirror: bool,
               fast_idct: bool = False) -> np.ndarray:
    """simplejpeg's decode, the box resized by the resize kernel, then mirrored: the one-by-one route."""
    pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=fast_idct, min_height=min_size[0],
                                    min_width=min_size[1])
    top, left, box_h, box_w = box
    region = np.ascontiguousarray(pixels[top : top + box_h, left : left + box_w])
    out = np.empty((OUT, OUT, 3), dtype=np.uint8)
    if (box_h, box_w) == (OUT, OUT):
        out[:] = region
    else:
        assert resize_kernel.resize_region(region.ctypes.data, region.strides[0], box_h, box_w, out.ctypes.data,
                                           out.strides[0], OUT, OUT)
    return out[:, ::-1] if mirror else out


def _run(payloads: list[bytes], geometry: list[list[int]], mirror: list[bool],
         fast_idct: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """decode_boxes into a batch whose rows are wider than a slot (a guard after each slot's pixels)."""
    arrays = [np.frombuffer(data, np.uint8) for data in payloads]
    count = len(payloads)
    batch = np.full((count, OUT, OUT + 2, 3), 7, dtype=np.uint8)
    done = jpeg_kernel.decode_boxes(np.array([a.ctypes.data for a in arrays], dtype=np.uint64),
                                    np.array([a.nbytes for a in arrays], dtype=np.uint64),
                                    np.array(geometry, dtype=np.int32), np.array(mirror),
                                    np.array([batch[k].ctypes.data for k in range(count)], dtype=np.uint64),
                                    batch.strides[1], OUT, fast_idct)
    return done, batch


@needs_decoder
def test_slots_get_the_one_by_one_routes_pixels() -> None:
    cases = [  # (jpeg, min decode size, scale n/8 and decode size, box in the decoded image, mirror)
        (_jpeg(64, 48, 1), (0, 0), (8, 48, 64), (3, 5, 40, 50), False),
        (_jpeg(61, 47, 2, subsampling=1), (0, 0), (8, 47, 61), (0, 0, 47, 61), True),
        (_jpeg(300, 220, 3), (83, 113), (3, 83, 113), (5, 20, 60, 45), False),  # at 3/8 scale
        (_jpeg(200, 150, 4, progressive=True), (75, 100), (4, 75, 100), (10, 10, OUT, OUT), True),  # copied
        (_jpeg(90, 70, 5, mode="L"), (0, 0), (8, 70, 90), (2, 3, 50, 64), False),
        (_jpeg(97, 131, 6, restart_marker_blocks=2, subsampling=0), (0, 0), (8, 131, 97), (50, 1, 20, 9), True),
        (_jpeg(7, 5, 8), (5, 7), (8, 5, 7), (1, 1, 4, 6), True),  # 7/8 gives this size too, with other pixels
    ]
    for fast_idct in (False, True):
        geometry = []
        for data, min_size, decoded, box, _ in cases:
            height, width = simplejpeg.decode_jpeg_header(data)[:2]
            assert dct_scales(height, width, *min_size) == decoded[0], "the scale simplejpeg decodes at"
            geometry.append([height, width, *decoded, *box])
        done, batch = _run([c[0] for c in cases], geometry, [c[4] for c in cases], fast_idct)
        assert done.tolist() == [True] * len(cases)
        for k, (data, min_size, _, box, mirror) in enumerate(cases):
            want = _reference(data, min_size, box, mirror, fast_idct)
            assert np.array_equal(batch[k, :, :OUT], want), k
        assert (batch[:, :, OUT:] == 7).all(), "nothing written past a slot's row"


@needs_decoder
def test_what_it_must_not_take_is_left_untouched() -> None:
    good = _jpeg(40, 30, 7)
    cmyk = _jpeg(40, 30, 8, mode="CMYK")
    data = bytearray(good)
    start = data.index(b"\xff\xda") + 30
    data[start : start + 20 : 2] = b"\xff" * 10  # damaged entropy-coded data: libjpeg-turbo warns
    payloads = [b"\x89PNG\r\n\x1a\n" + good[8:], good, cmyk, bytes(data), good, good[:2]]
    geometry = [[30, 40, 8, 30, 40, 0, 0, 30, 40]] * len(payloads)
    geometry[1] = [31, 40, 8, 31, 40, 0, 0, 30, 40]  # the index says another size
    done, batch = _run(payloads, geometry, [False] * len(payloads))
    assert done.tolist() == [False, False, False, False, True, False]
    untouched = np.ones(len(payloads), dtype=bool)
    untouched[4] = False
    assert (batch[untouched] == 7).all()


@needs_decoder
def test_switched_off_it_does_nothing_and_says_why() -> None:
    good = _jpeg(40, 30, 9)
    jpeg_kernel.set_enabled(False)
    try:
        assert not jpeg_kernel.available()
        assert "set_enabled(False)" in (jpeg_kernel.unavailable_reason() or "")
        done, batch = _run([good], [[30, 40, 8, 30, 40, 0, 0, 30, 40]], [False])
        assert not done.any() and (batch == 7).all()
    finally:
        jpeg_kernel.set_enabled(True)
    assert jpeg_kernel.available() and jpeg_kernel.unavailable_reason() is None


def test_without_the_resize_kernel_nothing_is_decoded() -> None:
    resize_kernel.set_enabled(False)
    try:
        assert not jpeg_kernel.available()
        assert jpeg_kernel.unavailable_reason()
        done, batch = _run([_jpeg(40, 30, 10)], [[30, 40, 8, 30, 40, 0, 0, 30, 40]], [False])
        assert not done.any() and (batch == 7).all()
    finally:
        resize_kernel.set_enabled(True)


def test_an_empty_batch_is_nothing_to_do() -> None:
    empty = np.zeros(0, dtype=np.uint64)
    done = jpeg_kernel.decode_boxes(empty, empty, np.zeros((0, jpeg_kernel.GEOMETRY_FIELDS), np.int32), np.zeros(0, bool), empty, 96, OUT,
                                    False)
    assert done.shape == (0,)


@needs_decoder
def test_raw_records_are_resized_where_they_lie() -> None:
    image = textured_rgb((50, 40), 11)  # 40 rows of 50 pixels, as a raw payload stores them
    box = (3, 4, 30, 41)
    region = np.ascontiguousarray(image[3:33, 4:45])
    want = np.empty((OUT, OUT, 3), dtype=np.uint8)
    assert resize_kernel.resize_region(region.ctypes.data, region.strides[0], 30, 41, want.ctypes.data,
                                       want.strides[0], OUT, OUT)
    payloads = [image.tobytes(), image.tobytes()[:-3]]  # the second is not the index's size
    arrays = [np.frombuffer(data, np.uint8) for data in payloads]
    batch = np.full((2, OUT, OUT, 3), 7, dtype=np.uint8)
    done = jpeg_kernel.decode_boxes(np.array([a.ctypes.data for a in arrays], dtype=np.uint64),
                                    np.array([a.nbytes for a in arrays], dtype=np.uint64),
                                    np.array([[40, 50, 8, 40, 50, *box]] * 2, dtype=np.int32), np.array([True, False]),
                                    np.array([batch[0].ctypes.data, batch[1].ctypes.data], dtype=np.uint64),
                                    batch.strides[1], OUT, False, raw=np.array([True, True]))
    assert done.tolist() == [True, False]
    assert np.array_equal(batch[0], want[:, ::-1]) and (batch[1] == 7).all()


# --- decoding only the box ---------------------------------------------------------------------------


def _encodings() -> list[tuple[str, bytes]]:
    """JPEGs of every kind the decoder meets: each chroma subsampling (PIL writes 4:4:4, 4:2:2 and
    4:2:0; simplejpeg 4:4:0 and 4:1:1), progressive, restart markers, greyscale, odd and tiny sizes."""
    found = []
    for width, height in ((53, 37), (97, 123), (301, 200), (9, 17), (16, 16)):
        for subsampling in (0, 1, 2):
            found.append((f"{width}x{height} sub{subsampling}", _jpeg(width, height, width, subsampling=subsampling)))
        found.append((f"{width}x{height} progressive", _jpeg(width, height, 1, progressive=True, subsampling=2)))
        found.append((f"{width}x{height} restarts", _jpeg(width, height, 2, restart_marker_blocks=1, subsampling=1)))
        found.append((f"{width}x{height} grey", _jpeg(width, height, 3, mode="L")))
        found.append((f"{width}x{height} grey progressive", _jpeg(width, height, 4, mode="L", progressive=True)))
        pixels = textured_rgb((width, height), 5)
        for subsampling in ("440", "411"):
            found.append((f"{width}x{height} {subsampling}", simplejpeg.encode_jpeg(pixels, 85,
                                                                                   colorsubsampling=subsampling)))
    return found


def _boxes(height: int, width: int, rng: np.random.Generator) -> set[tuple[int, int, int, int]]:
    """The whole image, 1-pixel boxes at each corner, a row and a column at each edge, and random ones."""
    boxes = {(0, 0, height, width), (0, 0, 1, 1), (0, width - 1, 1, 1), (height - 1, 0, 1, 1),
             (height - 1, width - 1, 1, 1), (0, 0, 1, width), (height - 1, 0, 1, width), (0, 0, height, 1),
             (0, width - 1, height, 1)}
    for _ in range(6):
        top, left = int(rng.integers(0, height)), int(rng.integers(0, width))
        boxes.add((top, left, int(rng.integers(1, height - top + 1)), int(rng.integers(1, width - left + 1))))
    return boxes


@needs_decoder
def test_a_box_decoded_alone_is_the_full_decodes_box_at_every_scale() -> None:
    """Stated precision: a box decoded alone (only its rows and iMCU columns) has exactly the pixels of
    the same box of the whole image decoded at the same scale, which are simplejpeg's."""
    rng = np.random.default_rng(0)
    for name, data in _encodings():
        height, width = simplejpeg.decode_jpeg_header(data)[:2]
        for scale in range(1, 9):
            jpeg_kernel.set_crop_first(False)
            try:
                whole = jpeg_kernel.decode_region(data, height, width, scale, (0, 0, -(-height * scale // 8),
                                                                             -(-width * scale // 8)))
            finally:
                jpeg_kernel.set_crop_first(True)
            assert whole is not None, name
            if scale == 8:
                assert np.array_equal(whole, simplejpeg.decode_jpeg(data, colorspace="RGB")), name
            for top, left, box_h, box_w in _boxes(*whole.shape[:2], rng):
                box = jpeg_kernel.decode_region(data, height, width, scale, (top, left, box_h, box_w))
                assert box is not None and np.array_equal(box, whole[top : top + box_h, left : left + box_w]), \
                    (name, scale, (top, left, box_h, box_w))


@needs_decoder
def test_what_a_box_decode_refuses() -> None:
    data = _jpeg(64, 48, 12)
    assert jpeg_kernel.decode_region(data, 48, 64, 8, (0, 0, 48, 64)) is not None
    assert jpeg_kernel.decode_region(data, 24, 32, 8, (0, 0, 24, 32)) is None, "the index says 32x24"
    assert jpeg_kernel.decode_region(data, 96, 128, 4, (0, 0, 48, 64)) is None, "the index says 128x96"
    assert jpeg_kernel.decode_region(data, 48, 64, 8, (40, 0, 9, 64)) is None, "rows past the image"
    assert jpeg_kernel.decode_region(data, 48, 64, 8, (0, -1, 48, 10)) is None, "columns before the image"
    assert jpeg_kernel.decode_region(data, 48, 64, 7, (0, 0, 48, 64)) is None, "7/8 gives 42x56, not 48x64"
    assert jpeg_kernel.decode_region(data, 48, 64, 9, (0, 0, 54, 72)) is None, "no scale above 8/8"
    for cut in (2, 3, 20, 200, len(data) // 2, len(data) - 2):  # truncated: libjpeg-turbo warns
        assert jpeg_kernel.decode_region(data[:cut], 48, 64, 8, (0, 0, 48, 64)) is None, cut
    assert jpeg_kernel.decode_region(b"", 48, 64, 8, (0, 0, 48, 64)) is None


@needs_decoder
def test_a_progressive_jpeg_of_more_scans_than_allowed_is_left_to_the_general_route() -> None:
    from tests.jpeg_scan_factory import many_scan_jpeg, scans_in

    data = _jpeg(80, 64, 13, progressive=True)
    scans = scans_in(data)
    assert scans > 2
    assert jpeg_kernel.decode_region(data, 64, 80, 8, (5, 5, 30, 30), max_scans=scans) is not None
    assert jpeg_kernel.decode_region(data, 64, 80, 8, (5, 5, 30, 30), max_scans=scans - 1) is None
    many = many_scan_jpeg(3000)  # repeated scans: libjpeg-turbo warns at the first, and it stops there
    assert jpeg_kernel.decode_region(many, 64, 64, 8, (0, 0, 64, 64)) is None


def _fake_library(folder, source: str, name: str = "libjpeg-fake.so"):
    """A shared library ``name`` compiled from ``source`` (C), or a skip where no compiler is here."""
    import shutil
    import subprocess

    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler to build a stand-in library")
    (folder / "fake.c").write_text(source)
    library = folder / name
    subprocess.run([compiler, "-shared", "-fPIC", str(folder / "fake.c"), "-o", str(library)], check=True)
    return library


# A libjpeg of another ABI, as jpeg_CreateDecompress refuses a caller built for 6.2.
_OTHER_ABI = r"""
#include <stdio.h>
#include <string.h>
typedef struct err { void (*error_exit)(void *); void (*emit_message)(void *, int); void (*output_message)(void *);
                     void (*format_message)(void *, char *); } err;
typedef struct common { err *e; } common;
static void format(void *cinfo, char *buffer) { strcpy(buffer, "Wrong JPEG library version: library is 80, caller expects 62"); }
err *jpeg_std_error(err *e) { memset(e, 0, sizeof(*e)); e->format_message = format; return e; }
void jpeg_CreateDecompress(common *cinfo, int version, size_t size) { if (version != 80) cinfo->e->error_exit(cinfo); }
void jpeg_destroy_decompress(void *c) {}
void jpeg_mem_src(void *c, const unsigned char *b, unsigned long n) {}
int jpeg_read_header(void *c, int r) { return 0; }
int jpeg_start_decompress(void *c) { return 0; }
void jpeg_crop_scanline(void *c, unsigned *x, unsigned *w) {}
unsigned jpeg_skip_scanlines(void *c, unsigned n) { return 0; }
unsigned jpeg_read_scanlines(void *c, void *rows, unsigned n) { return 0; }
void jpeg_abort_decompress(void *c) {}
"""


@needs_decoder
def test_a_library_of_another_abi_or_without_the_api_is_refused_with_the_reason(tmp_path) -> None:
    extension, why = jpeg_kernel._extension()
    assert extension is not None, why
    decoder, said = jpeg_kernel._bind(extension, str(_fake_library(tmp_path, _OTHER_ABI)), "the system")
    assert decoder is None
    assert "libjpeg-fake.so from the system is not the libjpeg 6.2 ABI" in said and "library is 80" in said
    empty = _fake_library(tmp_path, "int nothing_here;", "libempty.so")
    decoder, said = jpeg_kernel._bind(extension, str(empty), "the system")
    assert decoder is None and "cannot be used" in said and "jpeg_std_error" in said


@needs_decoder
def test_the_library_is_found_at_run_time_pillows_first(monkeypatch, tmp_path) -> None:
    found = jpeg_kernel._candidates()
    assert found and "Pillow" in found[0][1], found
    assert "Pillow" in (jpeg_kernel.description() or "") or "system" in (jpeg_kernel.description() or "")
    # nothing usable anywhere: the decoder says so, and a batch is decoded one by one
    monkeypatch.setattr(jpeg_kernel, "_state", {})
    monkeypatch.setattr(jpeg_kernel, "_candidates", lambda: [(str(_fake_library(tmp_path, _OTHER_ABI)), "the system")])
    assert not jpeg_kernel.available() and jpeg_kernel.raw_available()
    reason = jpeg_kernel.unavailable_reason() or ""
    assert reason.startswith("no usable libjpeg-turbo was found") and "library is 80" in reason
    monkeypatch.setattr(jpeg_kernel, "_state", {})
    monkeypatch.setattr(jpeg_kernel, "_candidates", lambda: [])
    assert not jpeg_kernel.available()
    assert "no libjpeg-turbo was found" in (jpeg_kernel.unavailable_reason() or "")


def test_a_system_libjpeg_turbo_serves_too() -> None:
    import ctypes.util

    extension, why = jpeg_kernel._extension()
    if extension is None:
        pytest.skip(why)
    system = ctypes.util.find_library("jpeg")
    if system is None:
        pytest.skip("no system libjpeg here")
    decoder, said = jpeg_kernel._bind(extension, system, "the system")
    if decoder is None and "6.2 ABI" in said:
        pytest.skip(f"the system's libjpeg is another ABI: {said}")
    assert decoder is not None, said
    assert decoder.description.endswith("from the system")


def test_the_extension_links_no_libjpeg() -> None:
    """Pillow's libjpeg-turbo is found at run time, by whatever name its wheel gives it: the built
    extension names no library of its own, so a new Pillow (another file name) changes nothing."""
    import shutil
    import subprocess

    try:
        from packload.core import _jpeg_boxes
    except ImportError:
        pytest.skip("the batch decoder was not built")
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("no readelf to list the extension's needed libraries")
    dynamic = subprocess.run([readelf, "-d", _jpeg_boxes.__file__], capture_output=True, text=True).stdout
    needed = [line for line in dynamic.splitlines() if "(NEEDED)" in line]
    assert not any("jpeg" in line for line in needed), needed
