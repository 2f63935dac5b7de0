"""`packload demo` runs the whole job end to end on generated images."""

from __future__ import annotations

import json

import pytest

from packload import PackedImageFolder
from packload.cli import main
from packload.demo import run_demo


@pytest.mark.long  # the whole demo, its tune included
def test_demo_generates_packs_loads_tunes_and_reports(tmp_path, capsys):
    assert main(["demo", "--dir", str(tmp_path / "d"), "--count", "120", "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "", "with --json no progress line is written"
    result = json.loads(captured.out)
    assert result["verified"] == {"demo.lmdb": True, "demo.shards": True}
    for name in ("demo.lmdb", "demo.shards"):
        assert result["packs"][name]["records"] == 120
        assert len(PackedImageFolder(tmp_path / "d" / name)) == 120
    sources = {"folder", "demo.lmdb", "demo.shards"}
    for kind, expected in (("bytes", sources), ("decode+crop", sources | {"PackLoader"})):
        assert set(result["samples_per_s"][kind]) == expected
        assert all(rate > 0 for rate in result["samples_per_s"][kind].values())
    assert result["tune"]["verdict"] in ("input-bound", "compute-bound")
    assert any(line.strip().startswith("verdict:") for line in result["report"])
    tuned = result["tune"]  # PackLoader tuned beside the DataLoader, against the same step
    assert tuned["fast_path"] is not None and tuned["winner"] == tuned["trials"][tuned["winner_index"]]
    pick_line = next(line for line in result["report"] if line.strip().startswith("pick (#"))
    assert f"{tuned['winner']['samples_per_s']:,.0f} img/s" in pick_line  # the pick shows its row's figure
    import re

    said = "\n".join(result["report"]) + tuned["message"]  # in `packload tune`'s flags, not the library's names
    assert not re.search(r"\b(budget_s|max_workers|step_ms)\b", said), said


def test_demo_refuses_a_tiny_count(tmp_path):
    with pytest.raises(ValueError, match="at least 100"):
        run_demo(tmp_path, count=5, progress=False)


def test_demo_report_keeps_tune_pick_and_notes_and_ends_with_next_steps(tmp_path, monkeypatch) -> None:
    """Tune's pick: line stays when a note: appears; the report ends with the commands to run on
    your own folder and the two lines of Python to change; it says where the files are."""
    import packload.demo as demo

    real = demo.format_tune_report
    monkeypatch.setattr(demo, "format_tune_report", lambda result: [*real(result), "  note: a note from tune"])
    result = run_demo(tmp_path / "d", count=100, progress=False, tune_budget_s=2.0)
    report = [line.strip() for line in result["report"]]
    assert any(line.startswith("pick (#") for line in report)
    assert "note: a note from tune" in report
    assert any(line.startswith("pack ./images ./data.lmdb") for line in report)
    assert any(line.startswith("packload tune ./data.lmdb") for line in report)
    assert "from packload import PackedImageFolder" in report
    assert any(line.startswith('ds = PackedImageFolder("./data.lmdb"') for line in report)
    assert str((tmp_path / "d").resolve()) in report[-1]


def test_demo_default_folder_is_ignored_by_git() -> None:
    """The command's default folder is the one the checkout's .gitignore names."""
    from pathlib import Path

    from packload.cli import build_parser

    default = build_parser().parse_args(["demo"]).dir
    ignored = (Path(__file__).resolve().parents[1] / ".gitignore").read_text().split()
    assert f"/{default}/" in ignored
