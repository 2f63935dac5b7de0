"""benchmarks/bench_gil.py: its quick mode runs on a tiny JPEG pack and reports every case (the
figures themselves are not checked: they depend on the machine)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import bench_gil  # noqa: E402
from packload import EncodeOptions, pack  # noqa: E402
from tests.image_factory import make_image_folder  # noqa: E402


@pytest.fixture(scope="module")
def jpeg_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gil")
    make_image_folder(root / "images", classes=("a", "b"), per_class=8, seed=3)
    pack(root / "images", root / "p.shards", options=EncodeOptions(encoding="jpeg"), workers=1, progress=False)
    return root / "p.shards"


def test_quick_mode_reports_every_contender_fraction_and_switch_interval(jpeg_pack: Path, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "gil.json"
    assert bench_gil.main([str(jpeg_pack), "--quick", "--batch-size", "4", "--crop", "24", "--workers", "2",
                           "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["fractions"] == [0.0, 0.5] and result["switch_ms"] == [5.0, 0.5]
    assert result["workers"] == 2 and result["step_ms"] > 0 and result["alone"]["images_per_s"] > 0
    cases = {(row["contender"], row["switch_ms"], row["fraction"]) for row in result["rows"]}
    assert cases == {("packloader", 5.0, 0.0), ("packloader", 5.0, 0.5), ("packloader", 0.5, 0.0),
                     ("packloader", 0.5, 0.5), ("batch_loader", 5.0, 0.0), ("batch_loader", 5.0, 0.5)}
    for row in result["rows"]:
        assert row["images_per_s"] > 0 and len(row["images_per_s_runs"]) == 1
        assert 0 <= row["gil_held"] <= 1
        if row["fraction"] == 0.0:
            assert row["vs_fraction_0"] == 1.0 and row["gil_held"] == 0.0
        else:
            assert row["gil_held"] > 0, "the step held the GIL"
    text = capsys.readouterr().out
    assert "| PackLoader (threads) | 5 ms |" in text and "| PackLoader (threads) | 0.5 ms |" in text
    assert "| batch_loader (processes) | 5 ms |" in text and "f = 50%" in text


def test_step_holds_the_gil_for_its_fraction() -> None:
    """The step is calibrated into slices of held work for its fraction, and runs them (no timing is
    asserted: the machine may be busy)."""
    for hold in ("gil", "gil-ops", "cpu"):
        step = bench_gil.Step(0.02, 0.5, hold, slice_us=100)
        assert step.slices >= 1 and step() > 0, hold
    idle = bench_gil.Step(0.01, 0.0)
    assert idle.slices == 0 and idle() >= 0
    with pytest.raises(ValueError):
        bench_gil.Step(0.01, 1.5)
