"""Every writer builds its manifest with ``packload.core.manifest.build_manifest``: a fresh ``id`` per pack,
skipped and left-out lists capped with their full counts beside them, and those counts (not the
lengths of the capped lists) used by the summary, by ``verify`` and by ``merge``."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr
from pathlib import Path

import pytest

import packload.core.manifest as manifest_module
from packload import merge, pack
from packload.loaders.read import PackReader
from packload.loaders.verify import verify
from tests.image_factory import make_image_folder, write_broken_files, write_hidden_and_stray

BACKENDS = ["lmdb", "shards"]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six images, five broken files (skipped) and five files left out (hidden, stray, not images)."""
    root = tmp_path_factory.mktemp("manifest") / "src"
    make_image_folder(root, classes=("a", "b"), per_class=3, seed=9)
    write_broken_files(root / "b")
    write_hidden_and_stray(root)
    return root


def manifest_of(path: Path) -> dict:
    with PackReader(path) as reader:
        return dict(reader.manifest)


@pytest.mark.parametrize("backend", BACKENDS)
def test_long_lists_are_capped_and_counted(source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           backend: str) -> None:
    monkeypatch.setattr(manifest_module, "SKIPPED_LISTED", 2)
    monkeypatch.setattr(manifest_module, "IGNORED_LISTED", 3)
    summary = pack(source, tmp_path / f"p.{backend}", workers=1, progress=False)
    manifest = manifest_of(tmp_path / f"p.{backend}")
    assert len(manifest["skipped"]) == 2 and manifest["skipped_count"] == summary["skipped"] == 5
    assert len(manifest["ignored"]) == 3 and manifest["ignored_count"] == summary["ignored"]
    assert sum(manifest["ignored_by_reason"].values()) == manifest["ignored_count"] > 3
    assert manifest["source"]["files"] == manifest["records"] + 5
    assert verify(tmp_path / f"p.{backend}", progress=False)["ok"]  # counts, not list lengths, are checked


@pytest.mark.parametrize("out_backend", BACKENDS)
def test_merge_sums_the_counts_and_keeps_the_capped_lists(source: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch, out_backend: str) -> None:
    monkeypatch.setattr(manifest_module, "SKIPPED_LISTED", 2)
    other = tmp_path / "other"
    make_image_folder(other, classes=("b", "c"), per_class=2, seed=3)
    write_broken_files(other / "c")
    inputs = [tmp_path / "one.lmdb", tmp_path / "two.shards"]
    pack(source, inputs[0], workers=1, progress=False)
    pack(other, inputs[1], workers=1, progress=False)
    monkeypatch.setattr(manifest_module, "SKIPPED_LISTED", 3)
    out = tmp_path / f"m.{out_backend}"
    merge(out, inputs, progress=False)
    manifest, parts = manifest_of(out), [manifest_of(p) for p in inputs]
    assert manifest["skipped_count"] == 10 and len(manifest["skipped"]) == 3  # 2 + 2 listed, capped at 3
    assert [s["path"] for s in manifest["skipped"]] == [s["path"] for p in parts for s in p["skipped"]][:3]
    assert manifest["ignored_count"] == sum(p["ignored_count"] for p in parts)
    assert manifest["ignored_by_reason"] == {
        reason: sum(p["ignored_by_reason"].get(reason, 0) for p in parts)
        for reason in {r for p in parts for r in p["ignored_by_reason"]}}
    assert [m["records"] for m in manifest["merged_from"]] == [p["records"] for p in parts]
    assert len({manifest["id"], *(p["id"] for p in parts)}) == 3  # a fresh id for every pack written
    assert verify(out, progress=False)["ok"]


def test_every_pack_gets_its_own_id(source: Path, tmp_path: Path) -> None:
    dst = tmp_path / "p.shards"
    pack(source, dst, workers=1, progress=False)
    first = manifest_of(dst)["id"]
    pack(source, dst, workers=1, progress=False, overwrite=True)
    assert manifest_of(dst)["id"] != first
    assert json.loads((dst / "manifest.json").read_text())["id"] == manifest_of(dst)["id"]


def test_progress_bars_show_paths_safely(tmp_path: Path) -> None:
    """A folder name with control characters is shown escaped in the progress bar, never sent as is."""
    root = tmp_path / "bad\x1b]0;owned\x07name"
    make_image_folder(root, classes=("a",), per_class=2, seed=1)
    err = io.StringIO()
    with redirect_stderr(err):
        pack(root, tmp_path / "p.shards", workers=1, progress=True)
        merge(tmp_path / "m\x1b[2J.shards", [tmp_path / "p.shards"], progress=True)
        verify(tmp_path / "m\x1b[2J.shards", progress=True)
    shown = err.getvalue()
    assert "\\x1b]0;owned\\x07name" in shown and "m\\x1b[2J.shards" in shown
    assert "\x07" not in shown and "\x1b]0" not in shown and "\x1b[2J" not in shown
