"""Reading a table file row by row: CSV, TSV and JSON lines, each row its cells or the reason it
cannot be read, the columns from the header (or every key seen), the file's digest taken on the way,
and a file that is no table refused in one line."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from packload.core.errors import UsageError
from packload.packer.table_options import TableOptions
from packload.packer.table_read import TableReader


def _reader(path: Path) -> TableReader:
    return TableReader(TableOptions(path))


def test_csv_rows_are_numbered_and_a_short_row_says_why(tmp_path: Path) -> None:
    table = tmp_path / "t.csv"
    table.write_bytes("\ufeffpath, label ,note\na.png,cat,\"one, two\"\n\nb.png,dog\nc.png,emu,\"x\ny\"\n\n".encode())
    reader = _reader(table)
    assert reader.header() == ["path", "label", "note"]  # the byte order mark and spaces gone
    rows = list(reader.rows())
    assert rows == [(1, {"path": "a.png", "label": "cat", "note": "one, two"}),
                    (2, "has 2 cells, the header names 3 columns"),  # the blank line is no row
                    (3, {"path": "c.png", "label": "emu", "note": "x\ny"})]
    assert reader.sha256 == hashlib.sha256(table.read_bytes()).hexdigest()  # the trailing blank line too


def test_tsv_splits_on_tabs_only(tmp_path: Path) -> None:
    table = tmp_path / "t.tsv"
    table.write_text("path\tcaption\na.png\ta dog, running\n", "utf-8")
    assert list(_reader(table).rows()) == [(1, {"path": "a.png", "caption": "a dog, running"})]


def test_jsonl_columns_are_every_key_seen_in_order(tmp_path: Path) -> None:
    table = tmp_path / "t.jsonl"
    table.write_text('{"path": "a.png", "n": 1}\n\n[1, 2]\n{"path": "b.png", "tags": [1], "n": null}\n{oops\n'
                     '{"path": "c.png", "ok": true}\n', "utf-8")
    reader = _reader(table)
    rows = list(reader.rows())
    assert [number for number, _ in rows] == [1, 2, 3, 4, 5]  # the blank line is no row
    assert rows[0][1] == {"path": "a.png", "n": 1} and rows[2][1] == {"path": "b.png", "tags": [1], "n": None}
    assert rows[1][1] == "line 3 is not a JSON object"
    assert isinstance(rows[3][1], str) and rows[3][1].startswith("line 5 is not valid JSON")
    assert reader.columns == ["path", "n", "tags", "ok"]
    assert reader.sha256 == hashlib.sha256(table.read_bytes()).hexdigest()


def test_the_table_can_be_read_again(tmp_path: Path) -> None:
    table = tmp_path / "t.csv"
    table.write_text("path,n\na.png,1\nb.png,2\n")
    reader = _reader(table)
    first, digest = list(reader.rows()), reader.sha256
    table.write_text("path,n\na.png,1\nb.png,3\n")  # changed between two passes: the digest says so
    assert list(reader.rows()) != first and reader.sha256 != digest


@pytest.mark.parametrize(("name", "content", "message"), [
    ("t.csv", b"path,,x\na.png,1,2\n", "column 2 has no name"),
    ("t.csv", b"path,x,x\na.png,1,2\n", "two columns named 'x'"),
    ("t.csv", b"", "empty; give a table whose first row names its columns"),
    ("t.csv", b"path,n\na.png,\xff\n", "not UTF-8 text .*; save the table as UTF-8"),
    ("t.csv", b"path," + b"n" * 300 + b"\n", "is longer than"),
    ("t.jsonl", b"\n\n", "no rows; give a table of one JSON object per line"),
    ("t.xlsx", b"path\n", "not a table packload reads"),
])
def test_a_file_that_is_no_table_is_refused(tmp_path: Path, name: str, content: bytes, message: str) -> None:
    table = tmp_path / name
    table.write_bytes(content)
    with pytest.raises(UsageError, match=message):
        list(_reader(table).rows())


def test_a_missing_table_or_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="table not found"):
        _reader(tmp_path / "missing.csv").header()
    (tmp_path / "labels.csv").mkdir()
    with pytest.raises(UsageError, match="is a folder; give the table file"):
        _reader(tmp_path / "labels.csv").header()


def test_a_parquet_table_without_pyarrow_says_what_to_install(tmp_path: Path) -> None:
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        with pytest.raises(UsageError, match="a Parquet table needs pyarrow"):
            _reader(tmp_path / "t.parquet")
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"path": ["a.png", "b.png"], "v": [[1.5], [2.0, 3.0]]}), tmp_path / "t.parquet")
    reader = _reader(tmp_path / "t.parquet")
    assert reader.header() == ["path", "v"]
    assert list(reader.rows()) == [(1, {"path": "a.png", "v": [1.5]}), (2, {"path": "b.png", "v": [2.0, 3.0]})]
