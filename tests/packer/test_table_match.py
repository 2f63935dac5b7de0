"""Joining a table with the images a scan found: each image's row matched on its path's bytes (a
hash collision never joins two paths), a path in two rows used by neither, the classes from the
class column, and every image or row left out listed with the reason, or refused under strict."""

from __future__ import annotations

from pathlib import Path

import pytest

import packload.packer.table_match as table_match
from packload.core.errors import SkippedFileError, UsageError
from packload.core.samples import Sample, SampleList
from packload.core.scan import ScanResult
from packload.packer.table import Table
from packload.packer.table_match import join, match_rows
from packload.packer.table_options import TableOptions


def _table(tmp_path: Path, text: str, **options: object) -> Table:
    path = tmp_path / "t.csv"
    path.write_text(text, "utf-8")
    table = Table(TableOptions(path, **options))  # type: ignore[arg-type]
    table.read_paths()
    return table


def _scan(tmp_path: Path, paths: list[str], ignored: list[dict[str, str]] | None = None) -> ScanResult:
    return ScanResult(root=tmp_path, classes=[], samples=SampleList.of(Sample(p, -1) for p in paths),
                      ignored=ignored or [])


def test_each_image_finds_its_row_and_a_repeated_path_is_grouped(tmp_path: Path) -> None:
    table = _table(tmp_path, "path,n\nb.png,1\nñ/a.png,2\n./b.png,3\nc.png,4\n,5\nb.png,6\n")
    samples = SampleList.of(Sample(p, -1) for p in ["c.png", "b.png", "ñ/a.png", "none.png"])
    row_of, duplicates = match_rows(samples, table)
    assert row_of[[0, 2, 3]].tolist() == [3, 1, -1]
    assert row_of[1] in (0, 2, 5)  # one of b.png's rows: the join leaves all of them out
    assert duplicates == {0: [0, 2, 5], 2: [0, 2, 5], 5: [0, 2, 5]}  # "./b.png" is "b.png"; the empty path joins none


def test_colliding_hashes_are_told_apart_by_the_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every path of one length given one hash: matches and repeats are still the paths' own, and
    runs of a few samples at a time meet every row."""
    monkeypatch.setattr(table_match, "hash", len, raising=False)
    monkeypatch.setattr(table_match, "_MATCH_RUN", 2)
    table = _table(tmp_path, "path\nab.png\ncd.png\ncd.png\nef.png\nx.png\n")
    samples = SampleList.of(Sample(p, -1) for p in ["x.png", "ef.png", "ab.png", "zz.png", "cd.png"])
    row_of, duplicates = match_rows(samples, table)
    assert row_of.tolist()[:4] == [4, 3, 0, -1] and row_of[4] in (1, 2)
    assert duplicates == {1: [1, 2], 2: [1, 2]}


def test_join_keeps_the_usable_rows_and_says_why_of_the_rest(tmp_path: Path) -> None:
    table = _table(tmp_path, "path,label,n\na.png,dog,1\nb.png,cat,x\nc.png,cat,3\nc.png,dog,4\n"
                   "d.png,emu,5\ngone.png,cat,6\nhidden.png,cat,7\n", types={"n": "int"})
    scan = _scan(tmp_path, ["a.png", "b.png", "c.png", "d.png", "e.png"],
                 ignored=[{"path": "hidden.png", "reason": "a hidden file"}])
    result = join(scan, table, strict=False)
    assert [result.samples.path(k) for k in range(len(result.samples))] == ["a.png", "d.png"]
    assert result.classes == ["dog", "emu"] and result.samples.labels.tolist() == [0, 1]  # only the classes packed
    fields = result.table
    assert fields.row_of.tolist() == [0, 4] and fields.columns[0].values[fields.row_of].tolist() == [1, 5]
    assert [(at, path) for at, path, _ in fields.skips] == [(1, "b.png"), (1, "c.png")]  # packed before each
    assert "column 'n' (int): 'x' is not an integer" in fields.skips[0][2]
    assert "rows 3, 4 all give this path" in fields.skips[1][2]
    assert [item["path"] for item in result.ignored] == ["e.png", "hidden.png"]
    assert result.ignored[0]["reason"] == "image with no row in t.csv"
    left = {item["row"]: item["reason"] for item in fields.rows_left_out}
    assert set(left) == {2, 3, 4, 6, 7} and fields.rows_left_out_count == 5
    assert left[3] == "its path is in row 4 too" and left[2].startswith("column 'n' (int)")
    assert left[6] == "no image at this path in the source"
    assert left[7] == "no image at this path in the source (left out: a hidden file)"
    assert table.paths == b""  # the table's paths let go once joined


def test_integer_classes_run_from_zero_to_the_largest(tmp_path: Path) -> None:
    table = _table(tmp_path, "path,label\na.png,4\nb.png,1\n")
    result = join(_scan(tmp_path, ["a.png", "b.png"]), table, strict=False)
    assert result.classes == ["0", "1", "2", "3", "4"] and result.samples.labels.tolist() == [4, 1]


def test_strict_refuses_the_first_row_then_image_left_out(tmp_path: Path) -> None:
    table = _table(tmp_path, "path,n\na.png,1\nghost.png,2\n")
    with pytest.raises(SkippedFileError, match=r"t.csv row 2 \(ghost.png\): no image at this path"):
        join(_scan(tmp_path, ["a.png"]), table, strict=True)
    table = _table(tmp_path, "path,n\na.png,1\n")
    with pytest.raises(SkippedFileError, match="extra.png: image with no row in t.csv; add a row for it"):
        join(_scan(tmp_path, ["a.png", "extra.png"]), table, strict=True)


def test_no_usable_row_is_an_error_naming_the_first_problem(tmp_path: Path) -> None:
    table = _table(tmp_path, "path,n\na.png,1\n")
    with pytest.raises(UsageError, match=r"no image has a usable row in .*t.csv \(first problem: row 1, a.png: no "
                                         "image at this path"):
        join(_scan(tmp_path, ["b.png"]), table, strict=False)
