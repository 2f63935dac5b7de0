"""``benchmarks/hostile_costs.py`` at its quick scale: every hostile input it makes is refused, with
little allocated (the figures themselves are timings, which a test does not judge)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import hostile_costs  # noqa: E402


def test_quick_run_refuses_everything(tmp_path: Path) -> None:
    figures = hostile_costs.main(["--quick", "--json", str(tmp_path / "f.json")])
    scans = figures["scans"]
    assert scans["scans"] == 2000
    for route in ("pack_keep_fast", "pack_keep_full", "pack_reencode"):
        assert "more than 500 scans" in scans[route]["reason"]
    for kind in ("baseline", "progressive"):
        assert 50_000 < scans[kind]["bytes"] < 200_000
    for name, got in figures["sizes"].items():
        assert got["outcome"].startswith("PackFormatError: "), (name, got)
        assert "\n" not in got["outcome"] and got["peak_bytes"] < 1 << 20, (name, got)
    assert (tmp_path / "f.json").stat().st_size > 0
