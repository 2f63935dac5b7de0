"""`packload demo` runs the whole job end to end on generated images."""

from __future__ import annotations

import json

import pytest

from packload import PackedImageFolder
from packload.cli import main
from packload.demo import run_demo


def test_demo_generates_packs_loads_tunes_and_reports(tmp_path, capsys):
    assert main(["demo", "--dir", str(tmp_path / "d"), "--count", "120", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
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


def test_demo_refuses_a_tiny_count(tmp_path):
    with pytest.raises(ValueError, match="at least 100"):
        run_demo(tmp_path, count=5, progress=False)
