"""Building the index and each record's header as records are written
(``packload.packer.index_builder``): the headers decode to the records given, the index decodes to
entries that point at them, one at a time and many at once give the same bytes, and a part's size
limit is kept."""

from __future__ import annotations

import zlib

import pytest

from packload.core.errors import PackFormatError
from packload.core.format import INDEX_ENTRY, RecordMeta, decode_index, decode_record_header, entry_path
from packload.packer.encode import Encoded
from packload.packer.index_builder import IndexBuilder


def _items() -> list[Encoded]:
    out = []
    for k, (path, fmt, mode) in enumerate([("cat/a.jpg", "JPEG", "RGB"), ("cat/ünï b.png", "PNG", "RGBA"),
                                           ("dog/c.webp", "WEBP", "L"), ("dog/d.xyz", "other", "RGB")]):
        payload = bytes((k * 37 + n) % 256 for n in range(100 + 50 * k))
        out.append(Encoded(path, k // 2, payload, 40 + k, 30 + k, mode, fmt, k % 3, len(payload) + 9,
                           zlib.crc32(payload)))
    return out


def _written(items: list[Encoded]) -> tuple[bytes, IndexBuilder]:
    """The part the writers would write for ``items``, one ``add_record`` at a time."""
    builder, part = IndexBuilder(), b""
    for item in items:
        head = builder.add_record(item.path, item.label, item.width, item.height, item.format, item.mode,
                                  item.orientation, len(item.payload), item.crc32, 0, 16 + len(part))
        part += head + item.payload
    return bytes(16) + part, builder


def test_headers_and_index_describe_the_records_written() -> None:
    items = _items()
    part, builder = _written(items)
    entries, paths = decode_index(builder.to_bytes(), "test")
    assert builder.count == len(entries) == 4 and builder.payload_bytes == sum(len(i.payload) for i in items)
    assert builder.labels().tolist() == [0, 0, 1, 1]
    for k, item in enumerate(items):
        entry = entries[k]
        meta, start, length, crc = decode_record_header(part, int(entry["record_offset"]))
        assert meta == RecordMeta(k, item.label, item.width, item.height, item.format, item.mode, item.orientation,
                                  item.path)
        assert (start, length, crc) == (int(entry["payload_offset"]), len(item.payload), item.crc32)
        assert part[start : start + length] == item.payload
        assert entry_path(entries, paths, k) == item.path
        assert (int(entry["width"]), int(entry["height"]), int(entry["orientation"])) == (item.width, item.height,
                                                                                          item.orientation)


def test_many_at_once_gives_the_same_bytes_and_keeps_the_limit() -> None:
    items = _items()
    part, one_by_one = _written(items)
    builder = IndexBuilder()
    limit = 16 + (len(part) - 16) // 2  # room for about half of them
    pieces, stop, offset = builder.add_many(items, 0, 0, 16, limit, empty=True)
    assert 0 < stop < len(items) and offset <= limit and offset == 16 + sum(map(len, pieces))
    first = b"".join(pieces)
    rest, stop2, end = builder.add_many(items, stop, 0, offset, 1 << 30, empty=False)
    assert stop2 == len(items) and end == len(part)
    assert bytes(16) + first + b"".join(rest) == part
    assert builder.to_bytes() == one_by_one.to_bytes()
    # a record larger than the limit still goes into an empty part, and only there
    big = IndexBuilder()
    assert big.add_many(items, 0, 0, 16, 20, empty=True)[1] == 1
    assert big.add_many(items, 1, 1, 16, 20, empty=False)[1] == 1


def test_out_of_order_and_overlong_paths_are_refused() -> None:
    builder = IndexBuilder()
    with pytest.raises(ValueError, match="out of order"):
        builder.add(RecordMeta(1, 0, 1, 1, "JPEG", "RGB", 0, "a.jpg"), 0, 16, 3, 0)
    builder.add(RecordMeta(0, 0, 1, 1, "JPEG", "RGB", 0, "a.jpg"), 0, 16, 3, 0)
    assert builder.count == 1 and len(builder.to_bytes()) > INDEX_ENTRY.itemsize
    long = "x" * 70_000
    with pytest.raises(PackFormatError, match="longer than 65535 bytes"):
        builder.add_record(long, 0, 1, 1, "JPEG", "RGB", 0, 3, 0, 0, 16)
    item = Encoded(long, 0, b"abc", 1, 1, "RGB", "JPEG", 0, 3, zlib.crc32(b"abc"))
    assert IndexBuilder.has_long_path([item]) and not IndexBuilder.has_long_path(_items())
    with pytest.raises(PackFormatError, match="longer than 65535 bytes"):
        IndexBuilder().add_many([item], 0, 0, 16, 1 << 30, empty=True)
