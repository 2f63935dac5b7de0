"""Turning a payload into RGB pixels (``packload.loaders.decode``): what ``Image.open(...).convert
("RGB")`` gives, upright for each EXIF orientation, raw payloads without a copy of the pack's bytes,
a reduced-size decode that is still large enough, and our error for what cannot be decoded."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from packload.core.errors import PackFormatError
from packload.core.probe import NotDecodableError
from packload.loaders import decode
from packload.loaders.decode import decode_array, decode_failure, decode_pil, raw_array, to_output
from tests.image_factory import EXIF_ORIENTATION, textured_rgb


def _encoded(pixels: np.ndarray, fmt: str, **kwargs: object) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt, **kwargs)
    return out.getvalue()


def test_png_and_raw_decode_to_the_exact_pixels() -> None:
    pixels = textured_rgb((30, 20), seed=1)
    png = _encoded(pixels, "PNG")
    assert np.array_equal(decode_array(png, "PNG", "RGB", 30, 20), pixels)
    assert np.array_equal(np.asarray(decode_pil(png, "PNG", 30, 20)), pixels)
    raw = pixels.tobytes()
    view = raw_array(raw, 30, 20)
    assert not view.flags.writeable and np.array_equal(view, pixels)
    out = decode_array(raw, "raw", "RGB", 30, 20)
    assert out.flags.writeable and np.array_equal(out, pixels)  # the caller's own copy
    with pytest.raises(ValueError, match="expected 20x30x3"):
        raw_array(raw[:-1], 30, 20)


def test_jpeg_decodes_as_pil_decodes_it_with_either_decoder() -> None:
    jpeg = _encoded(textured_rgb((64, 48), seed=2), "JPEG", quality=90)
    want = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB")).astype(int)
    for fast in (True, False):
        got = decode_array(jpeg, "JPEG", "RGB", 64, 48, fast_jpeg=fast)
        assert got.shape == (48, 64, 3) and np.abs(got.astype(int) - want).mean() < 1.5, fast
    small = decode_array(jpeg, "JPEG", "RGB", 64, 48, decode_size=(20, 30))  # at least 20 high, 30 wide
    assert small.shape[0] >= 20 and small.shape[1] >= 30 and small.shape[:2] != (48, 64)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_each_exif_orientation_is_shown_upright(orientation: int) -> None:
    pixels = textured_rgb((24, 16), seed=orientation)
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = orientation
    png = _encoded(pixels, "PNG", exif=exif.tobytes())
    want = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(png))).convert("RGB"))
    assert np.array_equal(decode_array(png, "PNG", "RGB", 24, 16, orientation=orientation), want)
    raw = decode_array(pixels.tobytes(), "raw", "RGB", 24, 16, orientation=orientation)
    assert np.array_equal(raw, want)


def test_what_cannot_be_decoded_is_our_error() -> None:
    png = _encoded(textured_rgb((30, 20), seed=3), "PNG")
    with pytest.raises(ValueError, match="the index says 31x20"):
        decode_array(png, "PNG", "RGB", 31, 20)
    icon = io.BytesIO()
    Image.new("RGB", (16, 16)).save(icon, "ICO")
    with pytest.raises(NotDecodableError) as caught:
        decode_pil(icon.getvalue(), "PNG", 16, 16)  # the stored format code is not trusted
    error = decode_failure(caught.value, "record 3")
    assert isinstance(error, PackFormatError) and str(error).startswith("record 3: ")
    bomb = decode_failure(Image.DecompressionBombError("too big"), "record 4")
    assert "MAX_IMAGE_PIXELS" in str(bomb)
    assert "packload verify" in str(decode_failure(OSError("broken data"), "record 5"))


def test_outputs() -> None:
    pixels = textured_rgb((5, 4), seed=4)
    assert np.array_equal(np.asarray(to_output(pixels, "pil")), pixels)
    assert to_output(pixels, "numpy") is pixels
    tensor = to_output(pixels, "tensor")
    assert tensor.shape == (3, 4, 5) and torch.equal(tensor.permute(1, 2, 0), torch.from_numpy(pixels))
    assert decode.fast_jpeg_available() == (decode.simplejpeg is not None)


def test_scaled_sizes_are_simplejpegs_choice() -> None:
    simplejpeg = pytest.importorskip("simplejpeg", reason="simplejpeg (the dev extra) is the reference")
    rng = np.random.default_rng(2)
    for height, width in [(1, 1), (5, 7), (8, 8), (9, 17), (47, 61), (220, 300), (401, 523), (1000, 13)]:
        buffer = io.BytesIO()
        Image.fromarray(textured_rgb((width, height), 1)).save(buffer, "JPEG")
        data = buffer.getvalue()
        wanted = [(0, 0), (height, width), (height + 5, 1), (1, 1)]
        wanted += [(int(h), int(w)) for h, w in zip(rng.integers(1, height + 2, 12), rng.integers(1, width + 2, 12),
                                                   strict=True)]
        wanted += [(int(h), 0) for h in rng.integers(1, height + 2, 3)] + [(0, int(w)) for w in rng.integers(1, width + 2, 3)]
        min_h, min_w = np.array([h for h, _ in wanted]), np.array([w for _, w in wanted])
        got_h, got_w = decode.scaled_sizes(np.full(len(wanted), height), np.full(len(wanted), width), min_h, min_w)
        for k, (h, w) in enumerate(wanted):
            assert (got_h[k], got_w[k]) == simplejpeg.decode_jpeg_header(data, min_height=h, min_width=w)[:2], (h, w)
