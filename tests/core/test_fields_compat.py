"""Packs and packload versions from before fields: a pack without a table is byte for byte what the
packload before fields writes, and that packload reads a pack made from a table as it reads any pack
(its images and classes), ignoring the fields part, as docs/FORMAT.md (Fields, Older readers) says.

The packload before fields is this repository at the commit before ``packload/core/fields.py`` was
added (its sources, exported with ``git archive``), run in a subprocess."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest

from packload import PackedImageFolder, pack
from packload.core.format import LMDB_INDEX_KEY
from packload.packer.table_options import TableOptions
from tests.fields_source import make_source

REPO = Path(__file__).resolve().parents[2]
VOLATILE = {"id", "created", "packload_version"}


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def old_packload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sources of the packload before fields, exported into a folder."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: the packload before fields cannot be exported")
    added = _git("log", "--diff-filter=A", "--format=%H", "--", "packload/core/fields.py").split()
    base = f"{added[-1]}^" if added else "HEAD"
    folder = tmp_path_factory.mktemp("old-packload")
    try:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", base, "packload", "packer", "loaders"],
                                 check=True, capture_output=True).stdout
    except subprocess.CalledProcessError:
        pytest.skip(f"commit {base} is not in this clone (a shallow one?)")
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    assert not (folder / "packload" / "core" / "fields.py").exists()
    return folder


def _run_old(old: Path, code: str, *args: str) -> str:
    """``code`` run by the packload before fields (its folder first on the path), ``args`` in sys.argv."""
    result = subprocess.run([sys.executable, "-c", code, *args], cwd=old, capture_output=True, text=True,
                            env={"PYTHONPATH": str(old), "PATH": "/usr/bin:/bin"}, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


OLD_PACK = """
import sys, packload
assert packload.__file__.startswith(sys.argv[3]), packload.__file__
packload.pack(sys.argv[1], sys.argv[2], workers=1, progress=False)
"""

OLD_READ = """
import json, sys, packload
assert packload.__file__.startswith(sys.argv[2]), packload.__file__
ds = packload.PackedImageFolder(sys.argv[1], output="bytes")
report = packload.verify(sys.argv[1], progress=False)
print(json.dumps({"classes": ds.classes, "targets": ds.targets, "paths": [p for p, _ in ds.relative_samples],
                  "payloads": [ds[i][0].hex() for i in range(len(ds))], "ok": report["ok"],
                  "fields": hasattr(ds, "fields")}))
"""


@pytest.mark.parametrize("backend", ["shards", "lmdb"])
def test_packs_without_a_table_are_as_before(old_packload: Path, tmp_path: Path, backend: str) -> None:
    source = make_source(tmp_path)
    old, new = tmp_path / f"old.{backend}", tmp_path / f"new.{backend}"
    _run_old(old_packload, OLD_PACK, str(source.root), str(old), str(old_packload))
    pack(source.root, new, workers=1, progress=False)
    if backend == "shards":
        assert sorted(p.name for p in old.iterdir()) == sorted(p.name for p in new.iterdir())
        for part in old.iterdir():
            if part.name != "manifest.json":
                assert part.read_bytes() == (new / part.name).read_bytes(), part.name
        manifests = [json.loads((p / "manifest.json").read_bytes()) for p in (old, new)]
    else:
        values = []
        for path in (old, new):
            with lmdb.open(str(path), subdir=False, readonly=True, lock=False) as env, env.begin() as txn:
                values.append({bytes(k): bytes(v) for k, v in txn.cursor()})
        assert values[0].keys() == values[1].keys()
        assert all(values[0][key] == values[1][key] for key in values[0] if key != b"#manifest")
        assert values[0][LMDB_INDEX_KEY] == values[1][LMDB_INDEX_KEY]
        manifests = [json.loads(v[b"#manifest"]) for v in values]
    assert {k: v for k, v in manifests[0].items() if k not in VOLATILE} == \
        {k: v for k, v in manifests[1].items() if k not in VOLATILE}


@pytest.mark.parametrize("backend", ["shards", "lmdb"])
def test_the_packload_before_fields_reads_a_pack_with_fields(old_packload: Path, tmp_path: Path,
                                                             backend: str) -> None:
    source = make_source(tmp_path)
    dst = tmp_path / f"p.{backend}"
    pack(source.root, dst, labels=TableOptions(source.table, types={"age": "int", "attrs": "list[int]"}), workers=1,
         progress=False)
    seen = json.loads(_run_old(old_packload, OLD_READ, str(dst), str(old_packload)))
    ds = PackedImageFolder(dst, output="bytes")
    assert seen["classes"] == ds.classes and seen["targets"] == ds.targets  # the table's classes
    assert seen["paths"] == source.paths and seen["payloads"] == [ds[i][0].hex() for i in range(len(ds))]
    assert seen["ok"] and not seen["fields"]  # intact to it, and no fields: the part is ignored
