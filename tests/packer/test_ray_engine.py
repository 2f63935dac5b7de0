"""``pack --engine ray``: the same pack as a single-machine pack, record by record; retries; failures."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from packload import EncodeOptions, PackloadError, SkippedFileError, pack, pack_ray
from packload.cli import main
from packload.loaders.read import PackReader
from packload.loaders.verify import verify
from packload.packer.ray_engine import split_ranges
from tests.image_factory import make_image_folder, write_broken_files, write_hidden_and_stray
from tests.ray_local import LocalRay, local_ray  # noqa: F401 - a fixture


@pytest.fixture(scope="module")
def ray_instance(local_ray: LocalRay) -> Path:  # noqa: F811 - the fixture imported above
    """The shared local Ray instance's fault marker file."""
    return local_ray.marker


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three classes of JPEGs and PNGs, broken files to skip, hidden and stray files to ignore."""
    root = tmp_path_factory.mktemp("ray-src") / "images"
    make_image_folder(root, classes=("ant", "bee", "cow"), per_class=14)
    write_broken_files(root / "bee")
    write_hidden_and_stray(root)
    return root


def records_of(path: Path) -> list[tuple]:
    """Every record as (path, label, payload, width, height, format, mode, orientation, crc)."""
    with PackReader(path) as reader:
        e = reader.entries
        return [(reader.path_of(i), int(e["label"][i]), bytes(reader.payload(i, verify=True)), int(e["width"][i]),
                 int(e["height"][i]), int(e["format"][i]), bytes(e["mode"][i]), int(e["orientation"][i]),
                 int(e["payload_crc32"][i])) for i in range(reader.records)]


def manifest_of(path: Path) -> dict:
    with PackReader(path) as reader:
        manifest = dict(reader.manifest)
    for key in ("created", "parts", "index", "id"):  # id: new for every pack written
        manifest.pop(key)
    return manifest


def test_split_ranges_cover_the_list_in_order() -> None:
    assert split_ranges(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert split_ranges(3, 5) == [(0, 3)]


@pytest.mark.parametrize("dest", ["out.shards", "out.lmdb"])
def test_ray_pack_reads_like_a_local_pack(ray_instance: Path, source: Path, tmp_path: Path, dest: str) -> None:
    local, remote = tmp_path / "local" / dest, tmp_path / "ray" / dest
    local.parent.mkdir()
    remote.parent.mkdir()
    local_result = pack(source, local, workers=1, progress=False, shard_size=1 << 16)
    result = pack_ray(source, remote, task_files=5, progress=False, shard_size=1 << 16)
    assert result["ray"]["tasks"] == 10 and result["engine"] == "ray"  # 47 image files in ranges of 5
    assert result["ray"]["scan_tasks"] == 3  # the classes were listed in Ray tasks, one each
    assert set(result) == set(local_result) and local_result["engine"] == "local"  # one shape, both engines
    expected = records_of(local)
    assert len(expected) == 42 and result["records"] == 42  # 5 broken files skipped
    assert records_of(remote) == expected
    assert manifest_of(remote) == manifest_of(local)  # same skipped list, ignored list, counts, options
    assert verify(remote, progress=False)["ok"]
    assert os.listdir(remote.parent) == [dest]  # no .partial, no task folders, no LMDB lock file
    if dest.endswith(".shards"):
        names = sorted(p.name for p in remote.iterdir())
        assert names == ["index.bin", "manifest.json"] + [f"shard-{k:05d}.bin" for k in range(len(names) - 2)]
    else:  # same records, same chunking: the index is the single-machine one, byte for byte
        with PackReader(local) as a, PackReader(remote) as b:
            assert a.index_bytes() == b.index_bytes()


def test_failed_task_is_retried(ray_instance: Path, source: Path, tmp_path: Path) -> None:
    ray_instance.write_text("2 once")  # task 2 fails on its first attempt only
    result = pack_ray(source, tmp_path / "out.shards", task_files=5, progress=False)
    assert not ray_instance.exists()  # the failure happened
    assert result["records"] == 42
    assert verify(tmp_path / "out.shards", progress=False)["ok"]


def test_persistent_failure_publishes_nothing(ray_instance: Path, source: Path, tmp_path: Path) -> None:
    ray_instance.write_text("3")
    try:
        with pytest.raises(PackloadError, match=r"Ray task 3 \(files 15\.\.19, .*failed after 1 retry .*injected"):
            pack_ray(source, tmp_path / "out.shards", task_files=5, progress=False, max_retries=1)
    finally:
        ray_instance.unlink()
    assert sorted(os.listdir(tmp_path)) == []  # neither out.shards nor out.shards.partial


def test_strict_stops_at_a_broken_file(ray_instance: Path, source: Path, tmp_path: Path) -> None:
    with pytest.raises(SkippedFileError, match="bee/"):
        pack_ray(source, tmp_path / "out.lmdb", task_files=5, strict=True, progress=False)
    assert sorted(os.listdir(tmp_path)) == []


def test_cli_engine_ray_reencodes_like_local(ray_instance: Path, source: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    args = [str(source), "--encoding", "raw", "--size", "16x16", "--json"]
    assert main(["pack", args[0], str(tmp_path / "ray.shards"), *args[1:], "--engine", "ray", "--task-files", "8"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["ray"]["tasks"] == 6 and summary["records"] == 42
    assert summary["ray"]["scan_tasks"] == 3 and summary["ray"]["scan_s"] >= 0  # the classes listed in tasks
    pack(source, tmp_path / "local.shards", options=EncodeOptions(encoding="raw", size=(16, 16)), progress=False)
    assert records_of(tmp_path / "ray.shards") == records_of(tmp_path / "local.shards")


def test_cli_refuses_workers_with_ray(source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pack", str(source), str(tmp_path / "o"), "--engine", "ray", "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--workers does not apply to --engine ray" in err


def test_without_ray_says_how_to_install(source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now fails, as when it is not installed
    assert main(["pack", str(source), str(tmp_path / "o"), "--engine", "ray"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and 'pip install "packload[ray]"' in err
    assert not (tmp_path / "o").exists()


def test_labels_follow_the_classes(ray_instance: Path, source: Path, tmp_path: Path) -> None:
    pack_ray(source, tmp_path / "o.shards", task_files=4, progress=False)
    with PackReader(tmp_path / "o.shards") as reader:
        labels = reader.labels()
        names = [reader.path_of(i).split("/")[0] for i in range(reader.records)]
        assert [reader.classes[label] for label in labels] == names
        assert np.all(np.diff(labels) >= 0)


def test_first_range_all_skipped(ray_instance: Path, tmp_path: Path) -> None:
    """When the first task packs nothing, the next one's shards keep their numbers but still get hashed."""
    root = tmp_path / "images"
    make_image_folder(root, classes=("b", "c"), per_class=4)
    broken = write_broken_files(root / "a")  # class "a" sorts first: the first range is all broken files
    pack_ray(root, tmp_path / "ray.shards", task_files=len(broken), progress=False)
    pack(root, tmp_path / "local.shards", workers=1, progress=False)
    assert records_of(tmp_path / "ray.shards") == records_of(tmp_path / "local.shards")
    assert manifest_of(tmp_path / "ray.shards") == manifest_of(tmp_path / "local.shards")
    assert verify(tmp_path / "ray.shards", progress=False)["ok"]
