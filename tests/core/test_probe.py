"""The fast header probe agrees with PIL on every image it answers for, and defers otherwise."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from packload.core.probe import BombError, probe
from tests.image_factory import decompression_bomb_png, make_image_folder, textured_rgb, write_odd_images


def pil_header(data: bytes) -> tuple:
    with Image.open(io.BytesIO(data)) as im:
        orientation = im.getexif().get(0x0112, 0)
        return im.format, im.width, im.height, im.mode, orientation


def encoded(mode: str, fmt: str, **kwargs) -> bytes:
    image = Image.fromarray(textured_rgb((30, 20), seed=4)).convert(mode)
    out = io.BytesIO()
    image.save(out, fmt, **kwargs)
    return out.getvalue()


VARIANTS = {
    "jpeg-rgb": lambda: encoded("RGB", "JPEG"),
    "jpeg-progressive": lambda: encoded("RGB", "JPEG", progressive=True),
    "jpeg-gray": lambda: encoded("L", "JPEG"),
    "jpeg-cmyk": lambda: encoded("CMYK", "JPEG"),
    "jpeg-444": lambda: encoded("RGB", "JPEG", subsampling=0, quality=97),
    "jpeg-exif-8": lambda: encoded("RGB", "JPEG", exif=_exif(8)),
    "jpeg-exif-big-endian": lambda: encoded("RGB", "JPEG", exif=_exif(3, big_endian=True)),
    "png-rgb": lambda: encoded("RGB", "PNG"),
    "png-interlaced": lambda: encoded("RGB", "PNG", interlace=1),
    "png-rgba": lambda: encoded("RGBA", "PNG"),
    "png-l": lambda: encoded("L", "PNG"),
    "png-la": lambda: encoded("LA", "PNG"),
    "png-p": lambda: encoded("P", "PNG"),
    "png-1": lambda: encoded("1", "PNG"),
    "png-16": lambda: encoded("I;16", "PNG"),
    "png-l-trns": lambda: encoded("L", "PNG", transparency=5),
}


def _exif(orientation: int, big_endian: bool = False) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    exif.endian = ">" if big_endian else "<"
    return exif.tobytes()


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_probe_agrees_with_pil_or_defers(name):
    data = VARIANTS[name]()
    header = probe(data)
    if header is not None:
        assert (header.format, header.width, header.height, header.mode, header.orientation) == pil_header(data)
    if name in ("jpeg-rgb", "jpeg-progressive", "jpeg-gray", "jpeg-cmyk", "jpeg-exif-8", "png-rgb", "png-rgba"):
        assert header is not None, "the common kinds must take the fast path"


def test_probe_on_odd_and_ordinary_files(tmp_path):
    files = make_image_folder(tmp_path / "a", per_class=6) + write_odd_images(tmp_path / "b")
    answered = 0
    for path in files:
        data = path.read_bytes()
        header = probe(data)
        if header is not None:
            answered += 1
            assert (header.format, header.width, header.height, header.mode, header.orientation) == \
                pil_header(data), path.name
    assert answered >= len(files) // 2


def test_probe_refuses_bombs_and_garbage():
    with pytest.raises(BombError):
        probe(decompression_bomb_png())
    assert probe(b"") is None
    assert probe(b"\xff\xd8\xff\xe0\x00") is None  # cut inside a segment
    assert probe(b"\x89PNG\r\n\x1a\n" + b"\0" * 30) is None
    assert probe(b"GIF89a....") is None
