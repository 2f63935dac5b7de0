"""``packer.ray_task_folder``: a finished task's folder (a small shards pack, packed here) read back as
the ``ShardSource`` that placing and joining start from: the manifest's parts, the index's entries and
paths, pointing into the shards where they lie, which reading leaves untouched; a damaged index is
refused naming its file. (Placing and joining task folders are tested with the Ray engine.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from packload import pack
from packload.core.errors import PackFormatError
from packload.core.format import INDEX_NAME, MANIFEST_NAME
from packload.packer.ray_task_folder import task_source
from tests.image_factory import make_image_folder


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the images, a task folder of them in more than one shard)."""
    root = tmp_path_factory.mktemp("task")
    make_image_folder(root / "src", classes=("a", "b", "c"), per_class=12, seed=3)
    pack(root / "src", root / "task-00003", backend="shards", workers=1, progress=False, shard_size=1 << 16)
    return root / "src", root / "task-00003"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def test_the_folder_read_back(task: tuple[Path, Path]) -> None:
    src, folder = task
    before = snapshot(folder)
    manifest = json.loads((folder / MANIFEST_NAME).read_bytes())
    source = task_source(folder)
    assert source.folder == folder and source.label_map is None
    assert source.parts == manifest["parts"] and len(source.parts) >= 2
    assert len(source.entries) == sum(part["records"] for part in source.parts) == manifest["records"] == 36
    files = sorted(path.relative_to(src).as_posix() for path in src.rglob("*") if path.is_file())
    paths = [source.paths[int(e["path_offset"]) : int(e["path_offset"]) + int(e["path_len"])].decode()
             for e in source.entries]
    assert paths == files
    assert source.mapped_labels().tolist() == [manifest["classes"].index(p.split("/")[0]) for p in paths]
    # each entry points at its image's own bytes in the shard its part names
    shards = {k: (folder / part["name"]).read_bytes() for k, part in enumerate(source.parts)}
    for entry, path in zip(source.entries, paths, strict=True):
        start = int(entry["payload_offset"])
        assert shards[int(entry["part"])][start : start + int(entry["payload_len"])] == (src / path).read_bytes()
    assert np.unique(source.entries["part"]).tolist() == list(range(len(source.parts)))
    assert snapshot(folder) == before  # read only: the shards stay where they are, as they are


def test_a_damaged_index_names_its_file(task: tuple[Path, Path], tmp_path: Path) -> None:
    _, folder = task
    copy = tmp_path / folder.name
    copy.mkdir()
    for name, data in snapshot(folder).items():
        (copy / name).write_bytes(data)
    index = copy / INDEX_NAME
    index.write_bytes(index.read_bytes()[:-1])
    with pytest.raises(PackFormatError) as caught:
        task_source(copy)
    text = str(caught.value)
    assert text.startswith(f"{index}: index claims 36 records") and text.endswith("the pack is damaged")
    assert "\n" not in text
