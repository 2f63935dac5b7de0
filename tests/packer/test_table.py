"""A table's two passes: the paths and each column's type (given, or inferred from every row), the
class column settled, then every cell converted, a row that cannot be used noted with the reason,
and a table that changes between the passes refused."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from packload.core.errors import UsageError
from packload.packer.table import Table
from packload.packer.table_options import TableOptions


def _table(tmp_path: Path, text: str, name: str = "t.csv", **options: object) -> Table:
    path = tmp_path / name
    path.write_text(text, "utf-8")
    table = Table(TableOptions(path, **options))  # type: ignore[arg-type]
    table.read_paths()
    return table


def test_pass_one_reads_paths_and_decides_types(tmp_path: Path) -> None:
    table = _table(tmp_path, "path,label,n,score,tags\n./a.png,cat,1,0.5,[1]\nb.png,dog,2,1,[]\n,cat,3,2,[2]\n"
                   "short.png,cat\n", types={"score": "string"})
    assert table.rows == 4 and [table.path(k) for k in range(4)] == ["a.png", "b.png", "", ""]
    assert table.label_column == "label" and table.label_type == "string"
    assert table.types == {"n": "int", "score": "string", "tags": "list[int]"}  # the class column is no field
    assert table.problems == {2: "path is empty", 3: "has 2 cells, the header names 5 columns"}
    assert table.path_bytes(0) == b"a.png"


def test_pass_two_converts_every_cell_and_notes_the_rows_it_cannot_use(tmp_path: Path) -> None:
    table = _table(tmp_path, "path,label,n,tags\na.png,2,7,[1]\nb.png,x,8,[2]\nc.png,0,,[3]\nd.png,1,9,\"[4,x]\"\n",
                   types={"label": "int", "n": "int", "tags": "list[int]"})
    columns, codes, names = table.convert()
    assert [(c.name, c.type) for c in columns] == [("n", "int"), ("tags", "list[int]")]
    assert codes is not None and codes.tolist() == [2, -1, -1, -1] and names == []
    assert columns[0].values.tolist() == [7, 0, 0, 0]  # a row left out holds a blank
    assert columns[1].offsets is not None and columns[1].offsets.tolist() == [0, 1, 1, 1, 1]
    assert table.problems == {1: "t.csv row 2: column 'label' (the class, int): 'x' is not an integer",
                              2: "t.csv row 3: column 'n' (int): is empty",
                              3: "t.csv row 4: column 'tags' (list[int]): '[4,x]' is not a JSON list"}


def test_class_names_are_coded_in_the_order_first_seen(tmp_path: Path) -> None:
    table = _table(tmp_path, "file,kind,v\na.png,dog,1\nb.png,cat,2\nc.png,dog,3\nd.png, ,4\n", path_column="file",
                   label_column="kind")
    _, codes, names = table.convert()
    assert codes is not None and codes.tolist() == [0, 1, 0, -1] and names == ["dog", "cat"]
    assert table.problems == {3: "t.csv row 4: column 'kind' (the class): is empty"}
    big = _table(tmp_path, "path,label\na.png,1000000\n", name="big.csv")
    big.convert()
    assert "1000000 is not in 0..999999" in big.problems[0]


def test_a_numeric_column_with_a_stray_word_is_text_with_a_warning(tmp_path: Path) -> None:
    rows = "".join(f"{k}.png,{k}\n" for k in range(50)) + "x.png,n/a\n"
    with pytest.warns(UserWarning, match=r"column 'v' is stored as text: 1 of its cells is not a number \(row 51: "
                                         r"'n/a'\); give --field v:int"):
        table = _table(tmp_path, "path,v\n" + rows)
    assert table.types == {"v": "string"}


@pytest.mark.parametrize("cells", [["hello"], ["", "hello"], ["7", "n/a"]])
def test_a_text_column_that_is_not_mostly_numbers_is_text_without_a_warning(tmp_path: Path, cells: list[str]) -> None:
    """The warning is for a column of numbers but for a stray cell: a text column of one word, or
    as many words as numbers, is simply text."""
    rows = "".join(f"{k}.png,{cell}\n" for k, cell in enumerate(cells))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = _table(tmp_path, "path,v\n" + rows)
    assert table.types == {"v": "string"}


def test_jsonl_columns_are_known_once_constructed(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"path": "a.png", "label": 3, "note": "y"}\n{"path": "b.png", "label": 1, "note": "x"}\n')
    table = Table(TableOptions(path))
    assert table.rows == 2 and table.label_type == "int" and table.types == {"note": "string"}


@pytest.mark.parametrize("change", ["path,n\na.png,1\nb.png,2\nc.png,3\n",  # a row added
                                    "path,n\na.png,1\nb.png,9\n"])  # a cell changed, as many rows
def test_a_table_changed_between_the_passes_is_refused(tmp_path: Path, change: str) -> None:
    table = _table(tmp_path, "path,n\na.png,1\nb.png,2\n")
    (tmp_path / "t.csv").write_text(change)
    with pytest.raises(UsageError, match="changed while it was being read"):
        table.convert()


@pytest.mark.parametrize(("header", "options", "message"), [
    ("path,kind", {"label_column": "path"}, "--label-column path: that is the column of image paths"),
    ("path,label", {"label_column": "path"}, "a column is named 'label' but --label-column is 'path'"),
    ("path,label", {"types": {"path": "int"}}, "'path' is the column of image paths, not a field"),
    ("path,label", {"types": {"label": "bool"}}, "the class column 'label' holds integers or names"),
])
def test_options_that_contradict_the_columns_are_refused(tmp_path: Path, header: str, options: dict,
                                                         message: str) -> None:
    with pytest.raises(UsageError, match=message):
        _table(tmp_path, header + "\na.png,1\n", **options)
