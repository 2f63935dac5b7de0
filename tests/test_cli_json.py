"""Every ``--json`` output has one shape: ``schema_version`` and ``command``, then the command's keys
(docs/CLI.md); plain ``info`` lists what was skipped and left out, as ``pack`` says it does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from packload.cli import JSON_SCHEMA_VERSION, main

DOC = Path(__file__).resolve().parents[1] / "docs" / "CLI.md"


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("json")
    for cls in ("cat", "dog"):
        (root / "images" / cls).mkdir(parents=True)
        for i in range(6):
            Image.new("RGB", (16, 12), (30 * i, 60, 90)).save(root / "images" / cls / f"{i}.jpg")
    for i in range(25):  # broken files: more than plain `info` lists
        (root / "images" / "cat" / f"bad{i:02d}.jpg").write_bytes(b"broken")
    (root / "images" / "notes.txt").write_text("left out")
    return root


def as_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_every_command_has_the_same_head(place: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pack = str(place / "p.shards")
    runs = {
        "pack": ["pack", str(place / "images"), pack, "--overwrite"],
        "info": ["info", pack],
        "verify": ["verify", pack],
        "unpack": ["unpack", pack, str(tmp_path / "out")],
        "merge": ["merge", str(tmp_path / "m.lmdb"), pack],
        "tune": ["tune", pack, "--step-ms", "1", "--batch-size", "4", "--budget", "2", "--max-workers", "0"],
        "doctor": ["doctor", pack, "--no-measure"],
    }
    doc = DOC.read_text()
    shared = doc.split("## `--json`")[1].split("\n## ")[0]  # the keys every command's output has
    for command, argv in runs.items():
        out = as_json(argv, capsys)
        assert list(out)[:2] == ["schema_version", "command"] and list(out)[-1] == "warnings", command
        assert out["schema_version"] == JSON_SCHEMA_VERSION and out["command"] == command
        assert out["warnings"] == [], command
        section = doc.split(f"## `packload {command}`")[1].split("\n## ")[0]
        undocumented = [key for key in list(out)[2:] if f"`{key}`" not in section and f"`{key}`" not in shared]
        assert undocumented == [], command


def test_docs_name_every_option_of_every_command() -> None:
    from packload.cli import build_parser
    from packload.cli_parser import option_strings, subcommand_parsers

    doc = DOC.read_text()
    for sub in subcommand_parsers(build_parser()):
        section = doc.split(f"## `{sub.prog}`")[1].split("\n## ")[0]
        assert [flag for flag in option_strings(sub) if flag.startswith("--") and flag != "--help" and flag not in section] == []


def test_pack_json_keys(place: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = as_json(["pack", str(place / "images"), str(place / "k.lmdb"), "--overwrite"], capsys)
    assert {"records", "files_total", "files_this_run", "files_per_s", "skipped", "ignored", "engine",
            "ray", "resumed_at"} <= set(out)
    assert out["engine"] == "local" and out["ray"] is None and out["files_this_run"] == out["files_total"]


def test_plain_info_lists_skipped_and_left_out_bounded(place: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pack", str(place / "images"), str(place / "i.lmdb"), "--quiet", "--overwrite"]) == 0
    assert main(["info", str(place / "i.lmdb")]) == 0
    out = capsys.readouterr().out
    listed = [line for line in out.splitlines() if line.startswith("  skipped cat/bad")]
    assert len(listed) == 20
    assert "... and 5 more skipped" in out
    assert "left out notes.txt: file outside the class folders" in out
