"""Every writer builds its manifest with ``packload.core.manifest.build_manifest``: a fresh ``id`` per pack,
skipped and left-out lists capped with their full counts beside them, and those counts (not the
lengths of the capped lists) used by the summary, by ``verify`` and by ``merge``.

In Python a manifest is a ``Manifest`` wherever it comes from (built, read, copied, pickled), a dict
with a typed property per field that gives the documented default for an older pack's missing
fields; and no library module outside ``packload/core/manifest.py`` spells a manifest key."""

from __future__ import annotations

import ast
import copy
import hashlib
import io
import json
import pickle
import re
from contextlib import redirect_stderr
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import packload.core.manifest as manifest_module
from packload import merge, pack
from packload.core.errors import PackFormatError
from packload.core.format import FORMAT_NAME, FORMAT_VERSION, INDEX_NAME, LMDB_INDEX_KEY
from packload.core.manifest import (
    MANIFEST_REQUIRED,
    Manifest,
    build_manifest,
    decode_manifest,
    encode_manifest,
    index_entry,
    is_packload_manifest,
)
from packload.core.version import __version__
from packload.loaders.read import PackReader
from packload.loaders.verify import info, verify
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


# -- the Manifest: typed accessors over the JSON object ---------------------------------------------
ROOT = Path(__file__).resolve().parents[2]


def pil_folder(root: Path) -> Path:
    """Five small PNGs written with PIL in two class folders, a broken file (skipped) and a text file
    (left out)."""
    rng = np.random.default_rng(5)
    for name, count in (("cat", 2), ("dog", 3)):
        (root / name).mkdir(parents=True)
        for k in range(count):
            Image.fromarray(rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)).save(root / name / f"{k}.png")
    (root / "dog" / "broken.jpg").write_bytes(b"not a JPEG at all")
    (root / "dog" / "notes.txt").write_text("not an image")
    return root


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_accessors_read_a_real_pack(tmp_path: Path, backend: str) -> None:
    src = pil_folder(tmp_path / "src")
    dst = tmp_path / f"p.{backend}"
    summary = pack(src, dst, workers=1, progress=False)
    with PackReader(dst) as reader:
        m, index = reader.manifest, reader.index_bytes()
        assert type(m) is Manifest
        assert (m.format, m.version, m.backend, m.encoding) == (FORMAT_NAME, FORMAT_VERSION, backend, "keep")
        assert m.records == reader.records == summary["records"] == 5
        assert m.classes == ["cat", "dog"] and m.class_counts == {"cat": 2, "dog": 3} and m.labelled is True
        assert m.payload_bytes == int(reader.entries["payload_len"].sum()) == \
            sum(p.stat().st_size for p in src.rglob("*.png"))
        assert [s["path"] for s in m.skipped] == ["dog/broken.jpg"] and m.skipped_count == summary["skipped"] == 1
        assert [i["path"] for i in m.ignored] == ["dog/notes.txt"] and m.ignored_count == summary["ignored"] == 1
        assert list(m.ignored_by_reason.values()) == [1]
        assert m.source == {"name": "src", "files": 6, "bytes": m.source["bytes"]} and m.source["bytes"] > 0
        assert m.options["backend"] == backend and m.options["encoding"] == "keep"
        assert m.index == index_entry(INDEX_NAME if backend == "shards" else LMDB_INDEX_KEY.decode(), index)
        assert m.index["sha256"] == hashlib.sha256(index).hexdigest() and m.index["size"] == len(index)
        assert len(m.id or "") == 32 and reader.identity == m.id
        assert (m.created or "").endswith("+00:00") and m.packload_version == __version__
        assert m.fields == {} and m.merged_from == []
        if backend == "shards":
            assert m.parts is m.shards and [p["name"] for p in m.shards] == reader.part_names
            assert all((dst / p["name"]).stat().st_size == p["size"] for p in m.shards)
            assert sum(p["records"] for p in m.shards) == 5 and m.chunks is None and m.chunk_size is None
        else:
            assert m.shards == [] and m.chunks == int(reader.entries["part"].max()) + 1 and m.chunk_size == 1 << 20
        # Each property is the field the dict holds (what JSON, and user code's manifest["..."], still see).
        assert {key: getattr(m, key) for key in m} == dict(m)
    assert decode_manifest(encode_manifest(m), "m.json") == m
    if backend == "shards":  # encoded as the dict it is: the bytes the writer wrote
        assert encode_manifest(m) == (dst / "manifest.json").read_bytes()


def older_manifest(**fields: object) -> dict:
    """A manifest with the required fields alone, as an early writer wrote it (plus ``fields``)."""
    return {"format": FORMAT_NAME, "version": FORMAT_VERSION, "backend": "shards", "encoding": "keep",
            "records": 3, "classes": ["a", "b"], "skipped": [{"path": "a/x.jpg", "reason": "truncated"}], **fields}


def test_an_older_manifest_gets_the_documented_defaults() -> None:
    m = decode_manifest(encode_manifest(older_manifest()), "m.json")
    assert type(m) is Manifest
    assert m.skipped_count == 1 and m.ignored == [] and m.ignored_count == 0 and m.ignored_by_reason == {}
    assert m.labelled is True and m.class_counts is None and m.payload_bytes is None
    assert m.source == {} and m.options == {} and m.index == {} and m.fields == {} and m.merged_from == []
    assert m.parts is None and m.shards == [] and m.chunks is None and m.chunk_size is None
    assert m.id is None and m.created is None and m.packload_version is None
    ignored = [{"path": "b/.x", "reason": "hidden"}, {"path": "c.txt", "reason": "outside"},
               {"path": "d.txt", "reason": "outside"}]
    m = decode_manifest(encode_manifest(older_manifest(classes=[], ignored=ignored)), "m.json")
    assert m.labelled is False  # no classes, no field: unlabelled, as a reader checks its labels
    assert m.ignored_count == 3 and m.ignored_by_reason == {"hidden": 1, "outside": 2}
    m = Manifest(older_manifest(skipped_count=7, ignored_count=9, labelled=False, ignored_by_reason={"x": 9}))
    assert (m.skipped_count, m.ignored_count, m.labelled, m.ignored_by_reason) == (7, 9, False, {"x": 9})


def test_a_pack_whose_manifest_lacks_the_optional_fields_reads_with_the_defaults(tmp_path: Path) -> None:
    dst = tmp_path / "p.shards"
    pack(pil_folder(tmp_path / "src"), dst, workers=1, progress=False)
    full = json.loads((dst / "manifest.json").read_text())
    (dst / "manifest.json").write_bytes(encode_manifest(
        {key: value for key, value in full.items() if key in (*MANIFEST_REQUIRED, "parts", "index")}))
    with PackReader(dst, check_index=True) as reader:
        m = reader.manifest
        assert (m.skipped_count, m.ignored_count, m.labelled, m.class_counts, m.id) == (1, 0, True, None, None)
        assert reader.identity == m.index["sha256"]  # no id: the index's sha256 tells this pack from another
    described = info(dst)
    assert described["skipped_count"] == 1 and described["class_counts"] == {} and described["labelled"] is True
    assert described["source"] == {} and described["options"] == {} and described["created"] is None
    assert verify(dst, progress=False)["ok"]


def test_every_manifest_made_is_a_manifest_and_writers_set_what_they_add(tmp_path: Path) -> None:
    from packload.packer.write_lmdb import LmdbWriter
    from packload.packer.write_shards import ShardsWriter

    built = build_manifest(backend="shards", encoding="keep", source={"name": "s"}, labelled=True, classes=["a"],
                           labels=np.zeros(0, np.int32), payload_bytes=0, skipped=[], ignored=[], options={})
    assert type(built) is Manifest and is_packload_manifest(built) and "parts" not in built
    for made in (built.copy(), copy.copy(built), copy.deepcopy(built), pickle.loads(pickle.dumps(built))):
        assert type(made) is Manifest and made == built
    folder = tmp_path / "w"
    folder.mkdir()
    shards = ShardsWriter(folder, 1 << 20).finish(built)
    assert type(shards) is Manifest and "parts" not in built  # the writer's copy, the one built untouched
    assert shards.parts == [] and shards.index == index_entry(INDEX_NAME, (folder / INDEX_NAME).read_bytes())
    assert decode_manifest((folder / "manifest.json").read_bytes(), "w") == shards
    writer = LmdbWriter(tmp_path / "w.lmdb", 1 << 24)
    try:
        lmdb = writer.finish(dict(built, backend="lmdb"))
    finally:
        writer.close()
    assert type(lmdb) is Manifest and (lmdb.chunks, lmdb.chunk_size) == (0, 1 << 20)
    with PackReader(tmp_path / "w.lmdb") as reader:
        assert type(reader.manifest) is Manifest and reader.manifest == lmdb
    # The setters, for what a writer adds after building; every other field is read-only.
    made = built.copy()
    made.parts, made.index, made.fields = [{"name": "shard-00000.bin"}], index_entry(INDEX_NAME, b"abc"), {"x": 1}
    assert made["parts"] == [{"name": "shard-00000.bin"}] and made["fields"] == {"x": 1}
    assert made["index"] == {"name": INDEX_NAME, "size": 3, "sha256": hashlib.sha256(b"abc").hexdigest()}
    with pytest.raises(AttributeError):
        made.records = 5  # type: ignore[misc]
    with pytest.raises(AttributeError):
        made.colour = "red"  # type: ignore[attr-defined]
    assert not is_packload_manifest({"format": "other"}) and not is_packload_manifest([FORMAT_NAME])
    with pytest.raises(PackFormatError, match="not a packload manifest"):
        decode_manifest(encode_manifest(dict(built, format="other")), "m.json")


def test_a_merged_pack_is_read_as_a_manifest_with_its_inputs(tmp_path: Path) -> None:
    inputs = [tmp_path / "one.shards", tmp_path / "two.lmdb"]
    pack(pil_folder(tmp_path / "src"), inputs[0], workers=1, progress=False)
    make_image_folder(tmp_path / "other", classes=("cat", "eel"), per_class=2, seed=4)
    pack(tmp_path / "other", inputs[1], workers=1, progress=False)
    merge(tmp_path / "m.shards", inputs, progress=False)
    with PackReader(tmp_path / "m.shards") as reader:
        m = reader.manifest
        assert type(m) is Manifest and m.classes == ["cat", "dog", "eel"] and m.records == 9
        assert [(i["name"], i["records"]) for i in m.merged_from] == [("src", 5), ("other", 4)]
        assert m.skipped_count == 1 and m.ignored_count == 1 and m.source["files"] == 10


def documented_fields() -> set[str]:
    """The manifest fields docs/FORMAT.md lists (its table, and the merged packs' ``merged_from``)."""
    section = (ROOT / "docs" / "FORMAT.md").read_text().split("\n## Manifest\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(\w+)`\s+\|", section, re.M)) | set(re.findall(r"`(merged_from)`", section))


def test_every_field_has_a_property() -> None:
    fields = documented_fields()
    assert {"format", "records", "skipped_count", "parts", "index", "merged_from"} <= fields and len(fields) >= 22
    known = fields | set(MANIFEST_REQUIRED) | set(manifest_module._OPTIONAL_FIELDS) | {"parts"}
    assert [key for key in sorted(known) if not isinstance(getattr(Manifest, key, None), property)] == []


# -- no manifest key spelt outside packload/core/manifest.py ----------------------------------------
LIBRARY = ("packload", "packer", "loaders")
HOME = "packload/core/manifest.py"
# What holds a manifest: ``manifest``, ``manifests`` (``manifests[0]``), ``meta``, or ``*_manifest``,
# as a variable or as an attribute (``reader.manifest``).
_HOLDER = re.compile(r"(?:^|_)(?:manifests?|meta)$")


def _is_str(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _holds_manifest(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return bool(_HOLDER.search(node.id))
    if isinstance(node, ast.Attribute):
        return bool(_HOLDER.search(node.attr))
    if isinstance(node, ast.Subscript) and not _is_str(node.slice):  # manifests[0]
        return _holds_manifest(node.value)
    return False


def _spells_a_key(node: ast.AST) -> bool:
    if isinstance(node, ast.Subscript):  # manifest["records"], read or set
        return _is_str(node.slice) and _holds_manifest(node.value)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _holds_manifest(node.func.value):
        if node.func.attr in ("get", "pop", "setdefault"):  # manifest.get("fields")
            return bool(node.args) and _is_str(node.args[0])
        if node.func.attr == "update":  # manifest.update(parts=...), manifest.update({"parts": ...})
            return bool(node.keywords) or any(isinstance(a, ast.Dict) and any(map(_is_str, a.keys)) for a in node.args)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":  # dict(manifest, k=)
        return bool(node.args) and _holds_manifest(node.args[0]) and any(k.arg for k in node.keywords)
    if isinstance(node, ast.Compare):  # "fields" in manifest
        return _is_str(node.left) and isinstance(node.ops[0], (ast.In, ast.NotIn)) \
            and _holds_manifest(node.comparators[0])
    if isinstance(node, ast.Dict):  # {**manifest, "parts": ...}
        return any(k is None and _holds_manifest(v) for k, v in zip(node.keys, node.values, strict=True)) \
            and any(map(_is_str, node.keys))
    return False


def key_literals(source: str) -> list[tuple[int, str]]:
    """(line, code) of every manifest key spelt in ``source``."""
    return sorted((node.lineno, ast.get_source_segment(source, node) or "")
                  for node in ast.walk(ast.parse(source)) if _spells_a_key(node))


def test_the_scan_sees_every_spelling() -> None:
    source = "\n".join([
        'a = manifest["records"]', 'b = reader.manifest.get("fields", {})', 'c = "fields" in self.manifest',
        'd = manifests[0]["encoding"]', 'e = meta["parts"]', "manifest.update(parts=[])",
        "f = dict(manifest, index={})", 'g = {**old_manifest, "id": "x"}', 'manifest["fields"] = {}',
        'ok = manifest.source["bytes"], report["records"], manifest_bytes[1:], manifest.index.get("sha256")',
        'ok = manifest[1], dict(manifest), {**manifest}, manifest.update(other), "x" in manifest.fields'])
    assert [line for line, _ in key_literals(source)] == list(range(1, 10))
    assert key_literals('x = manifest["source"]["bytes"]') == [(1, 'manifest["source"]')]


def test_no_manifest_key_is_spelt_outside_its_module() -> None:
    """Library code reads a manifest through ``Manifest``'s properties; only its module spells keys."""
    sources = sorted({p.resolve().relative_to(ROOT).as_posix() for folder in LIBRARY
                      for p in (ROOT / folder).rglob("*.py")})
    assert HOME in sources and "packer/write_shards.py" in sources and "loaders/verify.py" in sources
    found = []
    for rel in sources:
        if rel == HOME:
            continue
        for line, code in key_literals((ROOT / rel).read_text()):
            found.append(f"{rel}:{line}: {code}")
    assert not found, ("manifest keys spelt outside packload/core/manifest.py: read them through the Manifest's "
                       "properties (manifest.records, manifest.skipped_count, manifest.shards, ...) and set them "
                       "through its setters (manifest.parts, manifest.index, manifest.fields):\n" + "\n".join(found))
