"""Reliability, kills: ``pack`` SIGKILLed at chosen points leaves nothing that looks complete,
every reader refuses the partial output, and ``--resume`` gives the uninterrupted pack record by
record; a DataLoader worker killed mid-epoch is named, and the sampler resumes the same order.
The full counts run from ``benchmarks/reliability.py`` with the same functions."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.kills import kill_and_resume, kill_points, worker_kill_resume
from tests.reliability.packs import make_source, pack_both


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_source(tmp_path_factory.mktemp("src"), per_class=12)


@pytest.fixture(scope="module")
def reference(source: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return pack_both(source, tmp_path_factory.mktemp("ref"), stem="ref")


def test_kill_points_cover_the_run_and_every_phase() -> None:
    points = kill_points(100, 24, "shards")
    numbers = [p for p in points if isinstance(p, int)]
    assert len(points) == 24 and numbers == sorted(numbers) and numbers[0] < 10 and numbers[-1] > 90
    assert "before manifest.json" in points and "before publish" in points
    assert kill_points(100, 2, "lmdb") == ["before lmdb finish", "before publish"]


@pytest.mark.parametrize(("backend", "point"), [("lmdb", 20), ("lmdb", "before publish"), ("shards", 20),
                                                ("shards", "before manifest.json"), ("shards", "after manifest.json")])
def test_kill_then_resume(source: Path, reference: dict[str, Path], tmp_path: Path, backend: str,
                          point: int | str) -> None:
    result = kill_and_resume(source, tmp_path / f"out.{backend}", reference[backend], point)
    assert result["killed"] and result["identical"], result
    assert result["problems"] == []
    assert all("--resume" in message for message in result["messages"].values()), result["messages"]
    if point == "before manifest.json":
        assert result["resumed_at"], "the records already on disk were kept"


@pytest.mark.parametrize("backend", ["lmdb", "shards"])
def test_worker_killed_mid_epoch(reference: dict[str, Path], backend: str) -> None:
    result = worker_kill_resume(reference[backend], workers=2, batch_size=4, kill_after=3, start_method="fork")
    assert result["problems"] == [], result
    assert str(result["victim"]) in result["error"]
    assert result["delivered"] == result["expected"]
