"""benchmarks/ddp_read.py under torchrun with 2 CPU processes (gloo): equal counts, full coverage, resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from packload import pack
from tests.image_factory import make_image_folder

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.ddp_read import check_epoch  # noqa: E402

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with the gloo backend is not available in this torch build")


@pytest.fixture(scope="module")
def small_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ddp")
    make_image_folder(root / "images", classes=("a", "b", "c"), per_class=15)  # 45 records: odd
    pack(root / "images", root / "p.shards", workers=1, progress=False)
    return root / "p.shards"


def launch(pack_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--standalone", str(REPO / "benchmarks" / "ddp_read.py"), str(pack_path),
                           "--batch-size", "4", "--num-workers", "1", *extra],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=180)


def torchrun(pack_path: Path, *extra: str) -> tuple[int, dict]:
    proc = launch(pack_path, *extra)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, proc.stdout + proc.stderr
    return proc.returncode, json.loads(lines[-1])


@pytest.mark.parametrize(("mode", "per_rank", "distinct"), [("--pad", 23, 45), ("--drop", 22, 44)])
def test_two_ranks_read_one_epoch_and_resume(small_pack: Path, mode: str, per_rank: int, distinct: int) -> None:
    code, summary = torchrun(small_pack, mode, "--resume-at", "9")
    assert code == 0, summary
    assert summary["ok"] and all(summary["checks"].values())
    assert summary["world_size"] == 2 and summary["per_rank"] == [per_rank, per_rank]
    assert summary["distinct"] == distinct and summary["seen_total"] == 2 * per_rank
    assert summary["resume"] == {"at": 9, "before": 9, "after": per_rank - 9}
    assert "resume_completes_the_epoch" in summary["checks"]


def test_checks_catch_a_wrong_split() -> None:
    order = list(range(9))
    assert all(check_epoch([[0, 1, 2, 3, 4], [5, 6, 7, 8, 0]], 9, "pad", order).values())
    overlap = check_epoch([[0, 1, 2, 3, 4], [4, 5, 6, 7, 8]], 9, "pad", order)  # 4 twice, padding is 0
    assert not overlap["only_padding_repeated"] and overlap["every_record_seen"]
    missing = check_epoch([[0, 1, 2, 3, 4], [5, 6, 7, 0, 1]], 9, "pad", order)
    assert not missing["every_record_seen"]
    uneven = check_epoch([[0, 1, 2, 3], [4, 5, 6, 7, 8]], 9, "pad", order)
    assert not uneven["same_count_per_rank"]
    assert all(check_epoch([[0, 1, 2, 3], [4, 5, 6, 7]], 9, "drop", order).values())
    wrong_drop = check_epoch([[0, 1, 2, 3], [4, 5, 6, 8]], 9, "drop", order)
    assert not wrong_drop["only_tail_dropped"]


def test_a_missing_pack_is_one_line_per_rank(tmp_path: Path) -> None:
    proc = launch(tmp_path / "missing.shards")
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ddp_read: error:")]
    # Every rank fails on its own; torchrun stops the other rank as soon as one has failed, so the
    # other's line may or may not get out before it is stopped.
    assert 1 <= len(errors) <= 2 and all("missing.shards: no such pack" in line for line in errors)
