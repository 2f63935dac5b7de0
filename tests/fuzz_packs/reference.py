"""The reference reader: a pack read with docs/FORMAT.md and nothing else (plain slicing of the
files' bytes, Python integers), what each record is and every rule of the format the pack breaks."""

from __future__ import annotations

import hashlib
import json
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tests.fuzz_packs.model import (
    ENCODINGS,
    ENTRY_FIELDS,
    FORMAT_CODES,
    HEAD,
    INDEX_ENTRY,
    INDEX_HEADER,
    RECORD_HEADER,
    SHARD_HEADER,
    read_lmdb,
)

DOC_MANIFEST_LIMIT = 64 << 20  # docs/FORMAT.md: a reader refuses a larger manifest before parsing it
VALUE_LIMIT = 2**62  # docs/FORMAT.md: every index offset and length is below this
MAX_ORIENTATION = 8


class _Refuse(Exception):
    """The pack as a whole breaks a rule every reader must refuse it for."""


@dataclass
class RefRecord:
    """Record ``i`` as the pack says it is: its entry's fields, the bytes the entry names (None when
    they do not exist), why a reader must not return it (None: it may), its CRC's verdict, and what
    its record header disagrees with (None: nothing)."""

    part: int
    label: int
    fmt: int
    width: int
    height: int
    path: bytes | None
    payload: bytes | None = None
    bad: str | None = None
    crc_ok: bool = False
    header: str | None = None

    @property
    def text_path(self) -> str | None:
        try:
            return None if self.path is None else self.path.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def pixels(self) -> np.ndarray | None:
        """Raw pixels as (height, width, 3), when the payload is that many bytes."""
        if self.fmt != 0 or self.payload is None or len(self.payload) != self.width * self.height * 3:
            return None
        return np.frombuffer(self.payload, np.uint8).reshape(self.height, self.width, 3)


def unsafe_path(path: str) -> bool:
    """What docs/FORMAT.md says unpack must refuse: empty, absolute, ``\\`` or NUL, an empty, . or .. part."""
    return (not path or path.startswith("/") or "\\" in path or "\0" in path
            or any(part in ("", ".", "..") for part in path.split("/")))


def unpack_refuses(ref: Reference) -> bool:
    """Whether unpack must refuse the pack for its paths: one unsafe or not UTF-8, or two the same."""
    paths = [rec.text_path for rec in ref.records]
    return any(p is None or unsafe_path(p) for p in paths) or len(set(paths)) != len(paths)


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _path_list(value: Any) -> bool:
    """A list of {path, reason} objects, as ``skipped`` and ``ignored`` are."""
    return isinstance(value, list) and all(isinstance(item, dict) and isinstance(item.get("path"), str)
                                           for item in value)


class Reference:
    """A pack read with the format document and nothing else (plain slicing of the files' bytes,
    Python integers): what each record is, and every rule of the format the pack breaks.

    ``pack_bad``: why every reader must refuse the whole pack (versioning, required manifest fields,
    the index header), or None. ``records[i].bad``: why a reader must not return record ``i``.
    ``violations``: (rule, detail) of every rule broken, what ``packload verify`` must report."""

    def __init__(self, pack: Path, manifest_limit: int = DOC_MANIFEST_LIMIT) -> None:
        self.pack = pack
        self.backend = "shards" if pack.is_dir() else "lmdb"
        self.manifest_limit = min(manifest_limit, DOC_MANIFEST_LIMIT)
        self.pack_bad: str | None = None
        self.violations: list[tuple[str, str]] = []
        self.records: list[RefRecord] = []
        self.manifest: Any = None
        self.classes: list[str] = []
        self.encoding = ""
        self.index_sha_ok = False
        self._cache: dict[int, tuple[bytes | None, str | None]] = {}  # part -> (bytes, why unreadable)
        try:
            self._read()
        except _Refuse as exc:
            self.pack_bad = str(exc)
            self.violations.insert(0, (str(exc), ""))

    def violate(self, rule: str, detail: str = "") -> None:
        self.violations.append((rule, detail))

    def problems(self) -> list[tuple[str, str]]:
        """Everything ``verify`` must report: every rule broken, each record that must not be read."""
        out = list(self.violations)
        for i, rec in enumerate(self.records):
            if rec.bad:
                out.append((rec.bad, f"record {i}"))
            if rec.payload is not None and not rec.crc_ok:
                out.append(("a payload fails its CRC", f"record {i}"))
        return out

    # -- reading ---------------------------------------------------------------------------------
    def _read(self) -> None:
        manifest_raw, index_raw, parts = self._files()
        m = self._manifest(manifest_raw)
        entries, paths = self._index(index_raw)
        if m["records"] != len(entries):
            raise _Refuse("manifest records differ from the index count")
        self._optional_types(m)
        for i, e in enumerate(entries):
            self.records.append(self._record(i, e, paths, parts))
        self._meaning(m, entries, paths, index_raw, parts)

    def _files(self) -> tuple[bytes, bytes | None, Any]:
        if self.backend == "shards":
            path = self.pack / "manifest.json"
            if not path.is_file():
                raise _Refuse("no manifest")
            if path.stat().st_size > self.manifest_limit:
                raise _Refuse("the manifest is far larger than any pack's")
            index = self.pack / "index.bin"
            return path.read_bytes(), index.read_bytes() if index.is_file() else None, None
        values = read_lmdb(self.pack)
        raw = values.get(b"#manifest")
        if raw is None:
            raise _Refuse("no manifest")
        if len(raw) > self.manifest_limit:
            raise _Refuse("the manifest is far larger than any pack's")
        chunks = {int.from_bytes(k[1:], "big"): v for k, v in values.items() if len(k) == 9 and k[:1] == b"c"}
        return raw, values.get(b"#index"), chunks

    def _manifest(self, raw: bytes) -> dict[str, Any]:
        try:
            m = json.loads(raw.decode("utf-8"))
        except Exception as exc:  # noqa: BLE001 - any failure to parse is a refusal
            raise _Refuse(f"the manifest is not JSON ({type(exc).__name__})") from None
        if not isinstance(m, dict):
            raise _Refuse("the manifest is not a JSON object")
        if m.get("format") != "packload" or type(m.get("format")) is not str:
            raise _Refuse("the manifest's format is not packload")
        if type(m.get("version")) is not int or m["version"] != 1:
            raise _Refuse("the manifest's version is not the integer 1")
        missing = [k for k in ("backend", "encoding", "records", "classes", "skipped") if k not in m]
        if missing:
            raise _Refuse(f"the manifest lacks {missing[0]}")
        if not isinstance(m["backend"], str) or m["backend"] != self.backend:
            raise _Refuse("the manifest's backend is not the pack's")
        if not isinstance(m["encoding"], str) or m["encoding"] not in ENCODINGS:
            raise _Refuse("the manifest's encoding is unknown")
        if not _is_count(m["records"]):
            raise _Refuse("the manifest's records is not a count")
        if not isinstance(m["classes"], list) or not all(isinstance(c, str) for c in m["classes"]):
            raise _Refuse("the manifest's classes are not a list of names")
        if not _path_list(m["skipped"]):
            raise _Refuse("the manifest's skipped is not a list of {path, reason}")
        if self.backend == "shards":
            parts = m.get("parts")
            if not isinstance(parts, list) or not all(isinstance(p, dict) and isinstance(p.get("name"), str)
                                                      for p in parts):
                raise _Refuse("the manifest has no list of shards")
        self.manifest, self.classes, self.encoding = m, m["classes"], m["encoding"]
        return m

    def _index(self, raw: bytes | None) -> tuple[list[dict[str, Any]], bytes]:
        if raw is None or len(raw) < INDEX_HEADER.size:
            raise _Refuse("no index, or one shorter than its header")
        magic, version, count, entry_size, _, paths_len = INDEX_HEADER.unpack_from(raw)
        if magic != b"PLIX" or version != 1 or entry_size != INDEX_ENTRY.size:
            raise _Refuse("the index header's magic, version or entry size is wrong")
        if len(raw) != INDEX_HEADER.size + INDEX_ENTRY.size * count + paths_len:
            raise _Refuse("the index's length disagrees with its count and paths_len")
        at = INDEX_HEADER.size
        names = list(ENTRY_FIELDS)
        entries = [dict(zip(names, INDEX_ENTRY.unpack_from(raw, at + INDEX_ENTRY.size * i), strict=True))
                   for i in range(count)]
        return entries, raw[INDEX_HEADER.size + INDEX_ENTRY.size * count :]

    def _optional_types(self, m: dict[str, Any]) -> None:
        """The documented types of the optional fields, when present (verify must report others)."""
        checks: dict[str, Callable[[Any], bool]] = {
            "class_counts": lambda v: isinstance(v, dict) and all(map(_is_count, v.values())),
            "labelled": lambda v: isinstance(v, bool),
            "payload_bytes": lambda v: v is None or _is_count(v),
            "ignored": _path_list,
            "source": lambda v: isinstance(v, dict),
            "options": lambda v: isinstance(v, dict),
            "index": lambda v: isinstance(v, dict) and isinstance(v.get("name"), str) and isinstance(
                v.get("sha256"), str) and _is_count(v.get("size")),
            "created": lambda v: isinstance(v, str),
            "packload_version": lambda v: isinstance(v, str),
            "skipped_count": _is_count,
            "ignored_count": _is_count,
            "ignored_by_reason": lambda v: isinstance(v, dict) and all(map(_is_count, v.values())),
            "id": lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{32}", v) is not None,
        }
        for key, ok in checks.items():
            if key in m and not ok(m[key]):
                self.violate(f"the manifest's {key} has the wrong type")
        parts = m.get("parts")
        if self.backend == "shards":
            if not all(_is_count(p.get("size")) and isinstance(p.get("sha256"), str)
                       and _is_count(p.get("records")) for p in parts):
                self.violate("a shard's size, sha256 or records has the wrong type")
        elif "parts" in m and not (isinstance(parts, dict) and _is_count(parts.get("chunks"))
                                   and _is_count(parts.get("chunk_size"))):
            self.violate("the manifest's parts is not {chunks, chunk_size}")

    def _shard(self, p: int) -> tuple[bytes | None, str | None]:
        """Shard ``p``'s bytes, or why its records must not be read."""
        parts = self.manifest["parts"]
        if p >= len(parts):
            return None, "its part is not in the pack"
        name, size = parts[p]["name"], parts[p].get("size")
        if not name or "/" in name or "\\" in name or name.startswith("."):
            return None, "its shard's name is not a plain file name"
        path = self.pack / name
        if not path.is_file():
            return None, "its shard is missing"
        data = path.read_bytes()
        if type(size) is not int or size != len(data):
            return None, "its shard's size is not the manifest's"
        if len(data) < SHARD_HEADER.size or SHARD_HEADER.unpack_from(data)[:3] != (b"PLSD", 1, p):
            return None, "its shard's header is wrong (magic, version or part)"
        return data, None

    def _part(self, p: int, parts: Any) -> tuple[bytes | None, str | None]:
        """Part ``p``'s bytes, or why none of its records may be read."""
        cache = self._cache
        if p not in cache:
            if self.backend == "shards":
                cache[p] = self._shard(p)
            else:  # the manifest's chunk count is checked with the other counts (_parts_meaning)
                cache[p] = (parts[p], None) if p in parts else (None, "its part is not in the pack")
        return cache[p]

    def _record(self, i: int, e: dict[str, Any], paths: bytes, parts: Any) -> RefRecord:
        po, pl = e["path_offset"], e["path_len"]
        rec = RefRecord(e["part"], e["label"], e["format"], e["width"], e["height"],
                        paths[po : po + pl] if po + pl <= len(paths) else None)
        labels_ok = -1 <= rec.label < max(1, len(self.classes)) and (self.classes or rec.label == -1)
        data, problem = self._part(rec.part, parts)
        rules = [
            (max(e["payload_offset"], e["payload_len"], e["record_offset"], e["path_offset"]) >= VALUE_LIMIT,
             "an offset or length of its entry is not below 2^62"),
            (e["orientation"] > MAX_ORIENTATION, "its orientation is above 8"),
            (rec.path is None, "its path lies outside the paths blob"),
            (rec.fmt >= FORMAT_CODES, "its payload format code is undefined"),
            (e["payload_offset"] != e["record_offset"] + HEAD + pl,
             "its offsets disagree (payload != record + 56 + path)"),
            (not labels_ok, "its label is outside the manifest's classes"),
            (rec.fmt == 0 and e["payload_len"] != rec.width * rec.height * 3,
             "its raw length is not width*height*3"),
            (self.encoding == "raw" and rec.fmt != 0, "it is not raw pixels in a raw pack"),
            (problem is not None, problem or ""),
            (data is not None and e["payload_offset"] + e["payload_len"] > len(data),
             "its payload runs past the end of its part"),
        ]
        rec.bad = next((why for broken, why in rules if broken), None)
        if data is not None and e["payload_offset"] + e["payload_len"] <= len(data):
            rec.payload = bytes(data[e["payload_offset"] : e["payload_offset"] + e["payload_len"]])
            rec.crc_ok = zlib.crc32(rec.payload) == e["payload_crc32"]
        if data is not None:
            rec.header = self._header(i, e, data, rec.path)
            if rec.header:
                self.violate(f"a record header {rec.header}", f"record {i}")
        return rec

    @staticmethod
    def _header(i: int, e: dict[str, Any], part: bytes, path: bytes | None) -> str | None:
        """What record ``i``'s header (in ``part``, where its entry says) disagrees with, or None."""
        at = e["record_offset"]
        if at + HEAD > len(part):
            return "runs past the end of its part"
        fields = RECORD_HEADER.unpack_from(part, at)
        magic, crc, record, length, payload_crc, label = fields[:6]
        width, height, path_len, fmt, orientation, mode = fields[6:12]
        stored = part[at + HEAD : at + HEAD + path_len]
        rules = [
            (magic != b"PLR1", "has a wrong magic"),
            (at + HEAD + path_len > len(part), "has a path running past the end of its part"),
            (zlib.crc32(stored, zlib.crc32(part[at + 8 : at + HEAD])) != crc, "fails its CRC"),
            (record != i, "has another record number"),
            ((length, payload_crc, label, path_len) != (e["payload_len"], e["payload_crc32"], e["label"],
                                                         e["path_len"]),
             "disagrees with its index entry (length, CRC, label or path length)"),
            (stored != path, "has another path than the index"),
            (fmt >= FORMAT_CODES, "has an undefined format code"),
            # the entry's width, height, format, orientation and mode are "as in the record header"
            ((width, height, fmt, orientation, mode)
             != (e["width"], e["height"], e["format"], e["orientation"], e["mode"]),
             "disagrees with its index entry (size, format, orientation or mode)"),
        ]
        return next((why for broken, why in rules if broken), None)

    def _meaning(self, m: dict[str, Any], entries: list[dict[str, Any]], paths: bytes, index: bytes,
                 parts: Any) -> None:
        """Rules beyond what a reader must refuse: checksums, counts, the paths blob, encodings."""
        info = m.get("index")
        if isinstance(info, dict):
            self.index_sha_ok = info.get("sha256") == hashlib.sha256(index).hexdigest()
            if not self.index_sha_ok:
                self.violate("the index fails the manifest's sha256")
            if info.get("size") != len(index):
                self.violate("the index's size is not the manifest's")
        else:
            self.violate("the manifest has no index sha256")
        labels = [e["label"] for e in entries]
        if isinstance(m.get("class_counts"), dict) and m["class_counts"] != {
                c: labels.count(k) for k, c in enumerate(self.classes)}:
            self.violate("class_counts disagree with the labels")
        if _is_count(m.get("payload_bytes")) and m["payload_bytes"] != sum(e["payload_len"] for e in entries):
            self.violate("payload_bytes disagrees with the index")
        source = m.get("source")
        skipped = m["skipped_count"] if _is_count(m.get("skipped_count")) else len(m["skipped"])
        if isinstance(source, dict) and "files" in source and source["files"] != len(entries) + skipped:
            self.violate("source files disagree with the records and skipped files")
        if _is_count(m.get("skipped_count")) and m["skipped_count"] < len(m["skipped"]):
            self.violate("skipped_count is less than the skipped files listed")
        if m.get("labelled") is False and any(label != -1 for label in labels):
            self.violate("an unlabelled pack has labels")
        self._paths_blob(entries, paths)
        self._parts_meaning(m, entries, parts)
        wanted = {"jpeg": 1, "png": 2}.get(self.encoding)
        if any(e["format"] != wanted if wanted else self.encoding == "keep" and e["format"] == 0
               for e in entries):
            self.violate("a record's format is not the manifest's encoding")

    def _paths_blob(self, entries: list[dict[str, Any]], paths: bytes) -> None:
        offset = 0
        for i, (e, rec) in enumerate(zip(entries, self.records, strict=True)):
            if e["path_offset"] != offset:
                self.violate("the paths blob is not the paths in record order", f"record {i}")
                return
            offset += e["path_len"]
            if rec.path is not None and rec.text_path is None:
                self.violate("a path is not UTF-8", f"record {i}")
        if offset != len(paths):
            self.violate("the paths blob holds more than the paths")

    def _parts_meaning(self, m: dict[str, Any], entries: list[dict[str, Any]], parts: Any) -> None:
        counts: dict[int, int] = {}
        for e in entries:
            counts[e["part"]] = counts.get(e["part"], 0) + 1
        if self.backend == "shards":
            for p, part in enumerate(m["parts"]):
                data, problem = self._part(p, parts)
                if problem:
                    self.violate(f"a shard: {problem.removeprefix('its ')}", part["name"])
                elif part.get("sha256") != hashlib.sha256(data).hexdigest():
                    self.violate("a shard fails the manifest's sha256", part["name"])
                if "records" in part and part["records"] != counts.get(p, 0):
                    self.violate("a shard's record count disagrees with the index", part["name"])
            return
        if sorted(parts) != list(range(len(parts))):
            self.violate("the LMDB chunks are not numbered 0..n-1")
        info = m.get("parts")
        if isinstance(info, dict) and info.get("chunks") != len(parts):
            self.violate("the manifest's chunk count is not the pack's")
        if isinstance(info, dict) and type(info.get("chunks")) is int and any(e["part"] >= info["chunks"]
                                                                              for e in entries):
            self.violate("an entry's chunk is past the manifest's chunk count")
