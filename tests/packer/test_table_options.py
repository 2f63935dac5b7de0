"""The options of a table to pack: a path or URL kept as text, the types given spelled one way, the
table's name, and the record the manifest and ``--resume`` compare."""

from __future__ import annotations

from pathlib import Path

import pytest

from packload.packer.table_options import TableOptions, table_options


def test_types_given_are_spelled_one_way_and_recorded_in_order(tmp_path: Path) -> None:
    options = TableOptions(tmp_path / "labels.csv", label_column="kind", types={"v": " List[Float]", "age": "INT"})
    assert options.path == str(tmp_path / "labels.csv") and options.name == "labels.csv"
    assert options.types == {"v": "list[float]", "age": "int"}
    record = options.record()
    assert record == {"table": "labels.csv", "path_column": "path", "label_column": "kind",
                      "types": {"age": "int", "v": "list[float]"}}
    assert list(record["types"]) == ["age", "v"]  # sorted: the same options give the same record


def test_an_unknown_type_is_refused() -> None:
    with pytest.raises(ValueError, match="integral"):
        TableOptions("labels.csv", types={"age": "integral"})


def test_a_path_or_url_becomes_options_with_the_defaults() -> None:
    options = table_options("s3://bucket/data/labels.jsonl/")
    assert options.name == "labels.jsonl" and options.path_column == "path" and options.label_column is None
    given = TableOptions("t.csv", path_column="file")
    assert table_options(given) is given
