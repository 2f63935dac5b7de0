"""Checking one source image and turning it into a record payload (``packload.packer.encode``):
kept bytes as they are, PNG and raw pixels exactly the image's, JPEG close to them, sizes from
``--max-side`` and ``--size``, EXIF orientation noted, broken files skipped with their reason, and
the options refused when they contradict each other."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packload.core.scan import Sample
from packload.packer.encode import (
    Encoded,
    EncodeOptions,
    Skipped,
    encode_chunk,
    encode_file,
    resize_rgb,
    truncation_problem,
)
from tests.image_factory import EXIF_ORIENTATION, textured_rgb, write_broken_files, write_image


def _rgb(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


@pytest.fixture()
def images(tmp_path: Path) -> Path:
    write_image(tmp_path / "a" / "photo.jpg", size=(64, 48), seed=1, quality=95)
    write_image(tmp_path / "a" / "alpha.png", mode="RGBA", size=(40, 30), seed=2)
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = 6
    write_image(tmp_path / "a" / "turned.jpg", size=(48, 32), seed=3, exif=exif.tobytes())
    return tmp_path


def test_keep_stores_the_file_and_what_its_header_says(images: Path) -> None:
    for name, fmt, mode, size, orientation in (("photo.jpg", "JPEG", "RGB", (64, 48), 0),
                                               ("alpha.png", "PNG", "RGBA", (40, 30), 0),
                                               ("turned.jpg", "JPEG", "RGB", (48, 32), 6)):
        item = encode_file(str(images), Sample(f"a/{name}", 3), EncodeOptions())
        assert isinstance(item, Encoded), item
        data = (images / "a" / name).read_bytes()
        assert (item.payload, item.source_bytes, item.label) == (data, len(data), 3)
        assert (item.format, item.mode, (item.width, item.height), item.orientation) == (fmt, mode, size, orientation)


def test_png_and_raw_store_the_images_pixels_exactly(images: Path) -> None:
    for name in ("photo.jpg", "alpha.png"):
        want = _rgb(images / "a" / name)
        png = encode_file(str(images), Sample(f"a/{name}", 0), EncodeOptions(encoding="png"))
        raw = encode_file(str(images), Sample(f"a/{name}", 0), EncodeOptions(encoding="raw"))
        assert isinstance(png, Encoded) and isinstance(raw, Encoded)
        assert png.format == "PNG" and np.array_equal(np.asarray(Image.open(io.BytesIO(png.payload))), want)
        assert (raw.format, raw.mode, raw.width, raw.height) == ("raw", "RGB", want.shape[1], want.shape[0])
        assert raw.payload == want.tobytes()


def test_jpeg_re_encoding_and_sizes(images: Path) -> None:
    want = _rgb(images / "a" / "photo.jpg")
    jpeg = encode_file(str(images), Sample("a/photo.jpg", 0), EncodeOptions(encoding="jpeg", quality=95))
    assert isinstance(jpeg, Encoded) and jpeg.format == "JPEG" and (jpeg.width, jpeg.height) == (64, 48)
    decoded = np.asarray(Image.open(io.BytesIO(jpeg.payload)).convert("RGB")).astype(int)
    assert np.abs(decoded - want).mean() < 4
    small = encode_file(str(images), Sample("a/photo.jpg", 0), EncodeOptions(encoding="png", max_side=32))
    assert isinstance(small, Encoded) and (small.width, small.height) == (32, 24)  # longer side 32, aspect kept
    exact = encode_file(str(images), Sample("a/alpha.png", 0), EncodeOptions(encoding="raw", size=(20, 25)))
    assert isinstance(exact, Encoded) and (exact.height, exact.width) == (20, 25) and len(exact.payload) == 20 * 25 * 3


def test_broken_files_are_skipped_with_their_reason(tmp_path: Path) -> None:
    kinds = write_broken_files(tmp_path / "a")
    got = encode_chunk(str(tmp_path), [Sample(f"a/{name}", 0) for name in sorted(kinds)], EncodeOptions())
    assert all(isinstance(item, Skipped) for item in got)
    reasons = {item.path: item.reason for item in got}
    assert reasons["a/empty.jpg"] == "empty file (0 bytes)"
    assert "truncated JPEG" in reasons["a/truncated.jpg"] and "truncated PNG" in reasons["a/truncated.png"]
    assert "--max-pixels" in reasons["a/bomb.png"]
    assert reasons["a/not_an_image.png"]
    missing = encode_file(str(tmp_path), Sample("a/gone.jpg", 0), EncodeOptions())
    assert isinstance(missing, Skipped) and missing.reason.startswith("unreadable")


def test_truncation_problem_and_resize_rgb() -> None:
    jpeg = io.BytesIO()
    Image.fromarray(textured_rgb((32, 24), 5)).save(jpeg, "JPEG")
    data = jpeg.getvalue()
    assert truncation_problem(data, "JPEG") is None and truncation_problem(data[:-2], "JPEG") is not None
    assert truncation_problem(data + b"trailing", "JPEG") is None  # an end marker after the last scan
    pixels = textured_rgb((64, 48), 7)
    half = resize_rgb(pixels, (32, 24))
    pil = np.asarray(Image.fromarray(pixels).resize((32, 24), Image.Resampling.BILINEAR, reducing_gap=3.0))
    assert half.shape == (24, 32, 3) and np.abs(half.astype(int) - pil).max() <= 1
    assert resize_rgb(pixels, (80, 60)).shape == (60, 80, 3)  # enlarging goes through PIL


def test_options_that_contradict_each_other_are_refused() -> None:
    for kwargs, match in (({"encoding": "gif"}, "unknown encoding"), ({"check": "some"}, "fast or full"),
                          ({"quality": 0}, "out of range"), ({"max_side": 64}, "re-encodes images"),
                          ({"encoding": "jpeg", "size": (8, 8)}, "raw only"),
                          ({"encoding": "raw", "size": (0, 8)}, "positive")):
        with pytest.raises(ValueError, match=match):
            EncodeOptions(**kwargs)
