"""Helpers (not tests) that write JPEGs with a chosen number of scans, for the scan-bound tests.

PIL writes a progressive JPEG of 10 scans; ``many_scan_jpeg`` repeats its last scan (with the
Huffman table before it) until the file holds the number asked for. Decoders accept the repeats
(libjpeg warns of a "bogus progression" and goes on), so the file decodes, slowly in proportion to
its scans: what a hostile file does at full size, here at a size that keeps tests fast.
"""

from __future__ import annotations

import io
import re

from PIL import Image

from tests.image_factory import textured_rgb

_ECS_END = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


def progressive_jpeg(size: tuple[int, int] = (64, 64), seed: int = 0, **save: object) -> bytes:
    """A textured progressive JPEG of ``size`` (width, height), as PIL writes it (10 scans)."""
    out = io.BytesIO()
    Image.fromarray(textured_rgb(size, seed)).save(out, "JPEG", progressive=True, quality=80, **save)
    return out.getvalue()


def jpeg_segments(data: bytes) -> list[tuple[int, int, int]]:
    """(marker, start, end) of each segment of a well-formed JPEG after SOI; a scan's end is that
    of its entropy-coded data."""
    pos, out = 2, []
    while pos + 1 < len(data):
        marker = data[pos + 1]
        if marker == 0xD9:
            out.append((marker, pos, pos + 2))
            break
        end = pos + 2 + ((data[pos + 2] << 8) | data[pos + 3])
        if marker == 0xDA:
            end = _ECS_END.search(data, end).start()
        out.append((marker, pos, end))
        pos = end
    return out


def many_scan_jpeg(scans: int, size: tuple[int, int] = (64, 64), seed: int = 0) -> bytes:
    """A progressive JPEG of ``size`` with exactly ``scans`` scans (at least 10)."""
    data = progressive_jpeg(size, seed)
    segments = jpeg_segments(data)
    sos = [i for i, (marker, _, _) in enumerate(segments) if marker == 0xDA]
    if scans < len(sos):
        raise ValueError(f"scans={scans}: PIL's progressive JPEG has {len(sos)} already")
    last = sos[-1]
    first = last - 1 if segments[last - 1][0] == 0xC4 else last  # with its Huffman table
    tail = segments[last][2]
    repeat = data[segments[first][1]:tail]
    return data[:tail] + repeat * (scans - len(sos)) + data[tail:]


def scans_in(data: bytes) -> int:
    """The scans of a well-formed JPEG, counted by this independent walk (for cross-checks)."""
    return sum(1 for marker, _, _ in jpeg_segments(data) if marker == 0xDA)
