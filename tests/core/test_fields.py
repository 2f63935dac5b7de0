"""The fields part: FORMAT.md's tables are the format module's, a reader written from the document
alone reads real packs' fields, and ``decode_fields`` refuses every damaged or hostile part."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np
import pytest

from packload import PackedImageFolder, PackFormatError, pack
from packload.core.fields import Column, decode_fields, encode_fields
from packload.core.format import FIELD_COLUMN, FIELD_TYPES, FIELD_VALUES, FIELDS_HEADER
from packload.packer.table_options import TableOptions
from tests.core.test_format_doc import DOC, DOC_TEXT, Layout, _section, _table_rows
from tests.fields_source import make_source, typed

HEADER_DOC = Layout("Fields header")
COLUMN_DOC = Layout("Field column")


def _dtype_layout(dtype: np.dtype) -> list[tuple[str, int, int]]:
    return [(name, dtype.fields[name][1], dtype.fields[name][0].itemsize) for name in dtype.names]


def test_document_tables_are_the_format_module() -> None:
    assert HEADER_DOC.size == FIELDS_HEADER.itemsize and COLUMN_DOC.size == FIELD_COLUMN.itemsize
    assert HEADER_DOC.names == list(FIELDS_HEADER.names) and COLUMN_DOC.names == list(FIELD_COLUMN.names)
    for layout, dtype in ((HEADER_DOC, FIELDS_HEADER), (COLUMN_DOC, FIELD_COLUMN)):
        offsets = [offset for _, offset, _ in _dtype_layout(dtype)]
        assert offsets == [int(row[0]) for row in _table_rows(_section("### " + ("Fields header" if layout is
                                                                                 HEADER_DOC else "Field column")))]
    for layout in (HEADER_DOC, COLUMN_DOC):  # the struct formats quoted in the text
        assert f'"{layout.struct.format}"' in DOC_TEXT
    rows = _table_rows(_section("### Field types"))
    assert [(int(code), name.strip("`")) for code, name, *_ in rows] == list(enumerate(FIELD_TYPES))
    sizes = {"i64": "<i8", "f64": "<f8", "u8": "u1", "UTF-8": "u1"}
    for (_, _name, values, _), kind in zip(rows, FIELD_TYPES, strict=True):
        assert sizes[values.split(" ")[0].rstrip(",")] == np.dtype(FIELD_VALUES[kind]).str.replace("|", ""), kind


def _doc_reader(part: bytes, records: int) -> dict[str, list]:
    """Every column of a fields part, read with struct alone from FORMAT.md's tables."""
    head = HEADER_DOC.read(part)
    assert head["magic"] == b"PLFD" and head["version"] == 1 and head["records"] == records
    names_at = HEADER_DOC.size + COLUMN_DOC.size * head["columns"]
    codes = {int(row[0]): row[1].strip("`") for row in _table_rows(_section("### Field types"))}
    out: dict[str, list] = {}
    at = names_at + head["names_len"]
    for k in range(head["columns"]):
        entry = COLUMN_DOC.read(part, HEADER_DOC.size + COLUMN_DOC.size * k)
        name = part[names_at + entry["name_offset"] : names_at + entry["name_offset"] + entry["name_len"]].decode()
        kind = codes[entry["type"]]
        width, letter = {"int": (8, "q"), "float": (8, "d"), "bool": (1, "B"), "string": (1, "B"),
                         "list[int]": (8, "q"), "list[float]": (8, "d")}[kind]
        if entry["offsets_len"]:
            at = -(-at // 8) * 8
            assert entry["offsets_offset"] == at and entry["offsets_len"] == 8 * (records + 1)
            offsets = struct.unpack_from(f"<{records + 1}Q", part, at)
            at += entry["offsets_len"]
        at = -(-at // 8) * 8
        assert entry["values_offset"] == at
        count = entry["values_len"] // width
        values = struct.unpack_from(f"<{count}{letter}", part, at)
        at += entry["values_len"]
        if not entry["offsets_len"]:
            out[name] = [bool(v) for v in values] if kind == "bool" else list(values)
        elif kind == "string":
            blob = part[entry["values_offset"] : entry["values_offset"] + entry["values_len"]]
            out[name] = [blob[offsets[i] : offsets[i + 1]].decode("utf-8") for i in range(records)]
        else:
            out[name] = [list(values[offsets[i] : offsets[i + 1]]) for i in range(records)]
    assert at == len(part), "the last array ends the part"
    return out


@pytest.mark.parametrize("backend", ["shards", "lmdb"])
def test_a_reader_from_the_document_reads_real_packs(tmp_path: Path, backend: str) -> None:
    source = make_source(tmp_path)
    dst = tmp_path / f"p.{backend}"
    pack(source.root, dst, labels=TableOptions(source.table, types={"age": "int", "attrs": "list[int]"}),
         workers=1, progress=False)
    ds = PackedImageFolder(dst)
    part = bytes(ds.reader().fields_bytes())
    got = _doc_reader(part, len(ds))
    assert list(got) == list(ds.fields)
    for name, values in got.items():
        wanted = [typed(name, source.row(path)[name]) for path in source.paths]
        assert values == wanted, name
    if backend == "shards":  # the worked example, as written
        [example] = re.findall(r"```py\n(.*?)```", DOC_TEXT, flags=re.DOTALL)
        for name in ds.fields:
            scope = {"pack_dir": str(dst), "name": name}
            exec(compile(example, str(DOC), "exec"), scope)
            column = scope["column"]
            values = [v.tolist() if isinstance(v, np.ndarray) else v for v in column]
            assert values == got[name], name


COLUMNS = [Column("n", "int", np.array([3, -1, 2**62], np.int64)),
           Column("x", "float", np.array([0.5, np.nan, -np.inf])),
           Column("ok", "bool", np.array([1, 0, 1], np.uint8)),
           Column("s", "string", np.frombuffer("añb".encode(), np.uint8), np.array([0, 1, 1, 4], np.int64)),
           Column("li", "list[int]", np.array([1, 2, 3], np.int64), np.array([0, 0, 2, 3], np.int64)),
           Column("lf", "list[float]", np.array([1.5], np.float64), np.array([0, 1, 1, 1], np.int64))]


def test_every_type_round_trips_and_rows_are_taken() -> None:
    part = bytes(encode_fields(list(COLUMNS)))
    columns = decode_fields(part, "t", 3)
    assert [c.name for c in columns] == [c.name for c in COLUMNS]
    assert [columns[0].value(i) for i in range(3)] == [3, -1, 2**62]
    assert columns[1].value(0) == 0.5 and np.isnan(columns[1].value(1)) and columns[1].value(2) == -np.inf
    assert [columns[2].value(i) for i in range(3)] == [True, False, True]
    assert [columns[3].value(i) for i in range(3)] == ["a", "", "ñb"]
    assert [columns[4].value(i) for i in range(3)] == [[], [1, 2], [3]]
    taken = decode_fields(bytes(encode_fields(list(COLUMNS), np.array([2, 2, 0]))), "t", 3)
    assert [taken[3].value(i) for i in range(3)] == ["ñb", "ñb", "a"]
    assert [taken[4].value(i) for i in range(3)] == [[3], [3], []]
    assert decode_fields(bytes(encode_fields([])), "t", 0) == []
    assert len(part) % 8 == 0 and len(decode_fields(part, "t", 3)[3].values) == 4


def _mutated(part: bytes, offset: int, fmt: str, value: object) -> bytes:
    data = bytearray(part)
    struct.pack_into(fmt, data, offset, value)
    return bytes(data)


PART = bytes(encode_fields(list(COLUMNS)))
NAMES_AT = FIELDS_HEADER.itemsize + FIELD_COLUMN.itemsize * len(COLUMNS)
COL = [FIELDS_HEADER.itemsize + FIELD_COLUMN.itemsize * k for k in range(len(COLUMNS))]
STRING = decode_fields(PART, "t", 3)[3]
OFFSETS_AT = STRING.offsets.__array_interface__["data"][0] - np.frombuffer(PART, np.uint8).__array_interface__["data"][0]


@pytest.mark.parametrize(("damage", "message"), [
    (lambda p: p[:20], "too short"),
    (lambda p: b"XXXX" + p[4:], "not a packload fields part"),
    (lambda p: _mutated(p, 4, "<I", 2), "fields part version 2, this packload reads version 1; upgrade packload"),
    (lambda p: _mutated(p, 8, "<Q", 4), "holds 4 values per column, the pack 3 records"),
    (lambda p: _mutated(p, 16, "<I", 1 << 30), "claims 1073741824 columns"),
    (lambda p: _mutated(p, 20, "<I", 40), "column entries of 40 bytes"),
    (lambda p: _mutated(p, 24, "<Q", 1 << 40), "claims 6 columns and"),
    (lambda p: _mutated(p, COL[1] + 8, "<I", 9), "its name is not where the table says"),
    (lambda p: _mutated(p, NAMES_AT, "<B", 0xFF), "name is not valid UTF-8"),
    (lambda p: _mutated(p, NAMES_AT + 1, "<B", ord("n")), "two fields named 'n'"),
    (lambda p: _mutated(p, COL[0] + 12, "<B", 9), "unknown type code 9"),
    (lambda p: _mutated(p, COL[0] + 16, "<Q", 1 << 62), "its values are not where the layout puts them"),
    (lambda p: _mutated(p, COL[0] + 24, "<Q", 16), "field 'n': 2 values for 3 records"),
    (lambda p: _mutated(p, COL[0] + 32, "<Q", 8), "a int field with offsets"),
    (lambda p: _mutated(p, COL[3] + 32, "<Q", 1 << 50), "its offsets are not where the layout puts them"),
    (lambda p: _mutated(p, OFFSETS_AT + 8, "<Q", 3), "its offsets are not in order"),
    (lambda p: _mutated(p, OFFSETS_AT, "<Q", 1), "its offsets are not in order"),
    (lambda p: p + bytes(8), "but its arrays end at"),
    (lambda p: p[:-8], "its values are not where the layout puts them"),
])
def test_damaged_parts_are_refused(damage, message: str) -> None:
    with pytest.raises(PackFormatError, match=message):
        decode_fields(damage(PART), "t", 3)


def test_a_bool_other_than_0_or_1_and_bad_utf8_text() -> None:
    ok_at = int(decode_fields(PART, "t", 3)[2].values.__array_interface__["data"][0]
                - np.frombuffer(PART, np.uint8).__array_interface__["data"][0])
    with pytest.raises(PackFormatError, match="a bool value other than 0 or 1"):
        decode_fields(_mutated(PART, ok_at, "<B", 2), "t", 3)
    text_at = int(STRING.values.__array_interface__["data"][0] - np.frombuffer(PART, np.uint8).__array_interface__["data"][0])
    column = decode_fields(_mutated(PART, text_at + 1, "<B", 0xFF), "t", 3)[3]  # checked when read
    with pytest.raises(PackFormatError, match="field 's', record 2: not valid UTF-8"):
        column.value(2)
