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
