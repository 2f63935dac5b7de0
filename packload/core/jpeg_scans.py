"""Count the scans of a JPEG, so that a progressive JPEG with thousands of scans is refused before
anyone decodes it.

A progressive JPEG may legally hold any number of scans, and a decoder redoes work over the whole
coefficient buffer for each one: a 733 KB file of 4096x4096 pixels with 20,000 scans takes tens of
seconds to decode. Real encoders write about ten (libjpeg's default script has 10 for colour, 6 for
grey). ``MAX_JPEG_SCANS`` is the bound libjpeg-turbo's own tools and fuzz targets put on the scans
(``djpeg -maxscans``, ``TJPARAM_SCANLIMIT`` of 500 in its fuzzers); packload refuses a JPEG past it,
at pack time and at read time, on every route, as it refuses any record that cannot be decoded.

Counting walks the marker segments only (each length read once; the entropy-coded data after each
SOS skipped with one vectorised search for the next marker), so a 100 KB baseline JPEG costs tens of
microseconds (a small part of decoding it) and a file of 20,000 scans is decided after its first
``stop_after`` scans. Damaged data never raises here: the
count is of what can be walked, and the decoder decides the rest.
"""

from __future__ import annotations

import re

import numpy as np

from packload.core.errors import PackloadError

MAX_JPEG_SCANS: int = 500
"""The most scans a JPEG may have to be packed or decoded (libjpeg-turbo's tools and fuzzers use 500)."""

JPEG_START = b"\xff\xd8\xff"  # start of image, then the first marker
_SOS = 0xDA
_EOI = 0xD9
_MIN_SCAN_BYTES = 10  # an SOS marker and the shortest scan header (one component), with no data
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM and RST0-7 carry no length
# Where a decoder (libjpeg's next_marker) finds the next marker after bytes it does not expect.
_NEXT_MARKER = re.compile(rb"\xff[^\x00\xff]")


class TooManyScansError(PackloadError, ValueError):
    """A JPEG with more scans than ``MAX_JPEG_SCANS``: treated as any record that cannot be decoded
    (a ``ValueError``, as decoders raise): skipped and listed at pack time, an error naming the
    record at read time."""


def count_scans(data: bytes | memoryview, stop_after: int = MAX_JPEG_SCANS + 1) -> int:
    """The number of scans (SOS markers) of the JPEG ``data`` up to its end-of-image marker, counting
    no further than ``stop_after``. Never raises: damaged data counts as far as it can be walked."""
    size = len(data)
    if size < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return 0
    most = _sos_pairs(data)  # no more scans than places that start like one: a baseline JPEG stops at its SOS
    scans, pos = 0, 2
    ends: np.ndarray | None = None
    search_marker = _NEXT_MARKER.search
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
            if scans >= stop_after or scans >= most:
                break
            if ends is None:
                ends = _ecs_ends(data)
            k = int(np.searchsorted(ends, end))  # the entropy-coded data runs to the next marker
            if k == len(ends):
                break
            pos = int(ends[k])
        else:
            pos = end
    return min(scans, stop_after)


def _sos_pairs(data: bytes | memoryview) -> int:
    """How many times the two bytes of the SOS marker occur in ``data``: a bound on its scans."""
    array = np.frombuffer(data, np.uint8)
    return int(np.count_nonzero((array[:-1] == 0xFF) & (array[1:] == _SOS)))


def _ecs_ends(data: bytes | memoryview) -> np.ndarray:
    """Where entropy-coded data can end, in order: each 0xFF followed by anything but a stuffed
    0x00, an RSTn or another fill 0xFF (the marker that ends a scan)."""
    array = np.frombuffer(data, np.uint8)
    ff = np.flatnonzero(array[:-1] == 0xFF)
    after = array[ff + 1]
    return ff[(after != 0x00) & (after != 0xFF) & ((after < 0xD0) | (after > 0xD7))]


def too_many_scans(data: bytes | memoryview) -> bool:
    """Whether ``data`` is a JPEG with more than ``MAX_JPEG_SCANS`` scans. Anything else (not a JPEG,
    or a JPEG within the bound) is False. Most JPEGs are decided by one vectorised count of the SOS
    marker's two bytes (an upper bound on the scans), without walking their segments."""
    if data[:3] != JPEG_START or len(data) <= MAX_JPEG_SCANS * _MIN_SCAN_BYTES:  # too short to hold that many
        return False
    if _sos_pairs(data) <= MAX_JPEG_SCANS:  # the two bytes every scan starts with
        return False
    return count_scans(data) > MAX_JPEG_SCANS


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
