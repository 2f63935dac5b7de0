"""BENCHMARKS.md's generated parts against the raw results they come from (benchmarks/page.py).

The committed page must be what the generator makes from the committed JSON (so the page cannot
drift from the data), the figures must be computed right from known rounds, and the chart must be
a PNG of the expected size. No peers, no timing.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import page  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

TEMPLATE = """# Benchmarks

Hand-written prose that the generator keeps as it is.

<!-- BEGIN GENERATED: machine -->
<!-- END GENERATED: machine -->

<!-- BEGIN GENERATED: command -->
stale text that the generator replaces
<!-- END GENERATED: command -->

<!-- BEGIN GENERATED: headline -->
<!-- END GENERATED: headline -->

## Where packload loses

<!-- BEGIN GENERATED: losses -->
<!-- END GENERATED: losses -->

More prose.
"""


def _block(text: str, name: str) -> str:
    m = re.search(rf"<!-- BEGIN GENERATED: {name}[^>]*-->\n(.*?)<!-- END GENERATED: {name} -->", text, re.S)
    assert m, f"no {name} block"
    return m.group(1)


def _table(text: str) -> list[list[str]]:
    """The headline table's body rows, cells stripped."""
    lines = [line for line in _block(text, "headline").splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


def _result(name: str, key: str, rounds: list[float | None]) -> dict[str, Any]:
    runs = [{"phase": f"run {i + 1}", key: v} if v is not None else {"phase": f"run {i + 1}", "error": "boom"}
            for i, v in enumerate(rounds)]
    return {"name": name, "runs": runs, "warmup_runs": [{"phase": "warmup 1", key: 1e9}]}


def _small_results(folder: Path) -> None:
    """A run with known rounds: one cold read case, one pack case, one write against FFCV."""
    read = [
        _result("packload lmdb", "samples_per_s", [100.0, 300.0, 200.0]),
        _result("packload shards", "samples_per_s", [150.0, 150.0, 150.0]),
        _result(page.BASELINE, "samples_per_s", [50.0, 40.0, 60.0]),
        _result("webdataset", "samples_per_s", [10.0, None]),  # a failed round is left out
        _result("litdata", "samples_per_s", [400.0, 100.0, 250.0]),
    ]
    pack = [_result("packload lmdb keep", "files_per_s", [900.0, 800.0, 1000.0]),
            _result("packload lmdb raw", "files_per_s", [5000.0, 5000.0, 5000.0]),  # not a `keep` row
            _result(page.TAR, "files_per_s", [1000.0, 1000.0, 1000.0])]
    run = {"read": {"data": {"datasets": {"imagenet": {"modes": {"bytes": {"cold": {"results": read}}}}}}},
           "pack": {"data": {"datasets": {"cifar": {"results": pack}}}}}
    writes = {"writes": [{"name": "imagenet jpeg 256 → crop 224",
                          "packload_s": [10.0, 12.0, 11.0], "ffcv_s": [22.0, 20.0, 24.0]}]}
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps(run))
    (folder / "crown-writes.json").write_text(json.dumps(writes))
    (folder / "session.json").write_text(json.dumps({
        "date": "2026-12-02T01:00:00+00:00", "command": "python benchmarks/page.py --run",
        "steps": [{"command": "python benchmarks/run.py --repeats 3", "minutes": 30.0}],
        "machine": {"cpu": "Some CPU", "logical_cores": 2, "usable_cores": 2, "ram_gb": 8.0, "os": "Linux 6.1.2-build7",
                    "versions": {"python": "3.11.7", "torch": "2.13.0+cpu", "packload": "0.1.0"},
                    "peer_versions": {"litdata": "0.2.76", "ffcv": None}},
        "loadavg": {"interval_s": 15, "samples": [[0, 1.0, 1, 1], [15, 3.0, 1, 1], [30, 2.0, 1, 1]]}}))


def test_figures_are_computed_from_the_rounds(tmp_path: Path) -> None:
    results = tmp_path / "results"
    _small_results(results)
    (tmp_path / "page.md").write_text(TEMPLATE)
    assert page.main(["--results", str(results), "--page", str(tmp_path / "page.md"),
                      "--chart", str(tmp_path / "chart.png")]) == 0
    text = (tmp_path / "page.md").read_text()
    rows = {(r[0], r[1]): r for r in _table(text)}
    assert len(rows) == 3

    read = rows[("read, cold cache", "20k JPEGs, undecoded bytes")]
    # the best packload path by median (lmdb 200 > shards 150), its spread, the rounds counted
    assert read[2:6] == ["samples/s", "lmdb", "200 [100–300]", "3"]
    assert read[6:] == ["FolderImages 50.0", "**4.00×**", "LitData 250", "0.80× ▼"]

    packed = rows[("pack", "50k PNGs, original bytes (`keep`)")]
    assert packed[3:] == ["lmdb", "900 [800–1,000]", "3", "tar 1,000", "0.90× ▼", "—", "—"]

    write = rows[("pack vs FFCV", "20k JPEGs, pack `--encoding jpeg --max-side 256` (FFCV `jpg`, 256)")]
    # seconds: lower is better, so the ratio is FFCV's median time over packload's
    assert write[2:] == ["seconds", "`pack --workers 2`", "11.0 [10.0–12.0]", "3", "—", "—", "FFCV 22.0", "**2.00×**"]

    losses = _block(text, "losses")
    assert "against LitData 250: **0.80×**" in losses and "against tar 1,000: **0.90×**" in losses
    assert "FFCV" not in losses
    assert page.all_rows(page.load(results))[-1].per_round == pytest.approx([2.2, 20 / 12, 24 / 11])
    machine = _block(text, "machine")
    assert "Some CPU, 2 logical cores (2 usable), 8.0 GB RAM, Linux 6.1;" in machine
    assert "python 3.11.7, torch 2.13.0+cpu" in machine and "LitData 0.2.76, FFCV not installed" in machine
    assert "load average 1.0–3.0 (median 2.0) over 3 samples" in machine
    assert "python benchmarks/page.py --run" in _block(text, "command")
    assert text.startswith("# Benchmarks\n\nHand-written prose") and text.endswith("More prose.\n")
    assert "stale text" not in text

    with Image.open(tmp_path / "chart.png") as img:
        assert img.format == "PNG" and img.size == page.chart_size(1)  # one read row with a baseline
        img.verify()

    # deterministic: a second run changes nothing, and --check agrees
    before = (text, (tmp_path / "chart.png").read_bytes())
    args = ["--results", str(results), "--page", str(tmp_path / "page.md"), "--chart", str(tmp_path / "chart.png")]
    assert page.main(args) == 0
    assert ((tmp_path / "page.md").read_text(), (tmp_path / "chart.png").read_bytes()) == before
    assert page.main([*args, "--check"]) == 0
    (tmp_path / "page.md").write_text(TEMPLATE)
    assert page.main([*args, "--check"]) == 1


def test_missing_markers_are_an_error(tmp_path: Path) -> None:
    results = tmp_path / "results"
    _small_results(results)
    with pytest.raises(ValueError, match="no markers"):
        page.fill("# no markers\n", page.blocks(page.load(results)))


def test_committed_page_matches_committed_results(tmp_path: Path) -> None:
    committed = ROOT / "BENCHMARKS.md"
    shutil.copy(committed, tmp_path / "BENCHMARKS.md")
    assert page.main(["--results", str(page.RESULTS), "--page", str(tmp_path / "BENCHMARKS.md"),
                      "--chart", str(tmp_path / "headline.png")]) == 0
    generated = (tmp_path / "BENCHMARKS.md").read_text()
    assert _block(generated, "headline") == _block(committed.read_text(), "headline")
    assert generated == committed.read_text(), "BENCHMARKS.md is stale: run python benchmarks/page.py"

    rows = page.all_rows(page.load(page.RESULTS))
    chartable = [r for r in rows if r.section.startswith("read") and r.baseline_stats]
    assert chartable, "the committed results hold no read rows"
    size = page.chart_size(len(chartable))
    for png in (tmp_path / "headline.png", page.RESULTS / page.CHART):
        data = png.read_bytes()
        with Image.open(io.BytesIO(data)) as img:
            assert img.format == "PNG" and img.size == size
            img.verify()
    assert sum(p.stat().st_size for p in page.RESULTS.iterdir()) < 1_500_000  # raw JSON stays small


def test_committed_results_hold_no_machine_paths() -> None:
    for path in sorted(page.RESULTS.glob("*.json")):
        text = path.read_text()
        assert not re.search(r"(?<![\w.])/(root|home|tmp|work|opt|usr|srv|mnt)/", text), path.name
        assert "traceback" not in json.loads(text) and '"traceback"' not in text, path.name
