"""The Ray engine's tasks with a URL destination, called directly (no Ray): a task stages its
folder on the store with its marker last, a marker is trusted only with its files, and placement
gives the shards a local placement gives (the first range by the store's own copy)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[dev]')")
pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")

from packload.core.format import INDEX_NAME, TASK_DONE_NAME, shard_name  # noqa: E402
from packload.core.remote import RemoteStore  # noqa: E402
from packload.core.scan import scan_folder  # noqa: E402
from packload.packer.encode import EncodeOptions  # noqa: E402
from packload.packer.ray_tasks import pack_range, place_task  # noqa: E402
from packload.packer.ray_url_tasks import done_result_remote, place_task_remote, placed_result_remote  # noqa: E402
from tests.image_factory import make_image_folder, write_broken_files  # noqa: E402
from tests.object_store import ObjectStore  # noqa: E402

BUCKET = "rtasks"
SHARD = 1 << 16


@pytest.fixture(scope="module")
def store() -> ObjectStore:
    with ObjectStore() as s:
        s.make_bucket(BUCKET)
        yield s


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rtasks") / "images"
    make_image_folder(root, classes=("a", "b"), per_class=30)
    write_broken_files(root / "b")
    return root


def _pack(source: Path, out: str, hashed: bool, store: ObjectStore, task: int = 1) -> dict:
    scan = scan_folder(source)
    return pack_range(task, str(source), scan.samples[4:50], 4, scan.classes, EncodeOptions(), out, SHARD, False,
                      hashed, store.options)


def test_a_task_stages_its_folder_and_its_marker_last(store: ObjectStore, source: Path) -> None:
    url = f"s3://{BUCKET}/a.shards.partial/task-00001"
    staged = RemoteStore(url, store.options)
    staged.write_bytes("shard-00099.bin", b"left by a failed attempt")
    result = _pack(source, url, True, store)
    listing = staged.listing()
    assert "shard-00099.bin" not in listing and len(result["parts"]) > 1 and result["skipped"]
    assert sorted(listing) == sorted([p["name"] for p in result["parts"]] + [INDEX_NAME, "manifest.json",
                                                                           TASK_DONE_NAME])
    puts = [path for method, path, _ in store.proxy.requests if method == "PUT" and "/task-00001/" in path]
    assert puts[-1].split("?")[0].endswith(TASK_DONE_NAME)  # uploaded last
    kept = done_result_remote(staged, 1, (4, 50))
    assert kept is not None and kept["records"] == result["records"] and kept["parts"] == result["parts"]
    assert done_result_remote(staged, 2, (4, 50)) is None  # another task's range
    staged.write_bytes(INDEX_NAME, staged.read_object(INDEX_NAME)[:-1] + b"\0")  # same size, other bytes
    assert done_result_remote(staged, 1, (4, 50)) is None
    staged.remove([result["parts"][0]["name"]])
    assert done_result_remote(staged, 1, (4, 50)) is None
    assert done_result_remote(RemoteStore(f"s3://{BUCKET}/none/task-00001", store.options), 1, (4, 50)) is None


@pytest.mark.parametrize(("part_base", "record_base"), [(0, 0), (3, 100)])
def test_placement_gives_the_local_placements_shards(store: ObjectStore, source: Path, tmp_path: Path,
                                                      part_base: int, record_base: int) -> None:
    hashed = part_base == 0  # as the engine packs them: only the first range is hashed at once
    name = f"p{part_base}"
    staged_url, out_url = f"s3://{BUCKET}/{name}.shards.partial/task-00000", f"s3://{BUCKET}/{name}.shards"
    _pack(source, staged_url, hashed, store, task=0)
    local_task = tmp_path / "task-00000"
    _pack(source, str(local_task), hashed, store, task=0)
    local_out = tmp_path / "out"
    local_out.mkdir()
    expected = place_task(str(shutil.copytree(local_task, tmp_path / "copy")), str(local_out), part_base, record_base)
    before = len(store.proxy.requests)
    placed = place_task_remote(staged_url, out_url, part_base, record_base, store.options)
    shard_gets = [path for method, path, _ in store.proxy.requests[before:]
                  if method == "GET" and "/task-00000/shard-" in path]
    assert (shard_gets == []) == hashed  # the first range: copied by the store, never fetched
    assert placed["parts"] == expected["parts"]
    out = RemoteStore(out_url, store.options)
    for part in placed["parts"]:
        assert out.read_object(part["name"]) == (local_out / part["name"]).read_bytes()
    assert [p["name"] for p in placed["parts"]][0] == shard_name(part_base)
    staged = RemoteStore(staged_url, store.options)
    assert placed_result_remote(staged, out.listing(), part_base, record_base) == placed
    assert placed_result_remote(staged, out.listing(), part_base + 1, record_base) is None
    out.remove([placed["parts"][-1]["name"]])
    assert placed_result_remote(staged, out.listing(), part_base, record_base) is None
