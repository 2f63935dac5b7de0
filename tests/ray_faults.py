"""Failures on purpose inside Ray tasks, so the tests can exercise Ray's retries.

``install`` runs in every Ray worker process at its start (Ray's ``worker_process_setup_hook``).
It wraps the tasks' node check, which every packing task runs first: when the marker file named
by ``RAY_FAULT_MARKER`` says ``TASK`` (or ``TASK once``), that task raises ``OSError`` (once: the
marker is then removed, so the retry succeeds). The library itself has no hook for this.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

MARKER_ENV = "RAY_FAULT_MARKER"


def install() -> None:
    """Wrap ``ray_tasks.check_shared`` in this worker process."""
    from packload.packer import ray_tasks

    real = ray_tasks.check_shared

    def check_then_fail(root: str, folder: Path, *args: Any) -> None:
        real(root, folder, *args)
        marker = os.environ.get(MARKER_ENV)
        match = re.fullmatch(r"task-(\d+)", Path(folder).name)
        if not marker or not match or not os.path.exists(marker):
            return
        words = Path(marker).read_text().split()
        if words and int(words[0]) == int(match.group(1)):
            if "once" in words[1:]:
                os.unlink(marker)
            raise OSError(f"injected failure in task {int(match.group(1))}")

    ray_tasks.check_shared = check_then_fail
