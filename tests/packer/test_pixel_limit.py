"""The decompression-bomb limit at pack time is passed to each check, never set on PIL: packing with
``--max-pixels`` on one thread cannot raise the limit another thread (or the reader side, which
reads PIL's ``Image.MAX_IMAGE_PIXELS`` as the user's setting) works under."""

from __future__ import annotations

import io
import threading
from typing import Any

import pytest
from PIL import Image

import packload.packer.encode as encode
from packload.core.probe import BombError, open_image
from packload.core.scan import Sample
from packload.loaders.decode import decode_array
from packload.packer.encode import Encoded, EncodeOptions, Skipped, encode_data
from tests.image_factory import textured_rgb

LIMIT = 1000  # this test's PIL limit: a 64x64 image (4096 pixels) is past twice it


def _png(size: tuple[int, int] = (64, 64)) -> bytes:
    out = io.BytesIO()
    Image.fromarray(textured_rgb(size, 1)).save(out, "PNG")
    return out.getvalue()


def _jpeg(size: tuple[int, int] = (64, 64)) -> bytes:
    out = io.BytesIO()
    Image.fromarray(textured_rgb(size, 1)).save(out, "JPEG")
    return out.getvalue()


@pytest.fixture
def small_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", LIMIT)


def test_encode_never_writes_the_global(monkeypatch: pytest.MonkeyPatch, small_limit: None) -> None:
    """Thread A packs with a raised limit and is held inside PIL's open; meanwhile PIL's global is
    what it was, and thread B, packing with the default, still refuses the bomb."""
    inside, release = threading.Event(), threading.Event()
    seen: list[Any] = []
    real_open = encode.open_image

    def held_open(data: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "A":
            inside.set()
            release.wait(30)
        return real_open(data, *args, **kwargs)

    monkeypatch.setattr(encode, "open_image", held_open)
    results: dict[str, Any] = {}
    data = _png()

    def run(name: str, options: EncodeOptions) -> None:
        results[name] = encode_data(Sample("a/big.png", 0), data, options)

    a = threading.Thread(target=run, name="A", args=("A", EncodeOptions(check="full", max_pixels=10**6)))
    a.start()
    assert inside.wait(30)
    seen.append(Image.MAX_IMAGE_PIXELS)
    b = threading.Thread(target=run, name="B", args=("B", EncodeOptions(check="full")))
    b.start()
    b.join(30)
    seen.append(Image.MAX_IMAGE_PIXELS)
    with pytest.raises(Image.DecompressionBombError):  # the reader's limit is the user's, untouched
        decode_array(_jpeg(), "JPEG", "RGB", 64, 64)
    release.set()
    a.join(30)
    assert seen == [LIMIT, LIMIT] and Image.MAX_IMAGE_PIXELS == LIMIT
    assert isinstance(results["A"], Encoded) and (results["A"].width, results["A"].height) == (64, 64)
    assert isinstance(results["B"], Skipped) and "decompression bomb" in results["B"].reason
    assert f"now {LIMIT}" in results["B"].reason


@pytest.mark.parametrize("encoding", ["keep", "png", "jpeg", "raw"])
def test_many_overlapping_threads(small_limit: None, encoding: str) -> None:
    """Threads with and without a raised limit, interleaved many times: each gets its own answer, and
    PIL's global ends as it began."""
    files = {"png": _png(), "jpeg": _jpeg()}
    raised = EncodeOptions(encoding=encoding, check="full", max_pixels=10**6,
                           size=(8, 8) if encoding == "raw" else None)
    default = EncodeOptions(encoding=encoding, check="full", size=(8, 8) if encoding == "raw" else None)
    start = threading.Barrier(4)
    wrong: list[str] = []

    def run(options: EncodeOptions, want: type) -> None:
        start.wait(30)
        for k in range(40):
            for name, data in files.items():
                got = encode_data(Sample(f"a/{k}.{name}", 0), data, options)
                if not isinstance(got, want):
                    wrong.append(f"{name} with max_pixels={options.max_pixels}: {got}")

    threads = [threading.Thread(target=run, args=(raised, Encoded)) for _ in range(2)]
    threads += [threading.Thread(target=run, args=(default, Skipped)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert wrong == [] and Image.MAX_IMAGE_PIXELS == LIMIT


def test_open_image_takes_the_limit_it_is_given(small_limit: None) -> None:
    data = _png()
    assert open_image(data, max_pixels=10**6).size == (64, 64)
    with pytest.raises(Image.DecompressionBombError):
        open_image(data)  # PIL's own limit, read
    with pytest.raises(BombError, match="exceeds limit of 200 pixels"):
        open_image(_png((16, 16)), max_pixels=100)
    assert Image.MAX_IMAGE_PIXELS == LIMIT


def test_no_limit_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """PIL's global set to None by the user (no limit) is honoured, and a given limit still applies."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    assert open_image(_png()).size == (64, 64)
    with pytest.raises(BombError):
        open_image(_png(), max_pixels=100)
    assert isinstance(encode_data(Sample("a/x.png", 0), _png(), EncodeOptions(check="full")), Encoded)


def test_nothing_in_packload_writes_the_global() -> None:
    """No module assigns PIL's limit (tests may, to set up a case)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    offenders = [str(path.relative_to(root)) for folder in ("packload", "packer", "loaders")
                 for path in (root / folder).rglob("*.py")
                 if "MAX_IMAGE_PIXELS =" in path.read_text() or "MAX_IMAGE_PIXELS=" in path.read_text()]
    assert offenders == []
