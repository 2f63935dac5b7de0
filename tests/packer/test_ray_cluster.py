"""``pack --engine ray --ray-address`` on a real two-node Ray cluster (two ``ray start`` nodes on this
machine): the tasks run on both nodes, the summary counts them per node, and the pack equals a
single-machine pack record by record."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packload import EncodeOptions, pack
from packload.loaders.verify import verify
from tests.image_factory import write_broken_files
from tests.packer.test_ray_engine import manifest_of, records_of
from tests.ray_cluster import TwoNodeCluster

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("ray", reason="Ray is not installed (pip install -e \".[ray]\")")
    if shutil.which("ray", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("the `ray` command is not beside this Python")
    nodes = TwoNodeCluster(tmp_path_factory.mktemp("cluster"))
    try:
        try:
            nodes.start()
        except RuntimeError as exc:
            pytest.skip(str(exc))
        yield nodes
    finally:
        nodes.stop()


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Noise JPEGs large enough that re-encoding a range takes a while (a task that takes no time is
    all run by the first worker Ray leases), and broken files to skip."""
    root = tmp_path_factory.mktemp("cluster-src") / "images"
    rng = np.random.default_rng(0)
    for label in ("ant", "bee", "cow"):
        (root / label).mkdir(parents=True)
        for i in range(12):
            pixels = rng.integers(0, 256, (384, 384, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / label / f"{i:02d}.jpg", quality=95)
    write_broken_files(root / "bee")
    return root


@pytest.mark.parametrize("dest", ["out.shards", "out.lmdb"])
def test_pack_on_two_nodes_equals_a_local_pack(cluster: TwoNodeCluster, source: Path, tmp_path: Path,
                                               dest: str) -> None:
    remote, local = tmp_path / "ray" / dest, tmp_path / "local" / dest
    remote.parent.mkdir()
    local.parent.mkdir()
    run = subprocess.run([sys.executable, "-m", "packload", "pack", str(source), str(remote), "--engine", "ray",
                          "--ray-address", cluster.address, "--task-files", "3", "--shard-size", "256K",
                          "--encoding", "png", "--json"],
                         cwd=REPO, env=cluster.env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads(run.stdout)
    per_node = summary["ray"]["tasks_per_node"]
    assert summary["ray"]["cluster_cpus"] == 2 and summary["ray"]["tasks"] == 14  # 41 files, 3 per task
    assert len(per_node) == 2 and sum(per_node.values()) == 14  # both nodes packed
    assert summary["ray"]["scan_tasks"] == 3 == sum(summary["ray"]["scan_tasks_per_node"].values())  # listed there
    pack(source, local, workers=2, progress=False, shard_size=256 << 10, options=EncodeOptions(encoding="png"))
    assert records_of(remote) == records_of(local)
    assert manifest_of(remote) == manifest_of(local)
    assert verify(remote, progress=False)["ok"]
