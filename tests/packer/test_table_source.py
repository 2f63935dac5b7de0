"""Packing from a table: each column's type inferred from every row or given, the class column, and
every row or image that cannot be used left out and said (the manifest, ``--strict``), never guessed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from packload import PackedImageFolder, SkippedFileError, UsageError, pack
from packload.packer.table_options import TableOptions, parse_field_spec
from tests.fields_source import (
    BAD_ROWS,
    GOOD,
    NO_ROW_IMAGES,
    SKIPPED_IMAGES,
    TYPES,
    make_source,
    write_images,
    write_jsonl,
)

GIVEN = {"age": "int", "attrs": "list[int]"}  # the columns whose bad cells must be refused, not made text


def _pack(src: Path, table: Path | TableOptions, dst: Path, **kwargs: object) -> dict:
    return pack(src, dst, labels=table, workers=1, progress=False, **kwargs)


def _manifest(dst: Path) -> dict:
    return json.loads((dst / "manifest.json").read_bytes())


def test_types_are_inferred_from_every_row(tmp_path: Path) -> None:
    source = make_source(tmp_path, bad=False)
    summary = _pack(source.root, source.table, tmp_path / "p.shards")
    assert summary["fields"] == TYPES  # "007" keeps its zeros: an id is text; "[2]" among floats: list[float]
    ds = PackedImageFolder(tmp_path / "p.shards")
    assert ds.fields == TYPES and ds.classes == ["cat", "dog", "emu"]
    assert ds.field("age").dtype == np.int64 and ds.field("age")[4] == 9007199254740993  # no float on the way
    assert ds.field("height").dtype == np.float64 and ds.field("smiling").dtype == np.bool_
    assert ds.field("smiling").tolist() == [True, False, True, False, True]  # TRUE is true
    assert ds.field("id").tolist() == ["007", "017", "100", "042", "5"]
    assert ds.field("embedding")[1].tolist() == [2.0] and ds.field("embedding")[1].dtype == np.float64


def test_given_types_override_inference(tmp_path: Path) -> None:
    source = make_source(tmp_path, bad=False)
    options = TableOptions(source.table, types={"id": "int", "smiling": "string", "attrs": "list[float]"})
    summary = _pack(source.root, options, tmp_path / "p.shards")
    assert summary["fields"]["id"] == "int" and summary["fields"]["smiling"] == "string"
    ds = PackedImageFolder(tmp_path / "p.shards")
    assert ds.field("id").tolist() == [7, 17, 100, 42, 5]
    assert ds.field("smiling").tolist() == ["true", "false", "TRUE", "false", "true"]  # the text, as written
    assert ds.field("attrs")[0].dtype == np.float64


def test_every_left_out_kind_is_listed(tmp_path: Path) -> None:
    source = make_source(tmp_path)
    dst = tmp_path / "p.shards"
    summary = _pack(source.root, TableOptions(source.table, types=GIVEN), dst)
    manifest = _manifest(dst)
    ds = PackedImageFolder(dst)
    assert [ds.path(i) for i in range(len(ds))] == source.paths  # only the good rows' images, in path order
    assert summary["records"] == len(GOOD)
    # images whose row cannot be used: skipped, the row and the cell named
    skipped = {item["path"]: item["reason"] for item in manifest["skipped"]}
    assert set(skipped) == SKIPPED_IMAGES
    assert "rows 7, 8" in skipped["dup.png"] and "'old' is not an integer" in skipped["old.png"]
    assert "column 'age' (int): is empty" in skipped["noage.png"] and "row 10" in skipped["noage.png"]
    assert "'[1,x]' is not a JSON list" in skipped["badlist.png"] and "class" in skipped["nolabel.png"]
    assert [item["path"] for item in manifest["skipped"]] == sorted(SKIPPED_IMAGES)  # in scan order
    assert manifest["source"]["files"] == manifest["records"] + manifest["skipped_count"]
    # images with no row: left out
    ignored = {item["path"]: item["reason"] for item in manifest["ignored"]}
    assert {name: ignored[name] for name in NO_ROW_IMAGES} == dict.fromkeys(NO_ROW_IMAGES,
                                                                           "image with no row in labels.csv")
    # every row that gives no record: listed with its number
    left = manifest["fields"]["rows_left_out"]
    assert manifest["fields"]["rows_left_out_count"] == len(left) == len(BAD_ROWS) + 1 == summary["rows_left_out"]
    by_row = {item["row"]: item for item in left}
    for number, (row, word) in enumerate(BAD_ROWS, len(GOOD) + 1):
        assert by_row[number]["path"] == row[0] and word in by_row[number]["reason"], (number, by_row[number])
    assert "has 3 cells, the header names 9 columns" in by_row[len(GOOD) + len(BAD_ROWS) + 1]["reason"]
    assert manifest["fields"]["table"]["rows"] == len(GOOD) + len(BAD_ROWS) + 1


def test_strict_refuses_the_first_problem(tmp_path: Path) -> None:
    source = make_source(tmp_path)
    with pytest.raises(SkippedFileError, match=r"labels.csv row 6 \(ghost.png\): no image"):
        _pack(source.root, TableOptions(source.table, types=GIVEN), tmp_path / "p.shards", strict=True)
    assert not (tmp_path / "p.shards").exists()
    clean = make_source(tmp_path / "clean", bad=False)
    write_images(clean.root, ["extra.png"])
    with pytest.raises(SkippedFileError, match="extra.png: image with no row"):
        _pack(clean.root, clean.table, tmp_path / "q.shards", strict=True)


def test_a_mostly_numeric_column_is_text_with_a_warning(tmp_path: Path) -> None:
    source = make_source(tmp_path)
    with pytest.warns(UserWarning, match=r"column 'age' is stored as text: 1 of its cells is not a number "
                                         r"\(row 9: 'old'\); give --field age:int"):
        summary = _pack(source.root, source.table, tmp_path / "p.shards")
    assert summary["fields"]["age"] == "string"
    assert "old.png" in [PackedImageFolder(tmp_path / "p.shards").path(i) for i in range(summary["records"])]


def test_integer_classes_are_kept(tmp_path: Path) -> None:
    write_images(tmp_path / "img", ["a.png", "b.png", "c.png", "d.png"])
    (tmp_path / "t.csv").write_text("file,cls,score\na.png,3,1\nb.png,0,2\nc.png,3,3\nd.png,-1,4\n")
    summary = _pack(tmp_path / "img", TableOptions(tmp_path / "t.csv", path_column="file", label_column="cls"),
                    tmp_path / "p.shards")
    ds = PackedImageFolder(tmp_path / "p.shards")
    assert ds.classes == ["0", "1", "2", "3"] and ds.targets == [3, 0, 3] and summary["skipped"] == 1
    assert "not in 0..999999" in _manifest(tmp_path / "p.shards")["skipped"][0]["reason"]
    assert ds.fields == {"score": "int"} and ds.manifest["fields"]["label_type"] == "int"
    # the same column given as names: sorted like ImageFolder's folders
    summary = _pack(tmp_path / "img", TableOptions(tmp_path / "t.csv", path_column="file", label_column="cls",
                                                   types={"cls": "string"}), tmp_path / "q.shards")
    named = PackedImageFolder(tmp_path / "q.shards")
    assert named.classes == ["-1", "0", "3"] and named.targets == [2, 1, 2, 0]


def test_without_a_class_column_the_folders_stay_the_classes(tmp_path: Path) -> None:
    write_images(tmp_path / "img" / "cat", ["1.png", "2.png"])
    write_images(tmp_path / "img" / "dog", ["3.png"])
    write_images(tmp_path / "img", ["loose.png"])
    (tmp_path / "captions.jsonl").write_text(
        '{"path": "cat/1.png", "caption": "one", "score": 1}\n\n{"path": "dog/3.png", "caption": "three", "score": 3}\n'
        '{"path": "cat/2.png", "caption": "two"}\n{"path": "loose.png", "caption": "x", "score": 0.5}\n')
    _pack(tmp_path / "img", tmp_path / "captions.jsonl", tmp_path / "p.lmdb")
    ds = PackedImageFolder(tmp_path / "p.lmdb")
    assert ds.classes == ["cat", "dog"] and ds.targets == [0, 1]
    assert ds.field("caption").tolist() == ["one", "three"] and ds.fields == {"caption": "string", "score": "float"}
    skipped = {item["path"]: item["reason"] for item in ds.manifest["skipped"]}
    assert list(skipped) == ["cat/2.png"] and "row 3: column 'score' (float): is missing" in skipped["cat/2.png"]
    rows = {item["row"]: item["reason"] for item in ds.manifest["fields"]["rows_left_out"]}
    assert set(rows) == {3, 4} and "outside the class folders" in rows[4]  # loose.png: no image of this ImageFolder


def test_jsonl_and_tsv_tables(tmp_path: Path) -> None:
    source = make_source(tmp_path, bad=False)
    write_jsonl(source, tmp_path / "labels.jsonl")
    _pack(source.root, tmp_path / "labels.jsonl", tmp_path / "j.shards")
    ds = PackedImageFolder(tmp_path / "j.shards")
    assert ds.fields["age"] == "int" and ds.fields["smiling"] == "bool" and ds.fields["attrs"] == "list[int]"
    assert ds.field("caption")[2] == "ñandú 犬\nsecond line"
    text = source.table.read_text("utf-8").replace(",", "\t")  # no cell of the clean table holds a comma... but one
    (tmp_path / "labels.tsv").write_text(text.replace("a dog\t running", "a dog, running"), "utf-8")
    _pack(source.root, tmp_path / "labels.tsv", tmp_path / "t.shards")
    assert PackedImageFolder(tmp_path / "t.shards").field("caption")[0] == "a dog, running"


def test_parquet_table(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed (the parquet extra)")
    import pyarrow.parquet as pq

    write_images(tmp_path / "img", ["a.png", "b.png"])
    pq.write_table(pa.table({"path": ["a.png", "b.png"], "label": ["x", "y"], "v": [[1.5], [2.0, 3.0]]}),
                   tmp_path / "t.parquet")
    _pack(tmp_path / "img", tmp_path / "t.parquet", tmp_path / "p.shards")
    ds = PackedImageFolder(tmp_path / "p.shards")
    assert ds.fields == {"v": "list[float]"} and ds.field("v").tolist() == [[1.5], [2.0, 3.0]]


@pytest.mark.parametrize(("table", "options", "message"), [
    ("missing.csv", {}, "missing.csv: table not found"),
    ("t.csv", {"path_column": "file"}, re.escape("t.csv: no column 'file' (its columns: path, label, x); name the "
                                                 "column of image paths with --path-column")),
    ("t.csv", {"label_column": "kind"}, "--label-column kind: .* has no column 'kind'"),
    ("t.csv", {"types": {"y": "int"}}, "--field y:int: .* has no column 'y'"),
    ("t.csv", {"types": {"label": "float"}}, "the class column 'label' holds integers or names"),
    ("t.txt", {}, "not a table packload reads; give a .csv, .tsv, .jsonl or .parquet file"),
    ("dup.csv", {}, "two columns named 'x'"),
    ("empty.csv", {}, "empty; give a table whose first row names its columns"),
])
def test_bad_tables_fail_in_one_line(tmp_path: Path, table: str, options: dict, message: str) -> None:
    write_images(tmp_path / "img", ["a.png"])
    (tmp_path / "t.csv").write_text("path,label,x\na.png,c,1\n")
    (tmp_path / "t.txt").write_text("path\na.png\n")
    (tmp_path / "dup.csv").write_text("path,x,x\na.png,1,2\n")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(UsageError, match=message):
        _pack(tmp_path / "img", TableOptions(tmp_path / table, **options), tmp_path / "p.shards")
    assert not (tmp_path / "p.shards").exists()


def test_field_specs() -> None:
    assert parse_field_spec("age:int") == ("age", "int") and parse_field_spec("a:b:str") == ("a:b", "string")
    assert parse_field_spec("v: List[Float]") == ("v", "list[float]")
    for bad in ("age", ":int", "age:integral"):
        with pytest.raises(ValueError, match="--field"):
            parse_field_spec(bad)


def test_a_class_column_beside_a_label_column_is_refused(tmp_path: Path) -> None:
    write_images(tmp_path / "img", ["a.png"])
    (tmp_path / "t.csv").write_text("path,label,kind\na.png,1,c\n")
    with pytest.raises(UsageError, match="a column is named 'label' but --label-column is 'kind'"):
        _pack(tmp_path / "img", TableOptions(tmp_path / "t.csv", label_column="kind"), tmp_path / "p.shards")


def test_table_rows_in_any_order_and_dot_slash_paths(tmp_path: Path) -> None:
    write_images(tmp_path / "img", ["b.png", "a.png", "c.png"])
    (tmp_path / "t.csv").write_text("path,n\n./c.png,3\nb.png,2\n./a.png,1\n")
    _pack(tmp_path / "img", tmp_path / "t.csv", tmp_path / "p.shards")
    ds = PackedImageFolder(tmp_path / "p.shards")
    assert [ds.path(i) for i in range(3)] == ["a.png", "b.png", "c.png"] and ds.field("n").tolist() == [1, 2, 3]
    assert ds.classes == [] and ds.targets == [-1, -1, -1]  # no class column, no class folders: unlabelled
