"""Reliability, many readers: DataLoader workers over one LMDB file and one shards folder for
several epochs, with persistent workers on and off, fork and spawn: every record each epoch with
the right pixels (checksums on), and no growth of file descriptors, pack maps or RSS between
epochs. CI runs 4 workers for 2-3 epochs; ``benchmarks/reliability.py`` runs 16 workers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.many_readers import load_check
from tests.reliability.packs import both_backends


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return both_backends(tmp_path_factory.mktemp("load"), per_class=16)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize(("backend", "start_method", "persistent", "workers"), [
    ("lmdb", "fork", False, 4), ("lmdb", "fork", True, 4), ("shards", "fork", False, 4), ("shards", "fork", True, 4),
    ("lmdb", "spawn", True, 2)])
def test_many_workers_many_epochs(packs: dict[str, Path], backend: str, start_method: str, persistent: bool,
                                  workers: int) -> None:
    result = load_check(packs[backend], workers=workers, epochs=3 if start_method == "fork" else 2,
                        persistent=persistent, start_method=start_method)
    assert result["problems"] == [], result
    epochs = result["per_epoch"]
    assert all(e["workers_seen"] == workers for e in epochs)
    assert all(e["worker_pack_maps_max"] >= 1 for e in epochs)  # the workers really had the pack open


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("backend", ["lmdb", "shards"])
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
@pytest.mark.parametrize("persistent", [False, True])
def test_sixteen_workers(packs: dict[str, Path], backend: str, start_method: str, persistent: bool) -> None:
    result = load_check(packs[backend], workers=16, epochs=3, persistent=persistent, start_method=start_method)
    assert result["problems"] == [], result
