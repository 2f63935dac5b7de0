"""``docs/FORMAT.md`` is true: real packs read correctly with a reader built from the document alone.

The packs are written with ``packload.pack``; everything that reads them here uses only the standard
library, numpy, PIL (to know what the source images are) and ``lmdb``: nothing from ``packer`` or
``loaders``. The byte layouts are not typed in again: they are parsed from the document's tables,
so a wrong table fails these tests. The document's fenced ``python`` examples are executed too.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import struct
import sys
import zlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import lmdb
import numpy as np
import pytest
from PIL import Image

from packload import EncodeOptions, SkippedFileError, pack  # writing only

DOC = Path(__file__).resolve().parents[2] / "docs" / "FORMAT.md"
DOC_TEXT = DOC.read_text("utf-8")
STRUCT_CODES = {"u8": "B", "u16": "H", "u32": "I", "u64": "Q", "i32": "i"}
IMAGE_SUFFIXES = {".jpg", ".png"}
BROKEN = "dog/broken.jpg"
UNICODE_NAME = "dog/ñandú 犬.png"
EXIF_ORIENTATION = 0x0112


# -- the document, parsed ----------------------------------------------------------------------
def _section(heading: str) -> list[str]:
    """The lines after the heading that starts with ``heading``, up to the next heading."""
    lines = DOC_TEXT.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith(heading))
    body = []
    for line in lines[start + 1 :]:
        if line.startswith("#"):
            break
        body.append(line)
    return [lines[start], *body]


def _table_rows(lines: list[str]) -> list[list[str]]:
    """Cells of the first markdown table in ``lines``, without its header and separator rows."""
    rows: list[list[str]] = []
    seen = False
    for line in lines:
        if not line.startswith("|"):
            if seen:
                break
            continue
        seen = True
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows[2:]


class Layout:
    """A fixed binary structure as a FORMAT.md table gives it (Offset | Size | Type | Field | ...)."""

    def __init__(self, heading: str) -> None:
        lines = _section("### " + heading)
        self.size = int(re.search(r"\((\d+) bytes\)", lines[0]).group(1))
        self.names: list[str] = []
        codes = []
        end = 0
        for offset, size, typ, name, *_ in _table_rows(lines):
            char = re.fullmatch(r"char\[(\d+)\]", typ)
            code = f"{char.group(1)}s" if char else STRUCT_CODES[typ]
            assert int(offset) == end, f"{heading}: {name} at {offset}, the previous field ends at {end}"
            assert struct.calcsize("<" + code) == int(size), f"{heading}: {name} is {typ}, not {size} bytes"
            end += int(size)
            self.names.append(name)
            codes.append(code)
        self.struct = struct.Struct("<" + "".join(codes))
        assert self.struct.size == end == self.size, f"{heading}: fields add up to {end} bytes"

    def read(self, buf: bytes, offset: int = 0) -> dict:
        return dict(zip(self.names, self.struct.unpack_from(buf, offset), strict=True))


SHARD_HEADER = Layout("Shard header")
RECORD = Layout("Record header")
INDEX_HEADER = Layout("Index header")
INDEX_ENTRY = Layout("Index entry")
FORMAT_CODES = {row[1].strip("`"): int(row[0]) for row in _table_rows(_section("### Payload formats"))}
MANIFEST_FIELDS = {row[0].strip("`") for row in _table_rows(_section("## Manifest"))}
OPTIONS_FIELDS = {"backend", "encoding", "check", "quality", "max_side", "size", "max_pixels"}


def doc_examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC_TEXT, flags=re.DOTALL)


# -- the source folder and what each record must be --------------------------------------------
def _pixels(h: int, w: int, seed: int, noise: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if noise:  # incompressible: makes payloads big enough to need several shards and chunks
        return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    ys, xs = np.mgrid[0:h, 0:w]
    base = np.stack([xs * 255 // max(w - 1, 1), ys * 255 // max(h - 1, 1), (xs + ys) % 256], axis=-1)
    return np.clip(base + rng.integers(-20, 20, (h, w, 3)), 0, 255).astype(np.uint8)


def make_source(root: Path) -> Path:
    """Two classes of JPEGs and PNGs (RGB, L, P, EXIF-rotated, unicode name, big noise), a broken
    JPEG that must be skipped and a text file that must be ignored."""
    (root / "cat").mkdir(parents=True)
    (root / "dog").mkdir()
    Image.fromarray(_pixels(48, 64, 1)).save(root / "cat" / "a_photo.jpg", quality=85)
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = 6
    Image.fromarray(_pixels(30, 40, 2)).save(root / "cat" / "rotated.jpg", exif=exif.tobytes())
    Image.fromarray(_pixels(20, 24, 3)[:, :, 0]).save(root / "cat" / "gray.png")
    Image.fromarray(_pixels(360, 360, 4, noise=True)).save(root / "cat" / "noise0.png")
    Image.fromarray(_pixels(16, 16, 5)).convert("P").save(root / "dog" / "palette.png")
    Image.fromarray(_pixels(25, 33, 6)).save(root / UNICODE_NAME)
    Image.fromarray(_pixels(360, 360, 7, noise=True)).save(root / "dog" / "noise1.png")
    Image.fromarray(_pixels(360, 360, 8, noise=True)).save(root / "dog" / "noise2.png")
    whole = io.BytesIO()
    Image.fromarray(_pixels(64, 64, 9)).save(whole, "JPEG")
    (root / BROKEN).write_bytes(whole.getvalue()[: len(whole.getvalue()) // 2])
    (root / "dog" / "notes.txt").write_text("not an image")
    return root


@dataclass
class Expected:
    path: str
    label: int
    payload: bytes
    width: int
    height: int
    mode: bytes
    format: int
    orientation: int


def image_files(src: Path) -> list[Path]:
    """The source's image files in ImageFolder order (sorted class folders, sorted names)."""
    return sorted((p for p in src.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES),
                  key=lambda p: p.relative_to(src).parts)


def expected_records(src: Path, encoding: str) -> list[Expected]:
    classes = sorted(p.name for p in src.iterdir() if p.is_dir())
    out = []
    for file in image_files(src):
        rel = file.relative_to(src).as_posix()
        if rel == BROKEN:
            continue
        data = file.read_bytes()
        with Image.open(file) as im:
            orientation = im.getexif().get(EXIF_ORIENTATION, 0)
            label = classes.index(rel.split("/")[0]) if classes else -1
            if encoding == "keep":
                code = FORMAT_CODES.get(im.format, FORMAT_CODES["other"])
                mode, payload = im.mode, data
            else:
                assert encoding == "raw"
                code, mode, payload = FORMAT_CODES["raw"], "RGB", np.asarray(im.convert("RGB")).tobytes()
            out.append(Expected(rel, label, payload, im.width, im.height, mode.encode().ljust(8, b"\0"),
                                code, orientation))
    return out


# -- the independent reader ------------------------------------------------------------------
def read_shards(folder: Path) -> tuple[dict, bytes, list[bytes], int]:
    """(manifest, index, parts, offset of the first record in a part) of a shards pack."""
    manifest = json.loads((folder / "manifest.json").read_bytes())
    index = (folder / "index.bin").read_bytes()
    parts = []
    for p, part in enumerate(manifest["parts"]):
        assert part["name"] == f"shard-{p:05d}.bin"
        data = (folder / part["name"]).read_bytes()
        assert SHARD_HEADER.read(data) == {"magic": b"PLSD", "version": 1, "part": p, "reserved": 0}
        parts.append(data)
    return manifest, index, parts, SHARD_HEADER.size


def read_lmdb(path: Path) -> tuple[dict, bytes, list[bytes], int, list[bytes]]:
    """(manifest, index, chunks, 0, every key) of an LMDB pack; chunks come from a cursor at ``c``."""
    with lmdb.open(str(path), subdir=False, readonly=True, lock=False) as env, env.begin() as txn:
        keys = [bytes(key) for key in txn.cursor().iternext(keys=True, values=False)]
        manifest = json.loads(txn.get(b"#manifest"))
        index = bytes(txn.get(b"#index"))
        cursor = txn.cursor()
        assert cursor.set_range(b"c")
        chunks = []
        for key, value in cursor:
            assert key == b"c" + len(chunks).to_bytes(8, "big"), key
            chunks.append(bytes(value))
    return manifest, index, chunks, 0, keys


def check_records(index: bytes, parts: list[bytes], first: int, expected: list[Expected]) -> list[dict]:
    """Check the index and every record of ``parts`` against each other and against ``expected``."""
    header = INDEX_HEADER.read(index)
    count, paths_len = header["count"], header["paths_len"]
    assert header == {"magic": b"PLIX", "version": 1, "count": len(expected), "entry_size": INDEX_ENTRY.size,
                      "reserved": 0, "paths_len": paths_len}
    assert len(index) == INDEX_HEADER.size + count * INDEX_ENTRY.size + paths_len
    entries = [INDEX_ENTRY.read(index, INDEX_HEADER.size + i * INDEX_ENTRY.size) for i in range(count)]
    blob = index[INDEX_HEADER.size + count * INDEX_ENTRY.size :]

    walked = []  # every record, found by walking each part from its first record to its end
    for p, data in enumerate(parts):
        offset = first
        while offset < len(data):
            head = RECORD.read(data, offset)
            path_start = offset + RECORD.size
            payload_start = path_start + head["path_len"]
            payload_end = payload_start + head["payload_len"]
            assert head["magic"] == b"PLR1" and head["reserved"] == 0
            assert head["record"] == len(walked), "records are numbered in order across parts"
            assert payload_end <= len(data)
            path = data[path_start:payload_start]
            assert head["header_crc32"] == zlib.crc32(data[offset + 8 : path_start] + path)
            assert head["header_crc32"] == zlib.crc32(path, zlib.crc32(data[offset + 8 : path_start]))
            payload = data[payload_start:payload_end]
            assert head["payload_crc32"] == zlib.crc32(payload)
            walked.append((p, offset, head, path, payload))
            offset = payload_end
        assert offset == len(data), "records lie back to back up to the end of the part"
    assert len(walked) == count

    path_offset = 0
    for i, ((p, offset, head, path, payload), entry, exp) in enumerate(zip(walked, entries, expected, strict=True)):
        assert (entry["part"], entry["record_offset"]) == (p, offset)
        assert entry["payload_offset"] == offset + RECORD.size + head["path_len"]
        for field in ("label", "payload_len", "payload_crc32", "width", "height", "path_len", "format",
                      "orientation", "mode"):
            assert entry[field] == head[field], (i, field)
        assert entry["path_offset"] == path_offset
        path_offset += entry["path_len"]
        assert blob[entry["path_offset"] : path_offset] == path == exp.path.encode("utf-8")
        part = parts[entry["part"]]
        assert part[entry["payload_offset"] : entry["payload_offset"] + entry["payload_len"]] == payload
        got = (head["label"], head["width"], head["height"], head["mode"], head["format"], head["orientation"])
        assert got == (exp.label, exp.width, exp.height, exp.mode, exp.format, exp.orientation), exp.path
        assert payload == exp.payload, exp.path
        if head["format"] == FORMAT_CODES["raw"]:
            assert head["payload_len"] == head["width"] * head["height"] * 3
    assert path_offset == paths_len
    return entries


def check_manifest(manifest: dict, src: Path, backend: str, encoding: str, expected: list[Expected],
                   index: bytes) -> None:
    assert manifest["format"] == "packload" and manifest["version"] == 1
    assert set(manifest) == MANIFEST_FIELDS, "FORMAT.md's manifest table lists exactly the fields written"
    classes = sorted(p.name for p in src.iterdir() if p.is_dir())
    files = image_files(src)
    assert manifest["backend"] == backend and manifest["encoding"] == encoding
    assert manifest["records"] == len(expected)
    assert manifest["classes"] == classes and manifest["labelled"] is bool(classes)
    assert manifest["class_counts"] == {c: sum(e.label == n for e in expected) for n, c in enumerate(classes)}
    assert manifest["payload_bytes"] == sum(len(e.payload) for e in expected)
    broken = [BROKEN] if (src / BROKEN).exists() else []
    assert [s["path"] for s in manifest["skipped"]] == broken
    assert all(isinstance(s["reason"], str) and s["reason"] for s in manifest["skipped"])
    ignored = manifest["ignored"]
    assert [i["path"] for i in ignored] == sorted(i["path"] for i in ignored)
    assert all(set(i) == {"path", "reason"} and isinstance(i["reason"], str) for i in ignored)
    if (src / "dog" / "notes.txt").exists():
        assert "dog/notes.txt" in [i["path"] for i in ignored]
    skipped = {item["path"] for item in manifest["skipped"]}
    packed_bytes = sum(f.stat().st_size for f in files if f.relative_to(src).as_posix() not in skipped)
    assert manifest["source"] == {"name": src.name, "files": len(files), "bytes": packed_bytes}
    assert manifest["source"]["files"] == manifest["records"] + len(manifest["skipped"])
    options = manifest["options"]
    assert set(options) == OPTIONS_FIELDS and options["backend"] == backend and options["encoding"] == encoding
    assert options["check"] in ("fast", "full") and isinstance(options["quality"], int)
    assert options["max_side"] is None and options["size"] is None and options["max_pixels"] is None
    assert manifest["index"] == {"name": "index.bin" if backend == "shards" else "#index", "size": len(index),
                                 "sha256": hashlib.sha256(index).hexdigest()}
    created = datetime.fromisoformat(manifest["created"])
    assert created.utcoffset() == timedelta(0)
    assert isinstance(manifest["packload_version"], str)


# -- fixtures --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("format_doc")
    src = make_source(root / "src")
    out = {"src": src, "shards": root / "p.shards", "lmdb": root / "p.lmdb", "raw": root / "raw.shards"}
    pack(src, out["shards"], workers=1, progress=False, shard_size=1 << 16)  # small: several shards
    pack(src, out["lmdb"], workers=1, progress=False)
    pack(src, out["raw"], workers=1, progress=False, options=EncodeOptions(encoding="raw"))
    return out


# -- tests -----------------------------------------------------------------------------------
def test_document_tables_are_consistent() -> None:
    assert (SHARD_HEADER.size, RECORD.size, INDEX_HEADER.size, INDEX_ENTRY.size) == (16, 56, 32, 64)
    for layout in (RECORD, INDEX_HEADER, INDEX_ENTRY):  # the struct formats quoted in the text
        assert f'"{layout.struct.format}"' in DOC_TEXT
    assert sorted(FORMAT_CODES.values()) == list(range(len(FORMAT_CODES)))
    assert {"raw", "JPEG", "PNG", "other"} <= set(FORMAT_CODES)
    assert {"format", "version", "parts", "index", "skipped", "ignored", "options"} <= MANIFEST_FIELDS


def test_shards_pack_matches_document(packs: dict[str, Path]) -> None:
    folder, src = packs["shards"], packs["src"]
    assert folder.is_dir() and not folder.with_name(folder.name + ".partial").exists()
    manifest, index, parts, first = read_shards(folder)
    expected = expected_records(src, "keep")
    assert len(parts) >= 3, "a 64 KiB shard size must give several shards"
    assert {p.name for p in folder.iterdir()} == {"manifest.json", "index.bin", *(p["name"] for p in manifest["parts"])}
    check_manifest(manifest, src, "shards", "keep", expected, index)
    entries = check_records(index, parts, first, expected)
    for p, (part, data) in enumerate(zip(manifest["parts"], parts, strict=True)):
        assert set(part) == {"name", "size", "sha256", "records"}
        assert part["size"] == len(data) and part["sha256"] == hashlib.sha256(data).hexdigest()
        assert part["records"] == sum(e["part"] == p for e in entries)
        assert len(data) <= 1 << 16 or part["records"] == 1, "only a lone oversized record passes the target"
    assert any(e.orientation == 6 for e in expected) and any(e.mode.startswith(b"P\0") for e in expected)


def test_lmdb_pack_matches_document(packs: dict[str, Path]) -> None:
    path, src = packs["lmdb"], packs["src"]
    assert path.is_file() and not Path(f"{path}-lock").exists()
    assert not path.with_name(path.name + ".partial").exists()
    manifest, index, chunks, first, keys = read_lmdb(path)
    expected = expected_records(src, "keep")
    assert keys == [b"#index", b"#manifest", *(b"c" + n.to_bytes(8, "big") for n in range(len(chunks)))]
    check_manifest(manifest, src, "lmdb", "keep", expected, index)
    assert manifest["parts"] == {"chunks": len(chunks), "chunk_size": 1 << 20}
    assert len(chunks) >= 2, "over 1 MiB of payload must take several chunks"
    entries = check_records(index, chunks, first, expected)
    for n, chunk in enumerate(chunks):
        records = sum(e["part"] == n for e in entries)
        assert records >= 1 and (len(chunk) <= 1 << 20 or records == 1)


def test_raw_pack_matches_document(packs: dict[str, Path]) -> None:
    manifest, index, parts, first = read_shards(packs["raw"])
    expected = expected_records(packs["src"], "raw")
    check_manifest(manifest, packs["src"], "shards", "raw", expected, index)
    check_records(index, parts, first, expected)


def test_unlabelled_pack_matches_document(tmp_path: Path) -> None:
    src = tmp_path / "flat"
    src.mkdir()
    Image.fromarray(_pixels(10, 12, 1)).save(src / "one.png")
    Image.fromarray(_pixels(12, 10, 2)).save(src / "two.jpg")
    pack(src, tmp_path / "flat.shards", workers=1, progress=False)
    manifest, index, parts, first = read_shards(tmp_path / "flat.shards")
    expected = expected_records(src, "keep")
    assert [e.label for e in expected] == [-1, -1]
    check_manifest(manifest, src, "shards", "keep", expected, index)
    assert manifest["classes"] == [] and manifest["labelled"] is False and manifest["class_counts"] == {}
    check_records(index, parts, first, expected)


@pytest.mark.parametrize("backend", ["shards", "lmdb"])
def test_unfinished_pack_matches_document(packs: dict[str, Path], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    """A pack stopped part way (here: strict mode meets the broken file) is DEST.partial, holds
    a progress checkpoint and no manifest, and its intact records read as the document says."""
    monkeypatch.setattr(sys.modules[pack.__module__], "CHECKPOINT_SECONDS", 0.0)  # checkpoint every file
    dst = tmp_path / f"p.{backend}"
    with pytest.raises(SkippedFileError):
        pack(packs["src"], dst, backend=backend, workers=1, progress=False, strict=True)
    partial = tmp_path / f"{dst.name}.partial"
    assert not dst.exists() and partial.exists()
    cats = [e for e in expected_records(packs["src"], "keep") if e.path.startswith("cat/")]
    if backend == "shards":
        assert partial.is_dir() and not (partial / "manifest.json").exists()
        progress = json.loads((partial / "progress.json").read_bytes())
        data = (partial / "shard-00000.bin").read_bytes()
        assert SHARD_HEADER.read(data)["magic"] == b"PLSD"
        parts, first = [data], SHARD_HEADER.size
    else:
        assert partial.is_file()
        with lmdb.open(str(partial), subdir=False, readonly=True, lock=False) as env, env.begin() as txn:
            assert txn.get(b"#manifest") is None and txn.get(b"#index") is None
            progress = json.loads(txn.get(b"#progress"))
            cursor = txn.cursor()
            assert cursor.set_range(b"c")
            parts, first = [bytes(value) for _, value in cursor], 0
    assert set(progress) >= {"options", "skipped"} and progress["options"]["backend"] == backend
    # Every record written before the stop is intact: walk them as check_records does.
    seen = []
    for data in parts:
        offset = first
        while offset < len(data):
            head = RECORD.read(data, offset)
            start = offset + RECORD.size + head["path_len"]
            assert zlib.crc32(data[start : start + head["payload_len"]]) == head["payload_crc32"]
            seen.append(data[offset + RECORD.size : start].decode("utf-8"))
            offset = start + head["payload_len"]
    assert seen == [e.path for e in cats]


def test_document_examples_run(packs: dict[str, Path]) -> None:
    """The worked examples in FORMAT.md, executed as written against every record."""
    examples = doc_examples()
    assert len(examples) == 2 and "lmdb.open" in examples[1]
    expected = expected_records(packs["src"], "keep")
    for i, exp in enumerate(expected):
        scope = {"pack_dir": str(packs["shards"]), "lmdb_path": packs["lmdb"], "i": i}
        for code in examples:
            scope.pop("path", None)
            exec(compile(code, str(DOC), "exec"), scope)
            assert (scope["path"], scope["label"], scope["payload"]) == (exp.path, exp.label, exp.payload)
            assert scope["manifest"]["records"] == len(expected)
        assert scope["record"] == i and "pixels" not in scope
    raw = expected_records(packs["src"], "raw")
    for i, exp in enumerate(raw):
        scope = {"pack_dir": packs["raw"], "i": i}
        exec(compile(examples[0], str(DOC), "exec"), scope)
        assert scope["path"] == exp.path and scope["pixels"].shape == (exp.height, exp.width, 3)
        assert scope["pixels"].tobytes() == exp.payload
        with Image.open(packs["src"] / exp.path) as im:
            assert np.array_equal(scope["pixels"], np.asarray(im.convert("RGB")))
