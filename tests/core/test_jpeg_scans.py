"""The count of a JPEG's scans and the bound on it (``packload.core.jpeg_scans``)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from packload.core.jpeg_scans import (
    MAX_JPEG_SCANS,
    TooManyScansError,
    check_scans,
    count_scans,
    too_many_scans,
)
from tests.image_factory import textured_rgb
from tests.jpeg_scan_factory import many_scan_jpeg, progressive_jpeg, scans_in


def _baseline(size: tuple[int, int] = (64, 48), **save: object) -> bytes:
    out = io.BytesIO()
    Image.fromarray(textured_rgb(size, 3)).save(out, "JPEG", quality=90, **save)
    return out.getvalue()


def test_baseline_has_one_scan() -> None:
    assert count_scans(_baseline()) == 1
    assert count_scans(memoryview(_baseline())) == 1


def test_progressive_counts_as_written() -> None:
    data = progressive_jpeg()
    assert count_scans(data) == scans_in(data) == 10
    grey = io.BytesIO()
    Image.fromarray(textured_rgb((40, 40), 1)[..., 0]).save(grey, "JPEG", progressive=True)
    assert count_scans(grey.getvalue()) == scans_in(grey.getvalue())


def test_restart_markers_and_stuffed_bytes_stay_inside_the_scan() -> None:
    data = _baseline((96, 96), restart_marker_blocks=1)
    assert data.count(b"\xff\xd0") > 0 and data.count(b"\xff\x00") > 0
    assert count_scans(data) == 1
    prog = progressive_jpeg((96, 96), restart_marker_blocks=2)
    assert count_scans(prog) == scans_in(prog) == 10


def test_a_thumbnail_inside_exif_is_not_counted() -> None:
    """An APP1 segment may hold a whole JPEG (its SOS included): segments are skipped by length."""
    thumb = many_scan_jpeg(MAX_JPEG_SCANS + 50, size=(8, 8))
    assert len(thumb) < 65000
    data = _baseline()
    app1 = b"\xff\xe1" + (len(thumb) + 8).to_bytes(2, "big") + b"Exif\0\0" + thumb
    crafted = data[:2] + app1 + data[2:]
    assert count_scans(crafted) == 1
    assert not too_many_scans(crafted)
    Image.open(io.BytesIO(crafted)).load()  # a JPEG decoders accept


@pytest.mark.parametrize("scans", [10, 11, MAX_JPEG_SCANS - 1, MAX_JPEG_SCANS])
def test_within_the_bound_is_accepted(scans: int) -> None:
    data = many_scan_jpeg(scans)
    assert count_scans(data) == scans
    assert not too_many_scans(data)
    check_scans(data, "x.jpg")
    assert Image.open(io.BytesIO(data)).convert("RGB").size == (64, 64)  # it is a JPEG PIL decodes


@pytest.mark.parametrize("scans", [MAX_JPEG_SCANS + 1, 2000, 20_000])
def test_past_the_bound_is_refused(scans: int) -> None:
    data = many_scan_jpeg(scans)
    assert count_scans(data) == MAX_JPEG_SCANS + 1  # stops there
    assert count_scans(data, stop_after=10**9) == scans
    assert too_many_scans(data) and too_many_scans(memoryview(data))
    with pytest.raises(TooManyScansError, match=r"^cls/x\.jpg: progressive JPEG with more than 500 scans") as info:
        check_scans(data, "cls/x.jpg")
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)  # decoders' errors: handled as an undecodable record


def test_walk_stops_after_the_asked_count() -> None:
    data = many_scan_jpeg(300)
    assert count_scans(data, stop_after=7) == 7
    assert count_scans(data, stop_after=1) == 1


def test_nothing_after_the_end_of_image_is_counted() -> None:
    """A decoder stops at EOI; scans after it (a second image, say) are never decoded."""
    data = _baseline() + many_scan_jpeg(MAX_JPEG_SCANS + 5)
    assert count_scans(data) == 1
    assert not too_many_scans(data)


def test_garbage_between_segments_is_skipped_as_decoders_do() -> None:
    """libjpeg skips bytes out of place up to the next marker, so the count must too: junk cannot
    hide scans."""
    data = many_scan_jpeg(MAX_JPEG_SCANS + 1)
    cut = data.index(b"\xff\xda")
    junked = data[:cut] + b"junk\x00\x01" + data[cut:]
    assert count_scans(junked) == MAX_JPEG_SCANS + 1
    filled = data[:cut] + b"\xff\xff\xff" + data[cut:]
    assert count_scans(filled) == MAX_JPEG_SCANS + 1


def test_not_a_jpeg_counts_nothing() -> None:
    png = io.BytesIO()
    Image.new("RGB", (4, 4)).save(png, "PNG")
    for data in (b"", b"\xff", b"\xff\xd8", png.getvalue(), b"\xff\xda" * 1000):
        assert count_scans(data) == 0
        assert not too_many_scans(data)
        check_scans(data, "x")


@pytest.mark.parametrize("cut", [3, 4, 5, 20, 100, 600, 1000])
def test_truncated_jpegs_do_not_raise(cut: int) -> None:
    data = many_scan_jpeg(40)[:cut]
    assert 0 <= count_scans(data) <= 40


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.integers(0, 2000), st.data())
def test_damaged_data_never_raises(noise: bytes, where: int, draw: st.DataObject) -> None:
    base = many_scan_jpeg(12, size=(16, 16))
    where = min(where, len(base))
    data = base[:where] + noise + base[where + draw.draw(st.integers(0, 50)):]
    count = count_scans(data)
    assert 0 <= count <= MAX_JPEG_SCANS + 1
    too_many_scans(data)
    assert count_scans(b"\xff\xd8\xff" + noise) >= 0


def test_lengths_that_point_anywhere_do_not_raise() -> None:
    rng = np.random.default_rng(0)
    data = bytearray(progressive_jpeg())
    for _ in range(200):
        damaged = bytearray(data)
        for pos in rng.integers(2, len(data), 4):
            damaged[pos] = int(rng.integers(0, 256))
        assert count_scans(bytes(damaged)) >= 0


def test_the_shortest_scans_still_count() -> None:
    """Scans of no data and the shortest header (10 bytes each): the smallest file past the bound is
    still refused, however short (the length shortcut never lets one through)."""
    scan = b"\xff\xda\x00\x08\x01\x01\x00\x00\x3f\x00"
    for count, refused in ((MAX_JPEG_SCANS, False), (MAX_JPEG_SCANS + 1, True)):
        data = b"\xff\xd8" + scan * count + b"\xff\xd9"
        assert count_scans(data, stop_after=10**6) == count
        assert too_many_scans(data) is refused


def test_the_error_is_packloads_and_a_decoders() -> None:
    from packload.core.errors import PackloadError

    assert issubclass(TooManyScansError, PackloadError) and issubclass(TooManyScansError, ValueError)
