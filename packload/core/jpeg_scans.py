"""Count the scans of a JPEG, so that a progressive JPEG with thousands of scans is refused before
anyone decodes it.

A progressive JPEG may legally hold any number of scans, and a decoder redoes work over the whole
coefficient buffer for each one: a 733 KB file of 4096x4096 pixels with 20,000 scans takes tens of
seconds to decode. Real encoders write about ten (libjpeg's default script has 10 for colour, 6 for
grey). ``MAX_JPEG_SCANS`` is the bound libjpeg-turbo's own tools and fuzz targets put on the scans
(``djpeg -maxscans``, ``TJPARAM_SCANLIMIT`` of 500 in its fuzzers); packload refuses a JPEG past it,
at pack time and at read time, on every route, as it refuses any record that cannot be decoded.

Counting walks the marker segments only (each length read once; the entropy-coded data after each
SOS skipped with one search in C), so a 100 KB baseline JPEG costs microseconds and a file of
20,000 scans is decided after its first ``stop_after`` scans. Damaged data never raises here: the
count is of what can be walked, and the decoder decides the rest.
"""

from __future__ import annotations

import re

MAX_JPEG_SCANS: int = 500
"""The most scans a JPEG may have to be packed or decoded (libjpeg-turbo's tools and fuzzers use 500)."""

JPEG_START = b"\xff\xd8\xff"  # start of image, then the first marker
_SOS = 0xDA
_EOI = 0xD9
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM and RST0-7 carry no length
# The end of entropy-coded data: 0xFF, then anything but a stuffed 0x00, an RSTn or another fill 0xFF.
_ECS_END = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")
# Where a decoder (libjpeg's next_marker) finds the next marker after bytes it does not expect.
_NEXT_MARKER = re.compile(rb"\xff[^\x00\xff]")


class TooManyScansError(ValueError):
    """A JPEG with more scans than ``MAX_JPEG_SCANS``: treated as any record that cannot be decoded
    (a ``ValueError``, as decoders raise): skipped and listed at pack time, an error naming the
    record at read time."""


def count_scans(data: bytes | memoryview, stop_after: int = MAX_JPEG_SCANS + 1) -> int:
    """The number of scans (SOS markers) of the JPEG ``data`` up to its end-of-image marker, counting
    no further than ``stop_after``. Never raises: damaged data counts as far as it can be walked."""
    size = len(data)
    if size < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return 0
    scans, pos = 0, 2
    search_ecs, search_marker = _ECS_END.search, _NEXT_MARKER.search
    while pos + 1 < size:
        if data[pos] != 0xFF or data[pos + 1] in (0x00, 0xFF):  # bytes out of place, or fill bytes
            found = search_marker(data, pos)  # skipped by the decoder up to the next marker
            if found is None:
                break
            pos = found.start()
        marker = data[pos + 1]
        if marker == _EOI:
            break
        if marker in _STANDALONE or marker == 0xD8:
            pos += 2
            continue
        if pos + 4 > size:
            break
        end = pos + 2 + ((data[pos + 2] << 8) | data[pos + 3])
        if marker == _SOS:
            scans += 1
            if scans >= stop_after:
                break
            found = search_ecs(data, end)  # the entropy-coded data runs to the next marker
            if found is None:
                break
            pos = found.start()
        else:
            pos = end
    return min(scans, stop_after)


def too_many_scans(data: bytes | memoryview) -> bool:
    """Whether ``data`` is a JPEG with more than ``MAX_JPEG_SCANS`` scans. Anything else (not a JPEG,
    or a JPEG within the bound) is False. Most JPEGs are decided by one count of the SOS marker's two
    bytes (an upper bound on the scans), without walking their segments."""
    if data[:3] != JPEG_START:
        return False
    raw = data if isinstance(data, bytes) else bytes(data)
    if raw.count(b"\xff\xda") <= MAX_JPEG_SCANS:  # every scan starts with these two bytes
        return False
    return count_scans(raw) > MAX_JPEG_SCANS


def check_scans(data: bytes | memoryview, where: str) -> None:
    """Raise ``TooManyScansError`` naming ``where`` (a file or record) when ``data`` is a JPEG with more
    than ``MAX_JPEG_SCANS`` scans; do nothing for any other data."""
    if too_many_scans(data):
        raise TooManyScansError(scans_reason(where))


def scans_reason(where: str | None = None) -> str:
    """The one-line reason a JPEG with too many scans is refused, naming ``where`` when given."""
    text = (f"progressive JPEG with more than {MAX_JPEG_SCANS} scans (decoding it would take seconds to "
            "minutes); refused before decoding; re-encode the image (as a baseline JPEG, say)")
    return f"{where}: {text}" if where else text
