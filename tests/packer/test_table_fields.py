"""What a joined table hands the pack: the images skipped for their row interleaved in scan order
with the files skipped while packing, and the fields part of the records written (a skipped file's
row taken out) with its manifest entry."""

from __future__ import annotations

import hashlib
from pathlib import Path

from packload.core.fields import decode_fields, part_name
from packload.core.samples import Sample, SampleList
from packload.core.scan import ScanResult
from packload.packer.table import Table
from packload.packer.table_fields import TableFields
from packload.packer.table_match import join
from packload.packer.table_options import TableOptions
from packload.packer.table_source import table_of


def _fields(tmp_path: Path) -> TableFields:
    table_path = tmp_path / "t.csv"
    table_path.write_text("path,n,caption\na.png,1,one\nb.png,x,two\nc.png,3,three\nd.png,4,four\nghost.png,5,five\n",
                          "utf-8")
    scan = ScanResult(root=tmp_path, classes=[],
                      samples=SampleList.of(Sample(p, -1) for p in ["a.png", "b.png", "c.png", "d.png"]))
    joined = join(scan, Table(TableOptions(table_path, types={"n": "int"})), strict=False)
    fields = table_of(joined)
    assert fields is not None
    return fields


def test_skips_interleave_with_the_files_skipped_while_packing(tmp_path: Path) -> None:
    fields = _fields(tmp_path)  # b.png skipped for its row, before the 2nd packed sample (c.png)
    packing = [{"path": "a.png", "reason": "broken", "pos": 0}, {"path": "d.png", "reason": "broken", "pos": 2}]
    listed, files = fields.with_skips(packing, 3)
    assert [item["path"] for item in listed] == ["a.png", "b.png", "d.png"] and files == 4
    assert "column 'n' (int): 'x' is not an integer" in listed[1]["reason"]


def test_the_fields_part_holds_the_rows_of_the_records_written(tmp_path: Path) -> None:
    fields = _fields(tmp_path)
    pieces: list[bytes] = []
    entry = fields.part([{"path": "c.png", "reason": "broken", "pos": 1}], 3, "shards", lambda b: pieces.append(bytes(b)))
    part = b"".join(pieces)
    columns = {c.name: c for c in decode_fields(part, "fields", 2)}  # a.png and d.png
    assert columns["n"].values.tolist() == [1, 4]
    caption = columns["caption"]
    assert caption.offsets is not None
    assert [bytes(caption.values[caption.offsets[k]:caption.offsets[k + 1]]).decode() for k in range(2)] == \
        ["one", "four"]
    assert entry["size"] == len(part) and entry["sha256"] == hashlib.sha256(part).hexdigest()
    assert entry["name"] == part_name("shards")
    assert entry["columns"] == [{"name": "n", "type": "int"}, {"name": "caption", "type": "string"}]
    assert entry["table"] == {"name": "t.csv", "rows": 5, "sha256": fields.sha256}
    assert entry["rows_left_out_count"] == 2 and [r["row"] for r in entry["rows_left_out"]] == [2, 5]
    assert fields.columns == []  # handed over: the spilled columns are gone once written


def test_the_options_record_names_the_table_by_its_digest(tmp_path: Path) -> None:
    fields = _fields(tmp_path)
    record = fields.options_record()
    assert record["sha256"] == hashlib.sha256((tmp_path / "t.csv").read_bytes()).hexdigest()
    assert record["table"] == "t.csv" and record["types"] == {"n": "int"} and record["label_column"] is None
