"""The local Ray instance the Ray engine's tests share: 2 CPUs, workers that import this checkout and
install the fault injector of ``tests/ray_faults.py``, and the task log it writes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.ray_faults import MARKER_ENV, TASK_LOG_ENV

REPO = Path(__file__).resolve().parents[1]
HOOK = {"worker_process_setup_hook": "tests.ray_faults.install"}


@dataclass
class LocalRay:
    """The running instance: the fault marker file, the task log and the address other drivers use."""

    marker: Path
    log: Path
    address: str


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRay]:
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e \".[ray]\")")
    folder = tmp_path_factory.mktemp("fault")
    saved = {key: os.environ.get(key) for key in (MARKER_ENV, TASK_LOG_ENV, "PYTHONPATH")}
    os.environ[MARKER_ENV] = str(folder / "fault")
    os.environ[TASK_LOG_ENV] = str(folder / "tasks.log")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), saved["PYTHONPATH"]]))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env=HOOK)
    try:
        yield LocalRay(folder / "fault", folder / "tasks.log", ray.get_runtime_context().gcs_address)
    finally:
        ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
