"""Failures on purpose inside Ray tasks, so the tests can exercise Ray's retries and a resume.

``install`` runs in every Ray worker process at its start (Ray's ``worker_process_setup_hook``).
It wraps the tasks' node check, which every packing task runs first, and the writing of each
record. What they do is read from the marker file named by ``RAY_FAULT_MARKER``:

* ``TASK`` (or ``TASK once``): that task raises ``OSError`` (once: the marker is then removed, so
  the retry succeeds);
* ``TASK once kill``: that task's worker process kills itself (SIGKILL) after writing its third
  record, once: a lost worker, mid-task;
* ``slow SECONDS``: every task waits that long before packing (so a test can stop a pack midway);
* ``scan``: every listing task (``packer.ray_scan``) raises ``OSError`` before listing a class.

Every packing task also appends its number to the file named by ``RAY_TASK_LOG``, when set, and
every listing task ``scan CLASS`` for each class it lists: the tests count which tasks ran, and
where the scan ran. The library itself has no hook for any of this.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any

MARKER_ENV = "RAY_FAULT_MARKER"
TASK_LOG_ENV = "RAY_TASK_LOG"
KILL_AFTER = 3  # records a task writes before its worker is killed


def _task_of(folder: Path) -> int | None:
    match = re.fullmatch(r"task-(\d+)", Path(folder).name)
    return int(match.group(1)) if match else None


def _marker_words() -> list[str]:
    marker = os.environ.get(MARKER_ENV)
    if not marker or not os.path.exists(marker):
        return []
    try:
        return Path(marker).read_text().split()
    except FileNotFoundError:  # removed by another task just now
        return []


def _log_lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def logged_tasks(log: Path) -> list[int]:
    """The packing task numbers in the log, one per run of a task (retries included)."""
    return [int(line) for line in _log_lines(log) if line.strip().isdigit()]


def logged_scans(log: Path) -> list[str]:
    """The classes listed by Ray listing tasks, in the log, one per listing (retries included)."""
    return [line.split(" ", 1)[1] for line in _log_lines(log) if line.startswith("scan ")]


def install() -> None:
    """Wrap ``ray_tasks.check_shared``, ``ray_tasks.write_or_skip`` and the class listings of
    ``ray_scan`` in this worker process."""
    from packload.packer import ray_scan, ray_tasks

    real_check, real_write = ray_tasks.check_shared, ray_tasks.write_or_skip

    def check_then_fail(root: str, folder: Path, *args: Any) -> None:
        real_check(root, folder, *args)
        task = _task_of(folder)
        if task is None:
            return
        log = os.environ.get(TASK_LOG_ENV)
        if log:
            with open(log, "a") as f:
                f.write(f"{task}\n")
        words = _marker_words()
        if words[:1] == ["slow"]:
            time.sleep(float(words[1]))
        elif words and words[0].isdigit() and int(words[0]) == task and "kill" not in words:
            if "once" in words[1:]:
                os.unlink(os.environ[MARKER_ENV])
            raise OSError(f"injected failure in task {task}")

    def write_then_die(item: Any, pos: int, root: Path, writer: Any, *args: Any) -> int:
        written = real_write(item, pos, root, writer, *args)
        words = _marker_words()
        if ("kill" in words and int(words[0]) == _task_of(writer.folder)
                and writer.index.count >= KILL_AFTER):
            os.unlink(os.environ[MARKER_ENV])
            os.kill(os.getpid(), signal.SIGKILL)
        return written

    def logged_listing(real: Any) -> Any:
        def list_then_fail(root: str, name: str, *args: Any) -> Any:
            log = os.environ.get(TASK_LOG_ENV)
            if log:
                with open(log, "a") as f:
                    f.write(f"scan {name}\n")
            if _marker_words()[:1] == ["scan"]:
                raise OSError(f"injected failure listing {name}")
            return real(root, name, *args)
        return list_then_fail

    ray_tasks.check_shared = check_then_fail
    ray_tasks.write_or_skip = write_then_die
    ray_scan.list_class = logged_listing(ray_scan.list_class)
    ray_scan.list_class_url = logged_listing(ray_scan.list_class_url)
