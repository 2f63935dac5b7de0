"""Packing a folder (``packload.packer.pipeline``): the backend a destination asks for, the summary
and manifest of what was packed, skipped and left out, records in the source's order however many
workers encode them, nothing left behind but the pack, and the arguments refused."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from packload.core.errors import SkippedFileError, UsageError
from packload.core.scan import scan_folder
from packload.loaders.read import PackReader
from packload.packer.destination import partial_path
from packload.packer.encode import Encoded, EncodeOptions, Skipped
from packload.packer.encode_stream import encoded_stream
from packload.packer.pipeline import (
    backend_for,
    options_from_record,
    pack,
    write_or_skip,
)
from tests.image_factory import make_image_folder, write_broken_files


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pipeline") / "src"
    make_image_folder(root, classes=("cat", "dog"), per_class=5, seed=8)
    write_broken_files(root / "dog")
    (root / "cat" / "notes.txt").write_text("left out")
    return root


def _records(path: Path) -> list[tuple[str, int, bytes]]:
    with PackReader(path) as reader:
        return [(reader.path_of(i), int(reader.entries["label"][i]), bytes(reader.payload(i, verify=True)))
                for i in range(reader.records)]


def test_backend_for_the_destination() -> None:
    assert backend_for(Path("x.lmdb"), None) == "lmdb" and backend_for(Path("x.LMDB"), None) == "lmdb"
    assert backend_for(Path("x.shards"), None) == "shards" and backend_for(Path("x"), None) == "shards"
    assert backend_for(Path("x.bin"), "lmdb") == "lmdb"
    with pytest.raises(UsageError, match="unknown --format 'zip'"):
        backend_for(Path("x"), "zip")


@pytest.mark.parametrize("name", ["p.lmdb", "p.shards"])
def test_the_summary_and_manifest_say_what_was_packed(source: Path, tmp_path: Path, name: str) -> None:
    dst = tmp_path / name
    summary = pack(source, dst, workers=1, progress=False)
    assert (summary["destination"], summary["backend"]) == (str(dst), backend_for(dst, None))
    assert (summary["records"], summary["classes"], summary["skipped"], summary["ignored"]) == (10, 2, 5, 1)
    assert summary["resumed_at"] is None
    files = sorted(p for p in (source / "cat").iterdir()) + sorted(p for p in (source / "dog").iterdir())
    images = [p for p in files if p.name.startswith("img_")]
    assert summary["source_bytes"] == sum(p.stat().st_size for p in images)
    assert [p for p, _, _ in _records(dst)] == [str(p.relative_to(source)) for p in images]
    assert [data for _, _, data in _records(dst)] == [p.read_bytes() for p in images]
    with PackReader(dst) as reader:
        manifest = reader.manifest
    assert manifest["classes"] == ["cat", "dog"] and manifest["class_counts"] == {"cat": 5, "dog": 5}
    assert sorted(item["path"] for item in manifest["skipped"]) == sorted(
        f"dog/{n}" for n in ("bomb.png", "empty.jpg", "not_an_image.png", "truncated.jpg", "truncated.png"))
    assert manifest["ignored"] == [{"path": "cat/notes.txt", "reason": "not an image extension"}]
    assert sorted(p.name for p in tmp_path.iterdir()) == [name], "no partial output or lock left behind"
    assert not partial_path(dst).exists()


def test_records_keep_the_sources_order_whatever_the_workers(source: Path, tmp_path: Path) -> None:
    raw = EncodeOptions(encoding="raw", size=(16, 16))
    one = pack(source, tmp_path / "one.shards", workers=1, progress=False, options=raw)
    two = pack(source, tmp_path / "two.shards", workers=2, progress=False, options=raw)
    assert one["records"] == two["records"] == 10
    assert _records(tmp_path / "one.shards") == _records(tmp_path / "two.shards")
    scan = scan_folder(source)
    stream = list(encoded_stream(source, scan.samples, 3, raw, workers=2))
    assert [item.path for item in stream] == [s.path for s in scan.samples[3:]]
    images = [item for item in stream if "/img_" in item.path]
    assert len(images) == 7 and all(isinstance(i, Encoded) and len(i.payload) == 16 * 16 * 3 for i in images)
    assert all(isinstance(item, Skipped) for item in stream if "/img_" not in item.path)


def test_options_are_read_back_from_the_manifest(source: Path, tmp_path: Path) -> None:
    options = EncodeOptions(encoding="raw", size=(12, 20), check="full")
    pack(source, tmp_path / "p.shards", workers=1, progress=False, options=options)
    recorded = json.loads((tmp_path / "p.shards" / "manifest.json").read_text())["options"]
    assert options_from_record(recorded) == options
    assert options_from_record({"backend": "lmdb", **asdict(EncodeOptions())}) == EncodeOptions()


def test_arguments_are_refused_before_anything_is_written(source: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--workers 0"):
        pack(source, tmp_path / "p.shards", workers=0, progress=False)
    with pytest.raises(UsageError, match="--shard-size 1000"):
        pack(source, tmp_path / "p.shards", workers=1, shard_size=1000, progress=False)
    with pytest.raises(UsageError, match="inside the source"):
        pack(source, source / "p.shards", workers=1, progress=False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("root, shown", [("s3://bucket/images/", "s3://bucket/images/cat/bad.jpg"),
                                         ("/data/images", "/data/images/cat/bad.jpg")])
def test_strict_names_the_broken_file_where_it_is(root: str, shown: str) -> None:
    skipped: list[dict] = []
    with pytest.raises(SkippedFileError) as caught:
        write_or_skip(Skipped("cat/bad.jpg", "not an image"), 7, root, None, skipped, strict=True)  # type: ignore[arg-type]
    assert str(caught.value).startswith(f"{shown}: not an image;")
    assert write_or_skip(Skipped("cat/bad.jpg", "not an image"), 7, root, None, skipped, strict=False) == 0  # type: ignore[arg-type]
    assert skipped == [{"path": "cat/bad.jpg", "reason": "not an image", "pos": 7}]
