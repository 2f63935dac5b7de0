"""``loaders.field_columns``: a pack's string and list fields as sequences over the fields part's own
bytes. The columns here are decoded from a fields part encoded by ``core.fields``, as a pack's are:
indexing (negative indices, slices with steps, out of range), the ``Sequence`` methods, values that are
views of the part rather than copies, empty values, a pack of no records, and a damaged string.
(Reading fields from packs made from a table is tested in test_fields.py.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from packload.core.errors import PackFormatError
from packload.core.fields import Column, decode_fields, encode_fields
from packload.loaders.field_columns import FieldColumn, ListColumn, StringColumn

TEXTS = ["a dog, running", "", "ñandú 犬\nsecond line", "  spaced  ", "a dog, running"]
ATTRS = [[0, 1, 1], [], [-(2**62), 2**62], [5], [7, 7, 7, 7]]
EMBEDDING = [[0.5, -1.25], [2.0], [], [1e10, 0.1, 3.0], [float("inf")]]


def variable(name: str, kind: str, values: list[Any], dtype: str,
             encode: Callable[[str], bytes] | None = None) -> Column:
    """A string or list column of ``values``, laid out as the fields part stores it."""
    items = [np.frombuffer(encode(v), np.uint8) if encode else np.asarray(v, dtype) for v in values]
    offsets = np.concatenate([[0], np.cumsum([len(item) for item in items])]).astype(np.uint64)
    joined = np.concatenate(items).astype(dtype) if items else np.empty(0, dtype)
    return Column(name, kind, joined, offsets)


def fields_part(texts: list[str], attrs: list[list[int]], embedding: list[list[float]]) -> bytes:
    return bytes(encode_fields([variable("caption", "string", texts, "uint8", str.encode),
                                variable("attrs", "list[int]", attrs, "int64"),
                                variable("embedding", "list[float]", embedding, "float64")]))


def columns(part: bytes | bytearray, records: int) -> dict[str, Column]:
    return {column.name: column for column in decode_fields(part, "test fields", records)}


@pytest.fixture(scope="module")
def part() -> bytes:
    return fields_part(TEXTS, ATTRS, EMBEDDING)


def test_string_column_reads_every_text(part: bytes) -> None:
    caption = StringColumn(columns(part, 5)["caption"])
    assert len(caption) == 5 and caption.name == "caption"
    assert [caption[i] for i in range(5)] == TEXTS and list(caption) == TEXTS and caption.tolist() == TEXTS
    assert caption[-1] == TEXTS[-1] and caption[-5] == TEXTS[0] and caption[np.int64(2)] == TEXTS[2]
    assert caption[1:4] == TEXTS[1:4] and caption[::-2] == TEXTS[::-2] and caption[3:100] == TEXTS[3:]
    assert caption[4:1] == [] and caption[-2:] == TEXTS[-2:]
    # the Sequence methods come with it
    assert "" in caption and "a dog" not in caption
    assert caption.index("a dog, running") == 0 and caption.count("a dog, running") == 2
    assert list(reversed(caption)) == TEXTS[::-1]
    assert repr(caption) == "StringColumn('caption', 5 records)"
    assert isinstance(caption, FieldColumn)


def test_string_column_is_the_parts_bytes(part: bytes) -> None:
    """``data`` and ``offsets`` are the part's arrays (no copy): record i's text is its UTF-8 bytes there."""
    caption = StringColumn(columns(part, 5)["caption"])
    whole = np.frombuffer(part, np.uint8)
    assert np.shares_memory(caption.data, whole) and np.shares_memory(caption.offsets, whole)
    assert caption.data.dtype == np.uint8 and caption.offsets.dtype == np.uint64 and len(caption.offsets) == 6
    for i, text in enumerate(TEXTS):
        start, stop = int(caption.offsets[i]), int(caption.offsets[i + 1])
        assert caption.data[start:stop].tobytes() == text.encode("utf-8")


def test_list_columns_are_views_of_their_values(part: bytes) -> None:
    found = columns(part, 5)
    attrs, embedding = ListColumn(found["attrs"]), ListColumn(found["embedding"])
    assert (len(attrs), attrs.name, attrs.type, embedding.type) == (5, "attrs", "list[int]", "list[float]")
    assert attrs.tolist() == ATTRS and embedding.tolist() == EMBEDDING
    assert all(type(v) is int for row in attrs.tolist() for v in row)
    whole = np.frombuffer(part, np.uint8)
    for i, expected in enumerate(ATTRS):
        got = attrs[i]
        assert got.dtype == np.int64 and got.tolist() == expected
        assert got.size == 0 or np.shares_memory(got, whole)  # a view of the part, not a copy
    assert embedding[1].dtype == np.float64 and embedding[2].shape == (0,) and embedding[2].dtype == np.float64
    assert attrs[-1].tolist() == ATTRS[-1] and attrs[np.int64(-5)].tolist() == ATTRS[0]
    assert [row.tolist() for row in attrs[::2]] == ATTRS[::2] and attrs[5:] == []
    assert [row.tolist() for row in attrs] == ATTRS
    assert repr(attrs) == "ListColumn('attrs', list[int], 5 records)"
    assert isinstance(embedding, FieldColumn)


@pytest.mark.parametrize("kind", ["caption", "attrs"])
def test_an_index_past_either_end_names_the_pack_size(part: bytes, kind: str) -> None:
    column = columns(part, 5)[kind]
    wrapped = StringColumn(column) if kind == "caption" else ListColumn(column)
    for index in (5, -6, 10**12):
        with pytest.raises(IndexError) as caught:
            wrapped[index]
        assert str(caught.value) == f"record {index} out of range: the pack has 5 records"


def test_a_pack_of_no_records() -> None:
    found = columns(fields_part([], [], []), 0)
    for column in (StringColumn(found["caption"]), ListColumn(found["attrs"])):
        assert len(column) == 0 and list(column) == [] and column.tolist() == [] and column[:] == []
        with pytest.raises(IndexError, match="record 0 out of range: the pack has 0 records"):
            column[0]
        with pytest.raises(IndexError, match="record -1 out of range"):
            column[-1]


def test_a_damaged_text_names_its_field_and_record(part: bytes) -> None:
    """Bytes that are not UTF-8 fail the record that holds them, saying the pack is damaged; the
    other records still read."""
    damaged = bytearray(part)
    at = damaged.find("ñandú".encode())
    damaged[at] = 0xFF  # a byte UTF-8 never has
    caption = StringColumn(columns(damaged, 5)["caption"])
    assert caption[0] == TEXTS[0] and caption[3] == TEXTS[3]
    for read in (lambda: caption[2], lambda: caption[-3], lambda: caption[1:3], caption.tolist):
        with pytest.raises(PackFormatError) as caught:
            read()
        assert str(caught.value) == "field 'caption', record 2: not valid UTF-8; the pack is damaged"
