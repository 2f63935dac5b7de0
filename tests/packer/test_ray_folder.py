"""The folder destination of ``pack --engine ray``: where tasks write, what a failed run leaves, the
refusal of an unfinished pack without --resume (no Ray needed: the driver's side alone)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from packload.core.errors import UsageError
from packload.core.format import RAY_RUN_NAME
from packload.packer.pack_destination import PackDestination
from packload.packer.ray_folder import LocalTarget, staging_path


@pytest.mark.parametrize("name, backend", [("out.shards", "shards"), ("out.lmdb", "lmdb")])
def test_tasks_write_under_the_unfinished_pack(tmp_path: Path, name: str, backend: str) -> None:
    dst = tmp_path / name
    target = LocalTarget(PackDestination(dst), backend)
    staging = dst.with_name(name + ".partial") if backend == "shards" else staging_path(dst)
    assert Path(target.task_out(3)).parent == staging.resolve()
    assert Path(target.task_out(3)) != Path(target.task_out(4))
    target.begin({"engine": "ray", "shard_size": 1 << 20})
    assert json.loads((staging / RAY_RUN_NAME).read_text())["engine"] == "ray"
    assert not dst.exists()  # nothing that looks like a pack yet


def test_an_unfinished_pack_is_refused_without_resume_and_discarded(tmp_path: Path) -> None:
    dst = tmp_path / "out.shards"
    target = LocalTarget(PackDestination(dst), "shards")
    target.begin({"engine": "ray"})
    with pytest.raises(UsageError, match="--resume to finish it"):
        target.previous({"engine": "ray"}, None, resume=False, overwrite=False, root=str(tmp_path))
    target.discard()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # the run's leftovers are gone, nothing else
