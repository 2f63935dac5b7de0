"""What a Ray run does with its other tasks after one has failed (``ray_tasks.settle_after_failure``):
tasks that have ended are left alone, the unfinished ones are asked to stop without force (a forced
cancel that crosses a task's reply ends the driver's process inside Ray), and the run waits for them;
then the repeated failing run that used to end the process outright, run in a child process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from packload.packer.ray_tasks import SETTLE_S, settle_after_failure

REPO = Path(__file__).resolve().parents[2]


class RecordingRay:
    """Just enough of ``ray`` to see what is cancelled and waited for; ``done`` refs have ended."""

    def __init__(self, done: set[str]) -> None:
        self.done, self.cancelled, self.waits = done, [], []

    def wait(self, refs: list[str], num_returns: int, timeout: float) -> tuple[list[str], list[str]]:
        self.waits.append((list(refs), num_returns, timeout))
        return [r for r in refs if r in self.done], [r for r in refs if r not in self.done]

    def cancel(self, ref: str, force: bool = False, **_: Any) -> None:
        self.cancelled.append((ref, force))


def test_only_unfinished_tasks_are_stopped_and_never_by_force() -> None:
    ray = RecordingRay(done={"a", "c"})
    settle_after_failure(ray, ["a", "b", "c", "d"], stop=True)
    assert ray.cancelled == [("b", False), ("d", False)]
    assert ray.waits[-1] == (["b", "d"], 2, SETTLE_S)


def test_listing_tasks_are_waited_for_not_cancelled() -> None:
    ray = RecordingRay(done={"a"})
    settle_after_failure(ray, ["a", "b"], stop=False)
    assert ray.cancelled == []
    assert ray.waits[-1] == (["b"], 1, SETTLE_S)


def test_nothing_left_to_settle_asks_ray_nothing() -> None:
    ray = RecordingRay(done={"a"})
    settle_after_failure(ray, [], stop=True)
    settle_after_failure(ray, ["a"], stop=True)
    assert ray.cancelled == [] and len(ray.waits) == 1  # the one look that found "a" done


REPEATED_FAILURES = """
import os, sys
from pathlib import Path
folder = Path(sys.argv[1])
os.environ["RAY_FAULT_MARKER"] = str(folder / "fault")
os.environ["PYTHONPATH"] = sys.argv[2]
import ray
from packload import PackloadError, pack_ray
from tests.image_factory import write_image
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
         runtime_env={"worker_process_setup_hook": "tests.ray_faults.install"})
src = folder / "images"
for k in range(12):
    write_image(src / f"c{k % 4}" / f"{k}.png", fmt="PNG", seed=k)
(folder / "fault").write_text("scan")
failed = 0
for i in range(int(sys.argv[3])):
    try:
        pack_ray(src, folder / f"out{i}.shards", task_files=4, progress=False, max_retries=1)
    except PackloadError:
        failed += 1
ray.shutdown()
print("failed", failed)
"""


def test_a_pack_whose_listing_keeps_failing_raises_every_time(tmp_path: Path) -> None:
    """Every round must end in the one-line error; the forced cancel this replaced ended the
    process (exit 1, no error) within a few rounds in most runs."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install -e \".[ray]\")")
    rounds = 12
    run = subprocess.run([sys.executable, "-c", REPEATED_FAILURES, str(tmp_path), str(REPO), str(rounds)],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split()[-2:] == ["failed", str(rounds)]
