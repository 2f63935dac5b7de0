"""The command line of packing from a table: ``pack --labels`` (and ``--path-column``,
``--label-column``, ``--field``), what ``info`` says of the fields and the rows left out, ``unpack``'s
table, and every bad input ending in one line and a non-zero exit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from packload.cli import main
from packload.core.format import FIELDS_NAME
from tests.fields_source import BAD_ROWS, GOOD, make_source, write_images

FIELD_ARGS = ["--field", "age:int", "--field", "attrs:list[int]"]


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_pack_info_unpack(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = make_source(tmp_path)
    dst = tmp_path / "p.shards"
    code, out, err = _run(["pack", str(source.root), str(dst), "--labels", str(source.table), *FIELD_ARGS], capsys)
    assert code == 0, err
    assert (f"fields: age (int), height (float), smiling (bool), caption (string), attrs (list[int]), embedding "
            f"(list[float]), id (string); {len(BAD_ROWS) + 1} table rows left out (`packload info {dst}` lists them)"
            in out)
    code, out, err = _run(["info", str(dst)], capsys)
    assert code == 0, err
    assert "  fields    age int, height float, smiling bool, caption string, attrs list[int]" in out
    assert f"  table     labels.csv: {len(GOOD) + len(BAD_ROWS) + 1} rows, path column path, class column label " \
           f"(string); {len(BAD_ROWS) + 1} rows left out" in out
    assert f"  row {len(GOOD) + 1} (ghost.png): no image at this path in the source" in out
    assert "  skipped old.png: " in out and "'old' is not an integer" in out
    code, out, _ = _run(["info", str(dst), "--json"], capsys)
    info = json.loads(out)
    assert info["fields"]["columns"]["embedding"] == "list[float]" and info["fields"]["label_column"] == "label"
    assert info["fields"]["rows_left_out_count"] == len(BAD_ROWS) + 1
    code, out, err = _run(["unpack", str(dst), str(tmp_path / "out")], capsys)
    assert code == 0 and "and the table as labels.csv" in out
    assert (tmp_path / "out" / "labels.csv").read_text("utf-8").startswith("path,label,age,height")


def test_pack_json_and_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_images(tmp_path / "img", ["a.png", "b.png"])
    (tmp_path / "t.csv").write_text("file,kind,w\na.png,x,1.5\nb.png,y,2\n")
    code, out, err = _run(["pack", str(tmp_path / "img"), str(tmp_path / "p.lmdb"), "--labels", str(tmp_path / "t.csv"),
                           "--path-column", "file", "--label-column", "kind", "--json"], capsys)
    assert code == 0, err
    result = json.loads(out)
    assert result["fields"] == {"w": "float"} and result["rows_left_out"] == 0 and result["classes"] == 2
    code, out, _ = _run(["pack", str(tmp_path / "img"), str(tmp_path / "plain.shards"), "--json"], capsys)
    assert json.loads(out)["fields"] is None and not (tmp_path / "plain.shards" / FIELDS_NAME).exists()


@pytest.mark.parametrize(("extra", "message", "status"), [
    (["--labels", "{tmp}/missing.csv"], "missing.csv: table not found; give the file of labels", 2),
    (["--labels", "{tmp}/t.csv", "--field", "w:integral"], "--field 'w:integral': unknown field type 'integral'; "
                                                          "choose one of int, float, bool, string", 2),
    (["--labels", "{tmp}/t.csv", "--field", "w"], "--field 'w': write NAME:TYPE", 2),
    (["--labels", "{tmp}/t.csv", "--path-column", "file"], "no column 'file' (its columns: path, label, w); name "
                                                           "the column of image paths with --path-column", 2),
    (["--labels", "{tmp}/t.csv", "--field", "nope:int"], "--field nope:int: ", 2),
    (["--path-column", "file"], "--path-column describes a table of labels; give it with --labels labels.csv", 2),
    (["--field", "w:int"], "--field describes a table of labels; give it with --labels labels.csv", 2),
    (["--labels", "{tmp}/t.csv", "--strict"], "t.csv row 2 (ghost.png): no image at this path in the source; fix "
                                              "the table, or pack without --strict", 1),
])
def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str,
                               status: int) -> None:
    write_images(tmp_path / "img", ["a.png"])
    (tmp_path / "t.csv").write_text("path,label,w\na.png,c,1\nghost.png,c,2\n")
    args = ["pack", str(tmp_path / "img"), str(tmp_path / "p.shards"), *[a.format(tmp=tmp_path) for a in extra]]
    code, _, err = _run(args, capsys)
    assert code == status
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert message in err, err
    assert not (tmp_path / "p.shards").exists()


def test_verify_names_a_damaged_fields_part(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_images(tmp_path / "img", ["a.png", "b.png"])
    (tmp_path / "t.csv").write_text("path,w\na.png,1\nb.png,2\n")
    assert main(["pack", str(tmp_path / "img"), str(tmp_path / "p.shards"), "--labels", str(tmp_path / "t.csv"),
                 "--quiet"]) == 0
    part = tmp_path / "p.shards" / FIELDS_NAME
    part.write_bytes(part.read_bytes()[:-1] + b"\x07")
    capsys.readouterr()
    code, out, _ = _run(["verify", str(tmp_path / "p.shards"), "--quiet"], capsys)
    assert code == 1 and "  fields.bin: sha256 differs from the manifest" in out
