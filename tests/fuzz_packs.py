"""Field-by-field fuzzing of the read side with hostile packs written from docs/FORMAT.md alone.

An attacker who knows the format takes an intact pack, sets one field (of the index header, an
index entry, a record header, a shard header or the manifest) to an edge value, recomputes every
checksum that would give the change away (the record header's CRC, the entry's payload CRC when the
entry now names other bytes, and the index and shard sha256 in the manifest), and points every read
path at the result. Each case also runs once without that recomputation.

Every read path runs in a worker process: a fork of a server that imported torch once, so that a
worker that dies (a signal) or hangs is replaced in milliseconds, and each pack gets a fresh one
(what one pack's probes leave in a worker never weighs on the next's). A worker's address space is
capped at the server's size plus ``MEMORY_HEADROOM``, and each probe has a wall-time cap. What a
read path returns is compared with ``Reference``, a reader written here from the format document
(plain slicing of the files' bytes, arbitrary-precision arithmetic). A probe fails on a signal, a
hang, an absurd allocation, an exception that is not packload's own (``PackloadError``), or data
that is not what the pack says.

``tests/test_fuzz_pack_fields.py`` runs a representative subset; ``benchmarks/reliability.py --only
fuzz`` and ``pytest -m slow tests/test_fuzz_pack_fields.py`` run the whole grid.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import os
import re
import resource
import select
import shutil
import signal
import struct
import subprocess
import sys
import sysconfig
import time
import traceback
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tests import reliability_tools as rt

REPO = Path(__file__).resolve().parents[1]
BACKENDS = ("lmdb", "shards")
PAYLOADS = ("keep", "raw")  # JPEG and PNG files as they were, and raw pixels of one size
RAW_SIZE = (40, 48)  # (height, width) of the raw images: two per LMDB chunk, their crop through the kernel
PER_CLASS = 4  # images per class in the base packs (3 classes), and one large PNG: several shards
CROP = 24
BATCH = 8
PROBE_TIMEOUT = 60.0  # seconds a probe may take before it counts as a hang
MEMORY_HEADROOM = rt.MEMORY_HEADROOM  # a worker may allocate this much beyond its size at start
BIG_MANIFEST_FULL = 300 << 20  # the manifest a reader must refuse by its size alone
BIG_MANIFEST_QUICK = 8 << 20  # the same, scaled down for CI
LONG_STRING = 1 << 20  # characters of the "very long string" JSON value
# The reader's manifest size limit: the workers lower it to half the big case's size (when that is
# lower), so that a scaled-down case tests the same refusal as a real 300 MB manifest.
MANIFEST_LIMIT_HOOK = ("packload.core.format", "MANIFEST_LIMIT")
DOC_MANIFEST_LIMIT = 64 << 20  # docs/FORMAT.md: a reader refuses a larger manifest before parsing it
VALUE_LIMIT = 2**62  # docs/FORMAT.md: every index offset and length is below this
MAX_ORIENTATION = 8
RECYCLE = 3  # a worker's exit status asking the server for a fresh worker (not a death)

# -- the format, as docs/FORMAT.md gives it (no import of packload.core.format) ------------------------------

INDEX_HEADER = struct.Struct("<4sIQIIQ")
INDEX_ENTRY = struct.Struct("<IiQQQIIIQHBB8s")
RECORD_HEADER = struct.Struct("<4sIQQIiIIHBB8sI")
SHARD_HEADER = struct.Struct("<4sIII")
HEAD = RECORD_HEADER.size
FORMAT_CODES = 9  # 0 raw, 1 JPEG, ... 8 other
ENCODINGS = ("keep", "jpeg", "png", "raw")
_KINDS = {"I": "u32", "i": "i32", "Q": "u64", "H": "u16", "B": "u8"}
_SIZES = {"u8": (1, False), "u16": (2, False), "u32": (4, False), "u64": (8, False), "i32": (4, True)}


def _layout(fmt: str, names: str) -> dict[str, tuple[int, str]]:
    """Each field's (offset, kind) in a struct format, kinds as the format document names them."""
    out, offset = {}, 0
    for (count, code), name in zip(re.findall(r"(\d*)([A-Za-z])", fmt[1:]), names.split(), strict=True):
        out[name] = (offset, f"char{count}" if code == "s" else _KINDS[code])
        offset += struct.calcsize("<" + count + code)
    return out


INDEX_HEADER_FIELDS = _layout(INDEX_HEADER.format, "magic version count entry_size reserved paths_len")
ENTRY_FIELDS = _layout(INDEX_ENTRY.format, "part label payload_offset payload_len record_offset "
                       "payload_crc32 width height path_offset path_len format orientation mode")
RECORD_FIELDS = _layout(RECORD_HEADER.format, "magic header_crc32 record payload_len payload_crc32 label "
                        "width height path_len format orientation mode reserved")
SHARD_FIELDS = _layout(SHARD_HEADER.format, "magic version part reserved")


def _put(buf: bytearray, at: int, kind: str, value: int | bytes) -> None:
    if kind.startswith("char"):
        size = int(kind[4:])
        buf[at : at + size] = bytes(value).ljust(size, b"\0")[:size]
    else:
        size, signed = _SIZES[kind]
        buf[at : at + size] = int(value).to_bytes(size, "little", signed=signed)


def chunk_key(part: int) -> bytes:
    return b"c" + part.to_bytes(8, "big")


def manifest_bytes(manifest: Any) -> bytes:
    """JSON as the packer writes it (sorted keys, one-space indent, trailing newline)."""
    return (json.dumps(manifest, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


# -- base packs and the in-memory model an attacker edits ----------------------------------------------


def make_bases(root: Path) -> dict[tuple[str, str], Path]:
    """The intact packs every case starts from: (backend, payload) → path. Each holds 13 records of 3
    classes in several parts (64 KiB shards, 16 KiB LMDB chunks); ``keep`` holds JPEGs and PNGs of a
    few sizes (one large PNG), ``raw`` pixels of one size."""
    from packload import pack
    from packload.packer.encode import EncodeOptions

    source = rt.make_source(root / "src", per_class=PER_CLASS, big=1)
    out = {}
    with rt.small_chunks():
        for payload in PAYLOADS:
            options = EncodeOptions(encoding="raw", size=RAW_SIZE) if payload == "raw" else None
            for backend in BACKENDS:
                dst = root / f"base-{payload}.{backend}"
                pack(source, dst, backend=backend, options=options, workers=1, progress=False,
                     shard_size=rt.SHARD_SIZE)
                out[(backend, payload)] = dst
    return out


def read_lmdb(pack: Path) -> dict[bytes, bytes]:
    """Every key and value of an LMDB file."""
    import lmdb

    env = lmdb.open(str(pack), subdir=False, readonly=True, lock=False, max_readers=1)
    try:
        with env.begin() as txn:
            return {bytes(k): bytes(v) for k, v in txn.cursor()}
    finally:
        env.close()


@dataclass
class Model:
    """A pack's bytes held in memory to be edited: manifest (JSON data, or raw bytes for cases that
    are not JSON), index, and parts (shard files with their header, or LMDB chunk values)."""

    backend: str
    manifest: Any
    index: bytearray
    parts: list[bytearray]
    names: list[str]  # the shard files' names on disk, in part order (shards)

    @classmethod
    def load(cls, pack: Path) -> Model:
        if pack.is_dir():
            manifest = json.loads((pack / "manifest.json").read_bytes())
            names = [part["name"] for part in manifest["parts"]]
            parts = [bytearray((pack / name).read_bytes()) for name in names]
            return cls("shards", manifest, bytearray((pack / "index.bin").read_bytes()), parts, names)
        values = read_lmdb(pack)
        chunks = [bytearray(values[chunk_key(p)]) for p in range(len(values)) if chunk_key(p) in values]
        return cls("lmdb", json.loads(values[b"#manifest"]), bytearray(values[b"#index"]), chunks, [])

    def copy(self) -> Model:
        return Model(self.backend, copy.deepcopy(self.manifest), bytearray(self.index),
                     [bytearray(p) for p in self.parts], list(self.names))

    def write(self, dst: Path) -> Path:
        raw = self.manifest if isinstance(self.manifest, bytes) else manifest_bytes(self.manifest)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if self.backend == "shards":
            dst.mkdir(parents=True)
            for name, data in zip(self.names, self.parts, strict=True):
                (dst / name).write_bytes(data)
            (dst / "index.bin").write_bytes(self.index)
            (dst / "manifest.json").write_bytes(raw)
            return dst
        import lmdb

        values = {b"#manifest": raw, b"#index": bytes(self.index)}
        values.update({chunk_key(p): bytes(data) for p, data in enumerate(self.parts)})
        size = sum(len(v) for v in values.values())
        env = lmdb.open(str(dst), subdir=False, map_size=2 * size + (16 << 20), lock=False, sync=False,
                        metasync=False)
        try:
            with env.begin(write=True) as txn:
                for key, value in values.items():
                    txn.put(key, value)
        finally:
            env.close()
        return dst

    def digest(self) -> str:
        raw = self.manifest if isinstance(self.manifest, bytes) else manifest_bytes(self.manifest)
        h = hashlib.sha256(raw)
        for blob in (self.index, *self.parts):
            h.update(len(blob).to_bytes(8, "little") + blob)
        return h.hexdigest()

    # -- fields --------------------------------------------------------------------------------
    @property
    def count(self) -> int:
        return int.from_bytes(self.index[8:16], "little")

    def entry(self, i: int) -> dict[str, Any]:
        at = INDEX_HEADER.size + INDEX_ENTRY.size * i
        return dict(zip(ENTRY_FIELDS, INDEX_ENTRY.unpack_from(self.index, at), strict=True))

    def set_entry(self, i: int, **values: Any) -> None:
        at = INDEX_HEADER.size + INDEX_ENTRY.size * i
        for name, value in values.items():
            offset, kind = ENTRY_FIELDS[name]
            _put(self.index, at + offset, kind, value)

    def set_index_header(self, **values: Any) -> None:
        for name, value in values.items():
            offset, kind = INDEX_HEADER_FIELDS[name]
            _put(self.index, offset, kind, value)

    def paths_at(self) -> int:
        """Where the paths blob starts (for the count the index had when loaded)."""
        return INDEX_HEADER.size + INDEX_ENTRY.size * self.count

    def path(self, i: int) -> bytes:
        e = self.entry(i)
        start = self.paths_at() + e["path_offset"]
        return bytes(self.index[start : start + e["path_len"]])

    def set_record(self, i: int, **values: Any) -> None:
        """Set fields of record ``i``'s header, found where its (intact) index entry says."""
        e = self.entry(i)
        for name, value in values.items():
            offset, kind = RECORD_FIELDS[name]
            _put(self.parts[e["part"]], e["record_offset"] + offset, kind, value)

    def fix_header_crc(self, i: int) -> None:
        """Recompute record ``i``'s header CRC over its header and the path its header's path_len says."""
        e = self.entry(i)
        part, at = self.parts[e["part"]], e["record_offset"]
        path_len = int.from_bytes(part[at + 40 : at + 42], "little")
        crc = zlib.crc32(part[at + HEAD : at + HEAD + path_len], zlib.crc32(part[at + 8 : at + HEAD]))
        part[at + 4 : at + 8] = crc.to_bytes(4, "little")

    def fix_entry_crc(self, i: int) -> None:
        """Make entry ``i``'s payload_crc32 that of the bytes it now names (when they exist)."""
        e = self.entry(i)
        start, end = e["payload_offset"], e["payload_offset"] + e["payload_len"]
        if e["part"] < len(self.parts) and end <= len(self.parts[e["part"]]):
            span = self.parts[e["part"]][start:end]
            self.set_entry(i, payload_crc32=zlib.crc32(span))

    def seal(self) -> None:
        """Recompute the manifest's index sha256 and size, and each shard's sha256 and size."""
        manifest = self.manifest
        if not isinstance(manifest, dict):
            return
        index = manifest.get("index")
        if isinstance(index, dict):
            index.update(sha256=hashlib.sha256(self.index).hexdigest(), size=len(self.index))
        parts = manifest.get("parts")
        if self.backend == "shards" and isinstance(parts, list):
            files = dict(zip(self.names, self.parts, strict=True))
            for part in parts:
                if isinstance(part, dict) and isinstance(part.get("name"), str) and part["name"] in files:
                    data = files[part["name"]]
                    part.update(sha256=hashlib.sha256(data).hexdigest(), size=len(data))


# -- the cases ---------------------------------------------------------------------------------------

Apply = Callable[[Model, bool], None]
GROUPS = ("index header", "index entry", "record header", "record path", "shard header", "manifest")


@dataclass(frozen=True)
class Case:
    """One hostile change: ``apply(model, recompute)`` edits a copy of an intact pack."""

    group: str
    field: str
    value: str
    apply: Apply
    sealed: bool = True  # checksums can be recomputed after it (the manifest has none: run once)
    quick: bool = False  # in the CI subset
    paths: tuple[str, ...] | None = None  # the read paths worth probing (None: all)

    @property
    def name(self) -> str:
        return f"{self.group}: {self.field} = {self.value}"


def _case(group: str, field_name: str, value: str, change: Callable[[Model], None],
          fix: Callable[[Model], None] | None = None, quick: bool = False) -> Case:
    """A case that ``change``s the pack; recomputing runs ``fix`` (record CRCs), then ``Model.seal``."""
    def apply(model: Model, recompute: bool) -> None:
        change(model)
        if recompute:
            if fix is not None:
                fix(model)
            model.seal()
    return Case(group, field_name, value, apply, quick=quick)


def int_values(kind: str) -> list[tuple[str, int]]:
    """0, 1, the type's maximum, 2^31, 2^32, 2^63, 2^64-1 where they fit; -1 and the minimum if signed."""
    size, signed = _SIZES[kind]
    bits = 8 * size
    if signed:
        return [("0", 0), ("1", 1), ("-1", -1), ("max", 2 ** (bits - 1) - 1), ("min", -(2 ** (bits - 1)))]
    top = 2**bits - 1
    powers = [(f"2^{e}", 2**e) for e in (31, 32, 63) if 2**e < top]
    return [("0", 0), ("1", 1), *powers, ("2^64-1" if bits == 64 else "max", top)]


_QUICK_GENERIC = {"u64": "2^63", "u32": "max", "u16": "max", "u8": "max", "i32": "min"}
_CHAR_VALUES = {"char4": [("zeros", b"\0" * 4), ("0xff", b"\xff" * 4)],
                "char8": [("empty", b""), ("0xff", b"\xff" * 8), ("CMYK", b"CMYK"), ("L", b"L"), ("P", b"P"),
                          ("RGBA", b"RGBA"), ("I;16", b"I;16")]}


def _fits(kind: str, value: int) -> bool:
    size, signed = _SIZES[kind]
    bits = 8 * size
    return -(2 ** (bits - 1)) <= value < 2 ** (bits - 1) if signed else 0 <= value < 2**bits


def _entry_fits(values: dict[str, int]) -> bool:
    return all(_fits(ENTRY_FIELDS[name][1], value) for name, value in values.items())


def _values(kind: str, contextual: list[tuple[str, Any]]) -> list[tuple[str, Any, bool]]:
    """(label, value, in the CI subset) for a field: the generic values of its type, then the
    field's own; the subset takes one generic value and the first of the field's own."""
    generic = _CHAR_VALUES[kind] if kind.startswith("char") else int_values(kind)
    if not kind.startswith("char"):  # a contextual value the type cannot hold (a length - 1 of 0) is left out
        contextual = [(label, value) for label, value in contextual if _fits(kind, value)]
    pick = _QUICK_GENERIC.get(kind, generic[0][0])
    out = [(label, value, label == pick) for label, value in generic]
    out += [(label, value, k == 0) for k, (label, value) in enumerate(contextual)]
    seen: set[str] = set()
    return [v for v in out if not (v[0] in seen or seen.add(v[0]))]


@dataclass
class _Plan:
    """Facts of an intact base pack that contextual values are made of."""

    model: Model
    target: int  # the record whose entry and header the cases change
    neighbour: int  # another record in the same part
    other: int  # a record in another part
    classes: int

    @classmethod
    def of(cls, model: Model) -> _Plan:
        count = model.count

        def neighbour_of(i: int) -> int | None:
            part = model.entry(i)["part"]
            same = [j for j in (i - 1, i + 1) if 0 <= j < count and model.entry(j)["part"] == part]
            return same[0] if same else None

        # a JPEG where there is one (libjpeg-turbo and the resize kernel read it), a neighbour in its part
        middle = [i for i in range(count // 2, count) if neighbour_of(i) is not None]
        target = next((i for i in middle if model.path(i).endswith(b".jpg")), middle[0])
        part = model.entry(target)["part"]
        neighbour = neighbour_of(target)
        assert neighbour is not None
        other = next(i for i in range(count) if model.entry(i)["part"] != part)
        return cls(model, target, neighbour, other, len(model.manifest["classes"]))

    def part_size(self, i: int) -> int:
        return len(self.model.parts[self.model.entry(i)["part"]])


def index_header_cases(plan: _Plan) -> list[Case]:
    base = plan.model
    count = base.count
    paths_len = int.from_bytes(base.index[24:32], "little")
    contextual: dict[str, list[tuple[str, Any]]] = {
        "magic": [("PLIY", b"PLIY"), ("a record's magic PLR1", b"PLR1")],
        "version": [("2", 2)],
        "count": [("count-1", count - 1), ("count+1", count + 1), ("count+2^58 (64*count wraps to the size)",
                                                                   count + 2**58)],
        "entry_size": [("65", 65), ("63", 63), ("128", 128)],
        "reserved": [],
        "paths_len": [("paths_len+1", paths_len + 1), ("paths_len-1", paths_len - 1)],
    }
    cases = []
    for name, (_, kind) in INDEX_HEADER_FIELDS.items():
        for label, value, quick in _values(kind, contextual[name]):
            cases.append(_case("index header", name, label,
                               lambda m, n=name, v=value: m.set_index_header(**{n: v}), quick=quick))

    def shorter(model: Model, records: bool) -> None:
        model.set_index_header(count=count - 1, paths_len=paths_len + INDEX_ENTRY.size)
        if records:
            model.manifest["records"] = count - 1

    cases.append(_case("index header", "count and paths_len", "count-1, paths_len+64 (last entry as paths)",
                       lambda m: shorter(m, False), quick=True))
    cases.append(_case("index header", "count and paths_len", "count-1, paths_len+64, manifest records-1",
                       lambda m: shorter(m, True)))
    return cases


def index_entry_cases(plan: _Plan, payload: str) -> list[Case]:
    base, r = plan.model, plan.target
    e = base.entry(r)
    part_size = plan.part_size(r)
    parts = len(base.parts)
    paths_len = int.from_bytes(base.index[24:32], "little")
    contextual: dict[str, list[tuple[str, Any]]] = {
        "part": [("number of parts (just past)", parts), ("another part", base.entry(plan.other)["part"])],
        "label": [("number of classes (just past)", plan.classes), ("-2", -2),
                  ("last class", plan.classes - 1)],
        "payload_offset": [("part size (at the end)", part_size),
                           ("part size - payload_len + 1 (just past)", part_size - e["payload_len"] + 1),
                           ("+1", e["payload_offset"] + 1)],
        "payload_len": [("to the end of the part + 1 (just past)", part_size - e["payload_offset"] + 1),
                        ("to the end of the part", part_size - e["payload_offset"]),
                        ("+1", e["payload_len"] + 1), ("-1", e["payload_len"] - 1)],
        "record_offset": [("+1", e["record_offset"] + 1), ("part size", part_size)],
        "payload_crc32": [("flipped bit", e["payload_crc32"] ^ 1)],
        "width": [("+1", e["width"] + 1), ("x2", e["width"] * 2)],
        "height": [("+1", e["height"] + 1), ("2^16", 2**16)],
        "path_offset": [("paths_len (at the end)", paths_len),
                        ("paths_len - path_len + 1 (just past)", paths_len - e["path_len"] + 1),
                        ("another record's path", base.entry(plan.neighbour)["path_offset"])],
        "path_len": [("+1", e["path_len"] + 1), ("-1", e["path_len"] - 1)],
        "format": [("9 (first undefined)", 9), ("0 raw", 0), ("1 JPEG", 1), ("2 PNG", 2), ("8 other", 8),
                   ("7 MPO", 7)],
        "orientation": [("9", 9), ("6", 6)],
        "mode": [],
    }
    located = ("part", "payload_offset", "payload_len")  # fields that change the bytes named: CRC recomputed

    cases = []
    for name, (_, kind) in ENTRY_FIELDS.items():
        for label, value, quick in _values(kind, contextual[name]):
            fix = (lambda m: m.fix_entry_crc(r)) if name in located else None
            cases.append(_case("index entry", name, label,
                               lambda m, n=name, v=value: m.set_entry(r, **{n: v}), fix, quick=quick))
    return cases + _location_cases(plan, payload)


def _location_cases(plan: _Plan, payload: str) -> list[Case]:
    """Entries moved whole, offsets kept consistent (payload = record + 56 + path), CRC recomputed:
    overlapping records, payloads at or past the part's end, raw sizes that agree with the length."""
    base, r = plan.model, plan.target
    e, j, o = base.entry(r), base.entry(plan.neighbour), base.entry(plan.other)
    size = plan.part_size(r)
    pl = e["path_len"]

    # a header far enough into the part for the offsets to stay consistent; a payload start in another part
    header = next((x["record_offset"] for x in (j, e) if x["record_offset"] >= HEAD + pl), e["record_offset"])
    into = max(o["payload_offset"], HEAD + pl)

    def at(payload_offset: int, length: int, part: int | None = None) -> dict[str, int]:
        moved = {"payload_offset": payload_offset, "record_offset": payload_offset - HEAD - pl,
                 "payload_len": length}
        return moved if part is None else dict(moved, part=part)

    moves: dict[str, dict[str, int]] = {
        "empty payload at the very end of the part": at(size, 0),
        "one byte past the end of the part": at(size, 1),
        "2^63": at(2**63 + HEAD + pl, e["payload_len"]),
        "2^64-1 long from offset 1": {"payload_offset": HEAD + pl + 1, "record_offset": 1,
                                      "payload_len": 2**64 - 1},
        "record at 2^64-1, payload wrapped to 55+path_len": {"record_offset": 2**64 - 1,
                                                             "payload_offset": HEAD - 1 + pl},
        "the same payload as a neighbour": at(j["payload_offset"], j["payload_len"]),
        "inside a neighbour's payload": at(j["payload_offset"] + 7,
                                           min(e["payload_len"], j["payload_len"] - 7)),
        "a record header as payload (a neighbour's, or its own)": at(header, HEAD),
        "a record in another part": {**at(into, o["payload_len"] - (into - o["payload_offset"]), o["part"]),
                                     "width": o["width"], "height": o["height"]},
    }
    cases = [_case("index entry", "location (consistent)", label, lambda m, v=values: m.set_entry(r, **v),
                   lambda m: m.fix_entry_crc(r), quick=k in (0, 5))
             for k, (label, values) in enumerate(moves.items()) if _entry_fits(values)]
    if payload == "raw":
        w, h = e["width"], e["height"]
        sizes = {
            "width and height swapped": {"width": h, "height": w},
            "0x0, empty payload": {"width": 0, "height": 0, **at(e["payload_offset"], 0)},
            "1 row of width*height": {"width": w * h, "height": 1},
            "2^16 x 2^16 (length 3*2^32)": {"width": 2**16, "height": 2**16, "payload_len": 3 * 2**32},
            "(2^32-1)^2, length wrapped mod 2^64": {"width": 2**32 - 1, "height": 2**32 - 1,
                                                         "payload_len": 3 * (2**32 - 1) ** 2 % 2**64},
        }
        cases += [_case("index entry", "raw size (consistent)", label,
                        lambda m, v=values: m.set_entry(r, **v), lambda m: m.fix_entry_crc(r),
                        quick=k in (1, 3))
                  for k, (label, values) in enumerate(sizes.items()) if _entry_fits(values)]
    return cases


def record_header_cases(plan: _Plan) -> list[Case]:
    base, r = plan.model, plan.target
    e = base.entry(r)
    contextual: dict[str, list[tuple[str, Any]]] = {
        "magic": [("PLR2", b"PLR2"), ("a shard's magic PLSD", b"PLSD")],
        "header_crc32": [("flipped bit", 0)],  # set below: the intact CRC with one bit flipped
        "record": [("another record's number", plan.neighbour)],
        "payload_len": [("+1", e["payload_len"] + 1), ("to the end of the part + 1",
                                                       plan.part_size(r) - e["payload_offset"] + 1)],
        "payload_crc32": [("flipped bit", e["payload_crc32"] ^ 1)],
        "label": [("number of classes", plan.classes)],
        "width": [("+1", e["width"] + 1)],
        "height": [("+1", e["height"] + 1)],
        "path_len": [("+1", e["path_len"] + 1), ("-1", e["path_len"] - 1)],
        "format": [("9 (first undefined)", 9), ("another format", 1 if e["format"] != 1 else 2)],
        "orientation": [("9", 9)],
        "mode": [],
        "reserved": [],
    }
    part = base.parts[e["part"]]
    intact_crc = int.from_bytes(part[e["record_offset"] + 4 : e["record_offset"] + 8], "little")
    contextual["header_crc32"] = [("flipped bit", intact_crc ^ 1)]
    cases = []
    for name, (_, kind) in RECORD_FIELDS.items():
        fix = None if name == "header_crc32" else (lambda m: m.fix_header_crc(r))
        for label, value, quick in _values(kind, contextual[name]):
            cases.append(_case("record header", name, label,
                               lambda m, n=name, v=value: m.set_record(r, **{n: v}), fix, quick=quick))
    return cases


def record_path_cases(plan: _Plan) -> list[Case]:
    """Paths a hostile packer would store (same length as the real one, so no offset moves): in the
    index's paths blob and the record header together, or in the header alone."""
    base, r = plan.model, plan.target
    path = base.path(r)
    hostile = {
        "../ escape": b"../" + path[3:],
        "absolute (into /tmp)": b"/tmp/" + path[5:],
        "NUL byte": path[:-1] + b"\0",
        "backslash": path[:1] + b"\\" + path[2:],
        "not UTF-8": b"\xff" + path[1:],
        "./ component": b"./" + path[2:],
        "another record's path": base.path(plan.neighbour),
    }
    e = base.entry(r)

    def write(model: Model, value: bytes, index: bool) -> None:
        if index:
            start = model.paths_at() + e["path_offset"]
            model.index[start : start + len(value)] = value
        at = e["record_offset"] + HEAD
        model.parts[e["part"]][at : at + len(value)] = value

    cases = []
    for k, (label, value) in enumerate(hostile.items()):
        if len(value) != len(path) or value == path:
            continue
        for index in (True, False):
            where = "index and header" if index else "header only"
            quick = (k == 0 and index) or (k == 4 and not index)
            cases.append(_case("record path", where, label, lambda m, v=value, x=index: write(m, v, x),
                               lambda m: m.fix_header_crc(r), quick=quick))
    return cases


def shard_header_cases(plan: _Plan) -> list[Case]:
    base = plan.model
    part = base.entry(plan.target)["part"]
    contextual: dict[str, list[tuple[str, Any]]] = {
        "magic": [("a record's magic PLR1", b"PLR1"), ("PLSE", b"PLSE")],
        "version": [("2", 2)],
        "part": [("another part", base.entry(plan.other)["part"]), ("number of parts", len(base.parts))],
        "reserved": [],
    }
    cases = []
    for name, (offset, kind) in SHARD_FIELDS.items():
        for label, value, quick in _values(kind, contextual[name]):
            cases.append(_case("shard header", name, label,
                               lambda m, o=offset, k=kind, v=value: _put(m.parts[part], o, k, v),
                               quick=quick))
    return cases


MISSING = object()  # a manifest value: delete the key


def _json_values() -> list[tuple[str, Any]]:
    """Values of every JSON type for a manifest key: integers at the edges, strings for ints,
    floats, nesting, null, booleans, a very long string, the key missing."""
    return [("0", 0), ("1", 1), ("-1", -1), ("2^31", 2**31), ("2^32", 2**32), ("2^63", 2**63),
            ("2^64-1", 2**64 - 1), ("2^64", 2**64), ("-2^63", -(2**63)), ("string of digits", "12"),
            ("float", 1.5), ("nested lists", [[[[1]]]]), ("null", None), ("true", True), ("empty object", {}),
            ("empty list", []), ("very long string", "x" * LONG_STRING), ("missing", MISSING)]


def _set(data: Any, keys: tuple[Any, ...], value: Any) -> Any:
    """``data`` with the value at ``keys`` (dict keys and list indices) replaced (MISSING: deleted)."""
    data = copy.deepcopy(data)
    holder = data
    for key in keys[:-1]:
        holder = holder[key]
    if value is MISSING:  # a key the pack does not have: nothing changes (the campaign skips it)
        holder.pop(keys[-1], None)
    else:
        holder[keys[-1]] = value
    return data


def _manifest_case(field_name: str, label: str, keys: tuple[Any, ...], value: Any,
                   quick: bool = False) -> Case:
    def apply(model: Model, recompute: bool) -> None:
        model.manifest = _set(model.manifest, keys, value)
    return Case("manifest", field_name, label, apply, sealed=False, quick=quick)


def _raw_manifest_case(label: str, make: Callable[[dict[str, Any]], bytes], quick: bool = False,
                       field_name: str = "manifest bytes", paths: tuple[str, ...] | None = None) -> Case:
    def apply(model: Model, recompute: bool) -> None:
        model.manifest = make(model.manifest)
    return Case("manifest", field_name, label, apply, sealed=False, quick=quick, paths=paths)


def _token(manifest: dict[str, Any], key: str, token: str) -> bytes:
    """The manifest's JSON with ``key``'s value replaced by a raw JSON token (NaN, a 5000-digit number...)."""
    return manifest_bytes(dict(manifest, **{key: "@@TOKEN@@"})).replace(b'"@@TOKEN@@"', token.encode())


MANIFEST_KEYS = ("format", "version", "backend", "encoding", "records", "classes", "skipped", "ignored",
                 "class_counts", "labelled", "payload_bytes", "source", "options", "parts", "index",
                 "created", "packload_version", "skipped_count", "ignored_count", "ignored_by_reason", "id")
BIG_PATHS = ("ds[i] bytes verify=False", "getitems numpy verify=True", "info", "verify")


def manifest_cases(plan: _Plan, big: int) -> list[Case]:
    base = plan.model
    m = base.manifest
    count, backend = base.count, base.backend
    classes = list(m["classes"])
    src, opt = m["source"], m["options"]
    contextual: dict[str, list[tuple[str, Any]]] = {
        "format": [("other", "other"), ("PACKLOAD", "PACKLOAD")],
        "version": [("2", 2), ("1.0 (a float)", 1.0)],
        "backend": [("the other backend", "shards" if backend == "lmdb" else "lmdb"), ("zip", "zip")],
        "encoding": [(f"{e}", e) for e in ENCODINGS if e != m["encoding"]] + [("bogus", "bogus")],
        "records": [("count-1", count - 1), ("count+1", count + 1)],
        "classes": [("one class (labels past it)", classes[:1]), ("ints", [1, 2, 3]),
                    ("10^5 classes", [f"c{k}" for k in range(10**5)]),
                    ("duplicates", [classes[0]] * len(classes)),
                    ("names with .. and /", ["../x", "/y", "z/.."])],
        "skipped": [("entry without path", [{"reason": "x"}]), ("path an int", [{"path": 1, "reason": "x"}]),
                    ("a string entry", ["x"]), ("reason an int", [{"path": "x", "reason": 1}]),
                    ("10^4 entries", [{"path": f"p{k}", "reason": "r"} for k in range(10**4)])],
        "ignored": [("entry without path", [{"reason": "x"}]), ("a string entry", ["x"])],
        "class_counts": [("a count -1", dict.fromkeys(classes, -1)),
                         ("counts as strings", dict.fromkeys(classes, "1")),
                         ("a count 2^64", dict.fromkeys(classes, 2**64)), ("unknown class", {"zzz": 1})],
        "labelled": [("false (labels are set)", False), ("a string", "yes")],
        "payload_bytes": [("sum+1", sum(base.entry(i)["payload_len"] for i in range(count)) + 1)],
        "source": [("files a string", dict(src, files="x")), ("files -1", dict(src, files=-1)),
                   ("files 2^64", dict(src, files=2**64)), ("bytes a list", dict(src, bytes=[1])),
                   ("name an int", dict(src, name=1)), ("files a float", dict(src, files=1.5))],
        "options": [("size a string", dict(opt, size="x")), ("quality a string", dict(opt, quality="x")),
                    ("size [1]", dict(opt, size=[1])), ("max_side -1", dict(opt, max_side=-1)),
                    ("encoding another", dict(opt, encoding="jpeg")),
                    ("backend an int", dict(opt, backend=1))],
        "parts": [("one part fewer", m["parts"][:-1] if backend == "shards" else dict(m["parts"], chunks=1)),
                  ("a string", "all")],
        "index": [("a list", [1])],
        "created": [("not a date", "yesterday")],
        "packload_version": [("a list", [0, 1])],
        "skipped_count": [("fewer than listed", max(0, len(m["skipped"]) - 1)),
                          ("+1", m.get("skipped_count", 0) + 1)],
        "ignored_count": [("+1", m.get("ignored_count", 0) + 1)],
        "ignored_by_reason": [("a count a string", {"hidden": "1"}), ("a count -1", {"hidden": -1})],
        "id": [("an int", 1), ("empty", "")],
    }
    cases = []
    for key in MANIFEST_KEYS:
        quick = {"string of digits", contextual[key][0][0]}
        cases += [_manifest_case(key, label, (key,), value, quick=label in quick)
                  for label, value in _json_values() + contextual[key]]
    cases += _nested_manifest_cases(plan)
    cases += _raw_manifest_cases(plan, big)
    return cases


def _nested_manifest_cases(plan: _Plan) -> list[Case]:
    """Keys inside ``parts`` and ``index``: the shard list's names, sizes, hashes and record counts, the
    chunk count, the index's name, size and sha256."""
    base = plan.model
    m = base.manifest
    index = m["index"]
    nested: list[tuple[str, tuple[Any, ...], list[tuple[str, Any]]]] = [
        ("index.sha256", ("index", "sha256"), [("zeros", "0" * 64), ("an int", 1), ("missing", MISSING)]),
        ("index.size", ("index", "size"), [("-1", -1), ("size+1", index["size"] + 1), ("2^64", 2**64),
                                           ("a string", "x"), ("0", 0)]),
        ("index.name", ("index", "name"), [("../escape", "../escape"), ("an int", 1), ("missing", MISSING)]),
    ]
    if base.backend == "shards":
        first = m["parts"][0]
        names = [p["name"] for p in m["parts"]]
        nested += [
            ("parts[0].name", ("parts", 0, "name"), [
                ("../../outside.bin", "../../outside.bin"), ("absolute /etc/hostname", "/etc/hostname"),
                (".hidden", ".shard"), ("backslash", "a\\b.bin"), ("empty", ""),
                ("another shard's", names[1]),
                ("an int", 1), ("missing", MISSING), ("not there", "shard-99999.bin")]),
            ("parts[0].size", ("parts", 0, "size"), [
                ("size+1", first["size"] + 1), ("0", 0), ("-1", -1), ("2^63", 2**63), ("2^64", 2**64),
                ("a string", "x"), ("a float", float(first["size"])), ("missing", MISSING)]),
            ("parts[0].sha256", ("parts", 0, "sha256"), [("zeros", "0" * 64), ("an int", 1),
                                                         ("missing", MISSING)]),
            ("parts[0].records", ("parts", 0, "records"), [
                ("+1", first["records"] + 1), ("-1", -1), ("2^64", 2**64), ("a string", "x"),
                ("missing", MISSING)]),
            ("parts list", ("parts",), [
                ("a part more (the last twice)", [*m["parts"], m["parts"][-1]]), ("empty", []), ("reversed",
                                                                                                 m["parts"][::-1]),
                ("an object", {"chunks": 1}), ("an int entry", [1, *m["parts"][1:]])]),
        ]
    else:
        chunks = m["parts"]["chunks"]
        nested += [
            ("parts.chunks", ("parts", "chunks"), [
                ("chunks-1", chunks - 1), ("chunks+1", chunks + 1), ("0", 0), ("-1", -1), ("2^64", 2**64),
                ("a string", "x"), ("a float", 1.5), ("missing", MISSING)]),
            ("parts.chunk_size", ("parts", "chunk_size"), [
                ("0", 0), ("-1", -1), ("2^64", 2**64), ("a string", "x"), ("missing", MISSING)]),
            ("parts object", ("parts",), [("a list", [{"name": "x"}]), ("empty", {})]),
        ]
    return [_manifest_case(name, label, keys, value, quick=k == 0)
            for name, keys, values in nested for k, (label, value) in enumerate(values)]


def _raw_manifest_cases(plan: _Plan, big: int) -> list[Case]:
    """Manifests that are not the JSON a JSON library writes: not UTF-8, truncated, other top-level
    types, a BOM, trailing bytes, nesting deeper than any parser's stack, duplicate keys, NaN and
    infinity, integers of 5000 digits, and an oversized manifest (``big`` bytes)."""
    digits = "9" * 5000

    def padded(m: dict[str, Any]) -> bytes:
        raw = manifest_bytes(m)
        return manifest_bytes(dict(m, zzz_padding="x" * max(0, big - len(raw))))

    makers: list[tuple[str, Callable[[dict[str, Any]], bytes]]] = [
        ("empty", lambda m: b""),
        ("not UTF-8", lambda m: b"\xff\xfe" + manifest_bytes(m)),
        ("truncated JSON", lambda m: manifest_bytes(m)[: len(manifest_bytes(m)) // 2]),
        ("a JSON array", lambda m: b"[]"),
        ("a JSON string", lambda m: b'"packload"'),
        ("null", lambda m: b"null"),
        ("UTF-8 BOM", lambda m: b"\xef\xbb\xbf" + manifest_bytes(m)),
        ("trailing garbage", lambda m: manifest_bytes(m) + b"garbage"),
        ("nested 10^5 deep", lambda m: _token(m, "zzz", "[" * 10**5 + "]" * 10**5)),
        ("records twice, the last wrong", lambda m: manifest_bytes(m)[:-2] + b', "records": 999}\n'),
        ("records NaN", lambda m: _token(m, "records", "NaN")),
        ("records Infinity", lambda m: _token(m, "records", "Infinity")),
        ("records 1e400", lambda m: _token(m, "records", "1e400")),
        ("records of 5000 digits", lambda m: _token(m, "records", digits)),
        ("version of 5000 digits", lambda m: _token(m, "version", digits)),
        ("a class count of 5000 digits", lambda m: _token(m, "class_counts", '{"a": ' + digits + "}")),
    ]
    quick = ("not UTF-8", "records of 5000 digits", "records NaN")
    cases = [_raw_manifest_case(label, make, quick=label in quick) for label, make in makers]
    # Refused by its size alone (the reference's limit is half of it): see MANIFEST_LIMIT_HOOK.
    cases.append(_raw_manifest_case(f"{big} bytes (padded with a long string)", padded, quick=True,
                                    field_name="manifest size", paths=BIG_PATHS))
    return cases


def build_cases(model: Model, payload: str, big: int) -> list[Case]:
    """Every case for one intact base pack."""
    plan = _Plan.of(model)
    cases = index_header_cases(plan) + index_entry_cases(plan, payload) + record_header_cases(plan)
    cases += record_path_cases(plan)
    if model.backend == "shards":
        cases += shard_header_cases(plan)
    return cases + manifest_cases(plan, big)


# -- the reference reader --------------------------------------------------------------------------------


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


# -- probes: each read path, run in a worker, judged against the reference --------------------------------

OUTPUTS = ("pil", "numpy", "tensor", "bytes")
CLI_COMMANDS = {"info": ["info"], "verify": ["verify", "--quiet"],
                "verify --decode": ["verify", "--decode", "--quiet"], "unpack": ["unpack", "--quiet"],
                "merge": ["merge", "--quiet"]}


def read_paths() -> dict[str, dict[str, Any]]:
    """Every read path a case can be probed with, by name."""
    paths: dict[str, dict[str, Any]] = {}
    for verify in (False, True):
        for output in OUTPUTS:
            for kind, name in (("item", "ds[i]"), ("items", "getitems")):
                paths[f"{name} {output} verify={verify}"] = {"kind": kind, "output": output, "verify": verify}
    paths["DataLoader numpy workers=2"] = {"kind": "dataloader", "output": "numpy", "verify": False}
    paths["PackLoader crop"] = {"kind": "packloader", "crop": CROP, "verify": False}
    paths["PackLoader crop, torch resize"] = {"kind": "packloader", "crop": CROP, "verify": False,
                                              "server": "torch"}
    for verify in (False, True):
        paths["PackLoader one size" + (" verify=True" if verify else "")] = {
            "kind": "packloader", "crop": None, "verify": verify, "raw_only": True}
    for name in CLI_COMMANDS:
        paths[name] = {"kind": "cli", "command": name}
    return paths


READ_PATHS = read_paths()
# Without recomputed checksums the damage is plain to see: the paths that check them, and two that do not.
UNSEALED_PATHS = ("ds[i] bytes verify=True", "getitems numpy verify=True", "ds[i] numpy verify=False",
                  "PackLoader crop", "verify", "unpack")


class Probe:
    """One read path against one pack: its findings (rules broken) and what it refused."""

    MAX_FINDINGS = 4

    def __init__(self, ref: Reference, spec: dict[str, Any]) -> None:
        self.ref, self.spec = ref, spec
        self.findings: list[dict[str, str]] = []
        self.refused: list[str] = []
        self.notes: list[str] = []
        self.returned = 0
        self.accepted_bad = False

    def fail(self, kind: str, cause: str, detail: str = "") -> None:
        if len(self.findings) < self.MAX_FINDINGS and not any(f["cause"] == cause for f in self.findings):
            self.findings.append({"kind": kind, "cause": cause, "detail": detail[:300]})

    def exception(self, exc: BaseException, what: str) -> None:
        """Judge an exception raised by a read path: ours (a refusal), or a failure."""
        from packload.core.errors import PackloadError

        if isinstance(exc, PackloadError):
            self.refused.append(f"{what}: {str(exc)[:200]}")
            return
        kind, cause = _classify(exc)
        first = str(exc).splitlines()[0][:240] if str(exc) else ""
        self.fail(kind, cause, f"{what}: {type(exc).__name__}: {first}")

    def opened(self, length: int, verify: bool) -> None:
        """A dataset opened: it must not have, for a pack every reader must refuse."""
        ref = self.ref
        if ref.pack_bad:
            self.accepted_bad = True
            self.fail("accepted", "opened a pack every reader must refuse", ref.pack_bad)
        elif verify and not ref.index_sha_ok:
            self.accepted_bad = True
            self.fail("accepted", "verify=True opened a pack whose index fails the manifest's sha256")
        elif length != len(ref.records):
            self.fail("wrong", "the dataset's length is not the index's count",
                      f"{length} != {len(ref.records)}")

    def allowed(self, i: int, verify: bool) -> RefRecord | None:
        """Record ``i`` as the reference has it, if a reader may return it; else a finding and None."""
        ref = self.ref
        self.returned += 1
        if ref.pack_bad or self.accepted_bad:
            if not self.accepted_bad:
                self.fail("wrong", "returned data from a pack every reader must refuse", ref.pack_bad or "")
            return None
        rec = ref.records[i]
        if rec.bad:
            self.fail("wrong", f"returned a record although {rec.bad}", f"record {i}")
            return None
        if verify and not rec.crc_ok:
            self.fail("wrong", "verify=True returned a payload that fails its CRC", f"record {i}")
            return None
        return rec

    def item(self, i: int, value: Any, label: Any, output: str, verify: bool) -> None:
        """Judge ``(value, label)`` returned for record ``i`` as ``output``."""
        rec = self.allowed(i, verify)
        if rec is None:
            return
        if int(label) != rec.label:
            self.fail("wrong", "the label is not the index's", f"record {i}: {label} != {rec.label}")
        problem = _check_value(rec, value, output)
        if problem:
            self.fail("wrong", problem[0], f"record {i}: {problem[1]}")

    def outcome(self) -> str:
        if self.findings:
            return "failed"
        return "refused" if self.refused else "ok"


def _check_value(rec: RefRecord, value: Any, output: str) -> tuple[str, str] | None:
    """(cause, detail) of what is wrong with a returned value, or None."""
    import torch
    from PIL import Image

    h, w = rec.height, rec.width
    if output == "bytes":
        if not isinstance(value, bytes) or value != rec.payload:
            return "bytes differ from those the index names", f"{type(value).__name__} returned"
        return None
    if output == "pil":
        if not isinstance(value, Image.Image) or value.mode != "RGB":
            return "not an RGB PIL image", type(value).__name__
        shape, array = (value.size[1], value.size[0]), np.asarray(value)
    elif output == "tensor":
        if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8 or value.shape[:1] != (3,) \
                or value.ndim != 3:
            return "not a 3xHxW uint8 tensor", repr(getattr(value, "shape", type(value)))
        shape, array = tuple(value.shape[1:]), value.permute(1, 2, 0).numpy()
    else:
        if not isinstance(value, np.ndarray) or value.dtype != np.uint8 or value.ndim != 3 \
                or value.shape[2] != 3:
            return "not an HxWx3 uint8 array", repr(getattr(value, "shape", type(value)))
        shape, array = value.shape[:2], value
    if tuple(shape) != (h, w):
        return "the decoded image's size is not the index's width and height", f"{shape} != {(h, w)}"
    pixels = rec.pixels()
    if rec.fmt == 0 and (pixels is None or not np.array_equal(array, pixels)):
        return "raw pixels differ from the stored bytes", ""
    return None


def _classify(exc: BaseException) -> tuple[str, str]:
    """(kind, cause) of an exception that is not ours: where it was raised, for grouping."""
    message = str(exc)
    if isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and "allocate" in message):
        return "memory", f"{type(exc).__name__} (absurd allocation) at {_where(exc)}"
    if isinstance(exc, RuntimeError) and "DataLoader worker" in message and (
            "killed by signal" in message or "exited unexpectedly" in message):
        return "signal", f"a DataLoader worker died: {message.split(':')[-1].strip()[:60]}"
    if isinstance(exc, RuntimeError) and "DataLoader timed out" in message:
        return "hang", "a DataLoader worker hung"
    inner = re.search(r"Caught (\w+) in DataLoader worker", message)
    if inner:
        return "foreign", f"{inner.group(1)} (in a DataLoader worker) at {_where_in_text(message)}"
    return "foreign", f"{type(exc).__name__} at {_where(exc)}"


def _where(exc: BaseException) -> str:
    """The innermost frame of the exception's traceback in packload's code."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if any(top in f.filename for top in _OURS)]
    frame = (ours or frames or [None])[-1]
    if frame is None:
        return "?"
    return f"{_short(frame.filename)}:{frame.lineno} ({frame.name})"


def _where_in_text(text: str) -> str:
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', text)
    ours = [f for f in frames if any(top in f[0] for top in _OURS)] or frames
    return f"{_short(ours[-1][0])}:{ours[-1][1]} ({ours[-1][2]})" if ours else "?"


_OURS = ("/loaders/", "/packer/", "/packload/")  # the folders of packload's code


def _short(filename: str) -> str:
    for top in _OURS:
        if top in filename:
            return top[1:] + filename.split(top, 1)[1]
    return Path(filename).name


def run_probe(ref: Reference, spec: dict[str, Any], pack: Path, scratch: Path) -> Probe:
    """Run one read path against ``pack`` and judge it; exceptions escaping are judged too."""
    probe = Probe(ref, spec)
    kind = spec["kind"]
    runner = {"item": _probe_items, "items": _probe_items, "dataloader": _probe_dataloader,
              "packloader": _probe_packloader, "cli": _probe_cli}[kind]
    try:
        runner(probe, pack, scratch)
    except Exception as exc:  # noqa: BLE001 - judged: ours is a refusal, any other a failure
        probe.exception(exc, "open" if probe.returned == 0 else "read")
    return probe


def _dataset(probe: Probe, pack: Path, output: str, verify: bool) -> Any:
    from packload import PackedImageFolder

    ds = PackedImageFolder(pack, output=output, verify=verify)
    probe.opened(len(ds), verify)
    return ds


def _probe_items(probe: Probe, pack: Path, scratch: Path) -> None:
    """``ds[i]`` for every record, or ``ds.__getitems__`` over batches of 8."""
    spec = probe.spec
    output, verify = spec["output"], spec["verify"]
    ds = _dataset(probe, pack, output, verify)
    try:
        n = len(ds)
        batches = [[i] for i in range(n)] if spec["kind"] == "item" else [list(range(lo, min(n, lo + BATCH)))
                                                                         for lo in range(0, n, BATCH)]
        for batch in batches:
            try:
                got = [ds[batch[0]]] if spec["kind"] == "item" else ds.__getitems__(batch)
            except Exception as exc:  # noqa: BLE001 - judged
                probe.exception(exc, f"records {batch[0]}..{batch[-1]}")
                continue
            if len(got) != len(batch):
                probe.fail("wrong", "a batch of another length", f"{len(got)} for {len(batch)}")
            for i, (value, label) in zip(batch, got, strict=False):
                probe.item(i, value, label, output, verify)
    finally:
        ds.close()


def _probe_dataloader(probe: Probe, pack: Path, scratch: Path) -> None:
    """One epoch of ``DataLoader(ds, batch_size=4, num_workers=2)``, in order."""
    from torch.utils.data import DataLoader

    ds = _dataset(probe, pack, "numpy", False)
    loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=rt.collate_list,
                        timeout=PROBE_TIMEOUT / 2)
    seen = 0
    try:
        for batch in loader:
            for value, label in batch:
                probe.item(seen, value, label, "numpy", False)
                seen += 1
    except Exception as exc:  # noqa: BLE001 - judged
        probe.exception(exc, f"after {seen} samples")
    finally:
        ds.close()


def expected_crop(pixels: np.ndarray, size: int) -> np.ndarray | None:
    """``CenterCrop(size)`` of raw pixels as its documentation defines it: the centred square of
    224/256 of the shorter side, resized by torch's antialiased bilinear filter (None: no square)."""
    import torch

    h, w = pixels.shape[:2]
    if not h or not w:
        return None
    side = max(1, int(224 / 256 * min(h, w)))
    top, left = (h - side) // 2, (w - side) // 2
    square = np.ascontiguousarray(pixels[top : top + side, left : left + side])
    if side == size:
        return square
    source = torch.from_numpy(square).permute(2, 0, 1).unsqueeze(0)
    out = torch.nn.functional.interpolate(source, size=(size, size), mode="bilinear", antialias=True,
                                          align_corners=False)
    return out[0].permute(1, 2, 0).numpy()


def _probe_packloader(probe: Probe, pack: Path, scratch: Path) -> None:
    """One epoch of ``PackLoader(ds, 8, crop=CenterCrop(24))``, or of ``PackLoader(ds, 8)`` over a
    pack of one image size; each sample judged against the reference (raw pixels exactly)."""
    from packload import CenterCrop, PackLoader

    spec = probe.spec
    crop = spec["crop"]
    ds = _dataset(probe, pack, "numpy", spec["verify"])
    loader = PackLoader(ds, BATCH, crop=CenterCrop(crop) if crop else None)
    order = loader.sampler.epoch_order(0).tolist()
    done = 0
    try:
        for images, labels in loader:
            for k in range(len(labels)):
                _judge_batch_image(probe, order[done + k], images[k], labels[k], crop)
            done += len(labels)
    except Exception as exc:  # noqa: BLE001 - judged
        probe.exception(exc, f"after {done} samples")
    finally:
        loader.close()
        ds.close()


def _judge_batch_image(probe: Probe, i: int, image: Any, label: Any, crop: int | None) -> None:
    rec = probe.allowed(i, probe.spec["verify"])
    if rec is None:
        return
    if int(label) != rec.label:
        probe.fail("wrong", "the label is not the index's", f"record {i}")
    array = image.permute(1, 2, 0).numpy()
    pixels = rec.pixels()
    if crop:
        if rec.fmt == 0:
            want = None if pixels is None else expected_crop(pixels, crop)
            if want is None:
                probe.fail("wrong", "returned a crop of an image that has no pixels",
                           f"record {i}: {rec.height}x{rec.width}")
            elif not np.array_equal(array, want):
                probe.fail("wrong", "cropped raw pixels differ from the stored image's crop", f"record {i}")
        return
    if array.shape[:2] != (rec.height, rec.width):
        probe.fail("wrong", "the image's size is not the index's width and height",
                   f"record {i}: {array.shape}")
    elif pixels is None or not np.array_equal(array, pixels):
        probe.fail("wrong", "raw pixels differ from the stored bytes", f"record {i}")


def _run_cli(args: list[str]) -> tuple[int, str, str, BaseException | None]:
    from packload.cli import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(args)
    except Exception as exc:  # noqa: BLE001 - a traceback a user would see
        return -1, out.getvalue(), err.getvalue(), exc
    return code, out.getvalue(), err.getvalue(), None


def _probe_cli(probe: Probe, pack: Path, scratch: Path) -> None:
    """``packload COMMAND`` through ``packload.cli.main``: success (then judged by the command), our
    one-line error and a non-zero exit, or for ``verify`` a report and exit 1."""
    name = probe.spec["command"]
    args = [*CLI_COMMANDS[name], str(pack)]
    other = "shards" if probe.ref.backend == "lmdb" else "lmdb"  # into the other backend: every payload read
    target = scratch / ("unpacked" if name == "unpack" else f"merged.{other}")
    if name == "unpack":
        args.append(str(target))
    elif name == "merge":
        args = [*CLI_COMMANDS[name], str(target), str(pack)]
    outside = _outside(probe.ref, target) if name == "unpack" else {}
    code, out, err, exc = _run_cli(args)
    for place, before in outside.items():  # whatever the exit: a partial unpack must not escape either
        if place.exists() and place.stat().st_mtime != before:
            probe.fail("wrong", "unpack wrote a file outside its folder", str(place))
    if exc is not None:
        probe.exception(exc, f"packload {name}")
        return
    if code != 0:
        if name.startswith("verify") and code == 1 and not err.strip():
            probe.refused.append("reported: " + " | ".join(out.strip().splitlines()[:3])[:200])
        else:
            problem = rt.one_line_error(code, err)
            if problem:
                probe.fail("foreign", f"packload {name}: not a one-line error", problem)
            else:
                probe.refused.append(err.strip()[:200])
        return
    probe.notes.append("exit 0")
    ref = probe.ref
    if ref.pack_bad:
        probe.fail("accepted", f"packload {name} succeeded on a pack every reader must refuse", ref.pack_bad)
    elif name.startswith("verify"):
        problems = ref.problems()
        if problems:
            probe.fail("accepted", f"packload {name} passed a pack that breaks: {problems[0][0]}",
                       problems[0][1])
    elif name == "unpack":
        _judge_unpack(probe, target)
    elif name == "merge":
        _judge_merge(probe, target)


def _outside(ref: Reference, out: Path) -> dict[Path, float | None]:
    """Where records' paths would land outside ``out``, with each place's mtime now (None: absent)."""
    places: dict[Path, float | None] = {}
    for rec in ref.records:
        path = rec.text_path
        if path is None or "\0" in path:
            continue
        place = Path(os.path.normpath(os.path.join(out, path)))
        if place != out and out not in place.parents:
            places[place] = place.stat().st_mtime if place.exists() else None
    return places


def _judge_unpack(probe: Probe, out: Path) -> None:
    """A successful unpack wrote one file per record: each stored payload (a raw record's pixels, as
    an image) exactly once, whatever the files' names."""
    ref = probe.ref
    if any(probe.allowed(i, True) is None for i in range(len(ref.records))):
        return
    if unpack_refuses(ref):
        probe.fail("wrong", "unpack wrote a pack with paths that are unsafe, not UTF-8 or the same twice")
        return
    wanted: dict[str, int] = {}
    for rec in ref.records:
        key = hashlib.sha256(rec.pixels().tobytes() if rec.fmt == 0 else rec.payload or b"").hexdigest()
        wanted[key] = wanted.get(key, 0) + 1
    for file in sorted(p for p in out.rglob("*") if p.is_file()):
        data = file.read_bytes()
        key = hashlib.sha256(data).hexdigest()
        if not wanted.get(key):
            key = _pixels_digest(data) or key
        if not wanted.get(key):
            probe.fail("wrong", "an unpacked file is no record's payload", str(file.relative_to(out)))
            return
        wanted[key] -= 1
    if any(wanted.values()):
        probe.fail("wrong", "unpack left a record out (or wrote two on one path)",
                   f"{sum(wanted.values())} of {len(ref.records)}")


def _pixels_digest(data: bytes) -> str | None:
    """The sha256 of an image file's RGB pixels (None: not an image)."""
    from PIL import Image

    try:
        return hashlib.sha256(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).tobytes()).hexdigest()
    except Exception:  # noqa: BLE001 - any file that does not decode
        return None


def _judge_merge(probe: Probe, out: Path) -> None:
    """A successful merge of one pack copied no record a reader must refuse, wrote a pack that breaks
    no rule the input did not already break, and holds the same records."""
    ref = probe.ref
    if any(probe.allowed(i, False) is None for i in range(len(ref.records))):
        return
    merged = Reference(out, ref.manifest_limit)
    broken = {rule for rule, _ in ref.problems()}
    problems = [p for p in merged.problems() if p[0] not in broken]
    if problems:
        probe.fail("wrong", f"merge wrote a pack that breaks: {problems[0][0]}", problems[0][1])
        return
    if len(merged.records) != len(ref.records):
        probe.fail("wrong", "merge changed the number of records",
                   f"{len(merged.records)} != {len(ref.records)}")
        return
    for i, (a, b) in enumerate(zip(ref.records, merged.records, strict=True)):
        names = (ref.classes[a.label] if 0 <= a.label < len(ref.classes) else None,
                 merged.classes[b.label] if 0 <= b.label < len(merged.classes) else None)
        if (a.payload, a.path) != (b.payload, b.path) or names[0] != names[1]:
            probe.fail("wrong", "merge changed a record (payload, path or class)", f"record {i}")
            return


# -- the server: one import of torch, a fresh forked worker whenever one dies ---------------------------


def _use_kernel(library: str) -> None:
    """Make ``packload.core.resize_kernel`` load ``library`` (a sanitizer build) instead of the built
    kernel: it imports the module ``packload.core._resize`` and loads the file that module names."""
    import types

    module = types.ModuleType("packload.core._resize")
    module.__file__ = library
    sys.modules["packload.core._resize"] = module


def serve(mode: str) -> None:
    """The probe server, run as ``python -c``: imports what the probes need once, caps its address
    space, then forks a worker that answers one JSON request a line on stdin (one JSON line each on
    the protocol descriptor); reports a worker that died and forks a new one. ``mode``: ``kernel``,
    ``torch`` (``PACKLOAD_RESIZE=torch`` in the environment) or ``asan:LIBRARY``."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints go to the log, never into the protocol
    if mode.startswith("asan:"):
        _use_kernel(mode[5:])
    import PIL.Image  # noqa: F401 - everything the probes import, imported before the cap
    import torch.utils.data  # noqa: F401

    import packload.cli  # noqa: F401
    import packload.loaders.unpack  # noqa: F401
    import packload.loaders.verify  # noqa: F401
    import packload.merger  # noqa: F401
    from packload.core import resize_kernel

    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + MEMORY_HEADROOM, vm + MEMORY_HEADROOM))
    kernel = getattr(resize_kernel._lib, "_name", None)
    proto.write(json.dumps({"server": os.getpid(), "kernel": kernel, "loaders": packload.loaders.__file__}) + "\n")
    while True:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _work(proto)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            return
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == RECYCLE:
            continue
        if os.WIFSIGNALED(status):
            died = signal.Signals(os.WTERMSIG(status)).name
        else:
            died = f"exit {os.WEXITSTATUS(status)}"
        proto.write(json.dumps({"died": died, "pid": pid}) + "\n")


def _work(proto: Any) -> None:
    """A worker: answers requests until stdin closes. The reference of the latest pack is kept."""
    import faulthandler

    faulthandler.enable(sys.stderr)
    faulthandler.register(signal.SIGUSR1, sys.stderr)  # the parent asks for the stack of a hang
    proto.write(json.dumps({"ready": os.getpid()}) + "\n")
    refs: dict[str, Reference] = {}
    limited = False
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("recycle"):  # a new pack: a fresh worker, untouched by the probes before
            proto.write(json.dumps({"id": request["id"], "recycled": os.getpid()}) + "\n")
            proto.flush()
            os._exit(RECYCLE)
        if request.get("canary"):
            _canary()
            proto.write(json.dumps({"id": request["id"], "outcome": "ok", "findings": [], "refused": []})
                        + "\n")
            continue
        if not limited:
            _limit_manifests(request["manifest_limit"])
            limited = True
        pack = Path(request["pack"])
        print(f"-- probe {request['id']}: {request['path']} on {pack}", file=sys.stderr, flush=True)
        try:
            if request["pack"] not in refs:
                refs.clear()
                refs[request["pack"]] = Reference(pack, request["manifest_limit"])
            ref = refs[request["pack"]]
            probe = run_probe(ref, READ_PATHS[request["path"]], pack, Path(request["scratch"]))
            unpacks = READ_PATHS[request["path"]].get("command") == "unpack"
            unsafe = unpacks and unpack_refuses(ref)
            answer = {"outcome": probe.outcome(), "findings": probe.findings, "refused": probe.refused[:2],
                      "valid": not ref.problems() and not unsafe}
        except Exception:  # noqa: BLE001 - a bug of this harness, not of the reader: reported as such
            answer = {"outcome": "harness error", "refused": [], "findings": [
                {"kind": "harness", "cause": "the fuzz harness itself failed",
                 "detail": traceback.format_exc()[-600:]}]}
        proto.write(json.dumps({"id": request["id"], **answer}) + "\n")


def _canary() -> None:
    """Make the resize kernel read 8 rows past the end of a heap buffer, on purpose: a sanitizer
    build must report it (and abort), which shows that its reports reach the parent."""
    from packload.core import resize_kernel

    height, width, side = 64, 64, 48  # a shrink the kernel takes (not by more than 2x)
    image = np.zeros(height * width * 3, np.uint8)
    out = np.empty((side, side, 3), np.uint8)
    if not resize_kernel.resize_region(image.ctypes.data, width * 3, height + 8, width, out.ctypes.data,
                                       side * 3, side, side):
        raise RuntimeError(f"the resize kernel declined the canary: {resize_kernel.unavailable_reason}")


def _limit_manifests(limit: int) -> None:
    """Lower the reader's manifest size limit (``MANIFEST_LIMIT_HOOK``) to ``limit`` when it is lower,
    in every loaded packload module holding a copy of it (``from packload.core.format import ...``)."""
    import importlib

    home, name = MANIFEST_LIMIT_HOOK
    current = getattr(importlib.import_module(home), name, None)
    if not isinstance(current, int) or limit >= current:
        return
    for module_name, module in list(sys.modules.items()):
        if module_name.split(".")[0] == "packload" and getattr(module, name, None) == current:
            setattr(module, name, limit)


class ProbeServer:
    """The parent's side of ``serve``: sends requests, detects a worker's death or hang (killing it,
    after asking faulthandler for its stack), and reports what the log said."""

    def __init__(self, mode: str, log: Path, env: dict[str, str] | None = None,
                 timeout: float = PROBE_TIMEOUT) -> None:
        self.mode, self.log, self.timeout = mode, log, timeout
        self.env = env if env is not None else server_env(mode)
        self.proc: subprocess.Popen[bytes] | None = None
        self.worker: int | None = None
        self.info: dict[str, Any] = {}
        self.deaths = 0
        self._buffer = b""
        self._next = 0

    def start(self) -> None:
        self._log = open(self.log, "ab")  # noqa: SIM115 - held while the server runs
        command = [sys.executable, "-c", f"from tests.fuzz_packs import serve; serve({self.mode!r})"]
        self.proc = subprocess.Popen(command, cwd=REPO, env=self.env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log)
        self.info = self._line(PROBE_TIMEOUT * 3) or {}
        if "server" not in self.info:
            raise RuntimeError(f"probe server ({self.mode}) did not start: {self._log_tail(0)[-2000:]}")

    def _line(self, timeout: float) -> dict[str, Any] | None:
        """The next protocol line, or None after ``timeout`` seconds (or if the server is gone)."""
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send one probe request; its answer, or ``{"died": signal}`` / ``{"hang": seconds}``."""
        if self.proc is None or self.proc.poll() is not None:
            self.stop()
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        self._next += 1
        request = dict(request, id=self._next)
        mark = self.log.stat().st_size
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + self.timeout
        while True:
            message = self._line(max(0.0, deadline - time.monotonic()))
            if message is None:
                return self._hang(mark)
            if "ready" in message:
                self.worker = message["ready"]
            elif "died" in message:
                self.deaths += 1
                return {"died": message["died"], "log": _crash_lines(self._log_tail(mark))}
            elif message.get("id") == self._next:
                return message

    def recycle(self) -> None:
        """Have the server replace its worker by a fresh fork (before each pack)."""
        if self.proc is not None and self.proc.poll() is None and self.worker is not None:
            self.ask({"recycle": True})
            self.worker = None

    def _hang(self, mark: int) -> dict[str, Any]:
        if self.worker is not None and self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.worker, signal.SIGUSR1)
                time.sleep(0.5)
                os.kill(self.worker, signal.SIGKILL)
            died = self._line(10.0)
            if died is None or "died" not in died:
                self.stop()
        else:
            self.stop()
        self.deaths += 1
        return {"hang": self.timeout, "log": _crash_lines(self._log_tail(mark))}

    def _log_tail(self, mark: int) -> str:
        self._log.flush()
        with open(self.log, "rb") as f:
            f.seek(max(mark, self.log.stat().st_size - (64 << 10)))
            return f.read().decode("utf-8", "replace")

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
            self._log.close()
        self._buffer = b""
        self.worker = None

    def __enter__(self) -> ProbeServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _crash_lines(log: str) -> str:
    """What a log says about a crash or hang: sanitizer reports, and packload's frames of the stack."""
    lines = log.splitlines()
    wanted = re.compile(r"ERROR: AddressSanitizer|runtime error:|SUMMARY:|Fatal Python|"
                        r"^(Thread|Current thread)|/loaders/|/packer/|/packload/|#\d+ 0x.*_resize")
    keep = [line for line in lines if wanted.search(line)]
    return "\n".join(keep[:14])[:1500]


def server_env(mode: str, asan_runtime: str | None = None) -> dict[str, str]:
    """The environment of a probe server: the repository importable; for ``torch`` the kernel off
    (``PACKLOAD_RESIZE=torch``); for ``asan:`` the sanitizer runtime preloaded."""
    env = rt._env()
    env.pop("PACKLOAD_RESIZE", None)
    if mode == "torch":
        env["PACKLOAD_RESIZE"] = "torch"
    if mode.startswith("asan:"):
        env["LD_PRELOAD"] = asan_runtime or sanitizer_runtime()[0] or ""
        env["ASAN_OPTIONS"] = ("detect_leaks=0:abort_on_error=1:halt_on_error=1:allocator_may_return_null=1:"
                               "detect_odr_violation=0:alloc_dealloc_mismatch=0:handle_segv=1")
        env["UBSAN_OPTIONS"] = "halt_on_error=1:abort_on_error=1:print_stacktrace=1"
    return env


# -- sanitizer build of the resize kernel -------------------------------------------------------------------


def sanitizer_runtime() -> tuple[str | None, str]:
    """(the path of libasan to preload, "") or (None, why there is none)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        return None, "no C compiler"
    found = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not found or not os.path.isabs(found) or not os.path.exists(found):
        return None, f"{cc} has no libasan"
    return os.path.realpath(found), ""


def build_sanitized_kernel(dest: Path) -> tuple[Path | None, str]:
    """``packload/core/_resize.c`` built with ``-fsanitize=address,undefined`` into ``dest``: (library, "")
    or (None, why it cannot be built here)."""
    runtime, why = sanitizer_runtime()
    if runtime is None:
        return None, why
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").is_file():
        return None, f"no Python headers in {include}"
    cc = shutil.which("gcc") or shutil.which("cc")
    dest.mkdir(parents=True, exist_ok=True)
    library = dest / "_resize_asan.so"
    command = [str(cc), "-shared", "-fPIC", "-O1", "-g", "-fsanitize=address,undefined",
               "-fno-omit-frame-pointer", f"-I{include}", str(REPO / "packload" / "core" / "_resize.c"), "-o",
               str(library)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return None, f"the sanitizer build failed: {done.stderr.strip()[-500:]}"
    return library, ""


# -- the campaign ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """One mutated pack and the read paths to probe it with."""

    case: Case
    backend: str
    payload: str
    recompute: bool
    paths: tuple[str, ...]

    @property
    def label(self) -> str:
        checks = ("recomputed" if self.recompute else "not recomputed") if self.case.sealed else "n/a"
        return f"{self.case.name} [{self.backend}, {self.payload}, checksums {checks}]"


def _applicable(path: str, payload: str) -> bool:
    return not READ_PATHS[path].get("raw_only") or payload == "raw"


class _Rotation:
    """Hands out read paths from pools in turn, so a subset of cases still covers every path."""

    def __init__(self, pools: list[list[str]]) -> None:
        self.pools = pools
        self.turn = [0] * len(pools)

    def take(self, payload: str) -> tuple[str, ...]:
        out = []
        for k, pool in enumerate(self.pools):
            for _ in range(len(pool)):
                path = pool[self.turn[k] % len(pool)]
                self.turn[k] += 1
                if _applicable(path, payload):
                    out.append(path)
                    break
        return tuple(out)


QUICK_POOLS = [
    [p for p in READ_PATHS if READ_PATHS[p]["kind"] in ("item", "items")][::2],
    [p for p in READ_PATHS if READ_PATHS[p]["kind"] in ("item", "items")][1::2],
    ["PackLoader crop", "PackLoader one size", "PackLoader crop, torch resize", "DataLoader numpy workers=2",
     "PackLoader one size verify=True", "PackLoader crop"],
    list(CLI_COMMANDS),
]


def plan_jobs(cases: dict[tuple[str, str], list[Case]], mode: str) -> list[Job]:
    """The jobs of a campaign. ``full``: every case on every base pack with every read path (and,
    without recomputed checksums, with ``UNSEALED_PATHS``). ``quick``: the cases marked for CI, each
    field on both backends, its values alternating between the payloads, four read paths each in
    turn; without recomputed checksums one value per field. ``asan``: index-entry cases with the
    PackLoader crop."""
    jobs: list[Job] = []
    if mode == "full":
        for (backend, payload), mine in cases.items():
            for case in mine:
                paths = case.paths or tuple(p for p in READ_PATHS if _applicable(p, payload))
                jobs.append(Job(case, backend, payload, True, paths))
                if case.sealed:
                    unsealed = tuple(p for p in UNSEALED_PATHS if p in paths)
                    jobs.append(Job(case, backend, payload, False, unsealed))
        return jobs
    if mode == "asan":
        return [Job(case, backend, payload, True, ("PackLoader crop",))
                for (backend, payload), mine in cases.items()
                for case in mine if case.group == "index entry" and case.quick]
    rotation = _Rotation(QUICK_POOLS)
    chosen: dict[tuple[str, str], list[str]] = {}  # (group, field) -> its CI values, in order
    where: dict[tuple[str, str, str], list[str]] = {}  # (group, field, value) -> payloads that have it
    for (_, payload), mine in cases.items():
        for case in mine:
            if case.quick:
                values = chosen.setdefault((case.group, case.field), [])
                if case.value not in values:
                    values.append(case.value)
                having = where.setdefault((case.group, case.field, case.value), [])
                if payload not in having:
                    having.append(payload)
    for f_index, ((group, name), values) in enumerate(chosen.items()):
        for v_index, value in enumerate(values[:2]):
            for b_index, backend in enumerate(BACKENDS):
                having = where[(group, name, value)]
                payload = having[(f_index + v_index + b_index) % len(having)]
                case = next((c for c in cases.get((backend, payload), ())
                             if (c.group, c.field, c.value) == (group, name, value)), None)
                if case is None:  # a shard header: shards only
                    continue
                jobs.append(Job(case, backend, payload, True, case.paths or rotation.take(payload)))
                if case.sealed and v_index == 0 and b_index == f_index % 2:
                    jobs.append(Job(case, backend, payload, False, (UNSEALED_PATHS[f_index % 3], "verify")))
    return jobs


def fuzz_fields(workdir: Path, mode: str = "quick", big_manifest: int | None = None,
                timeout: float = PROBE_TIMEOUT, asan_library: Path | None = None,
                log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run a campaign (``quick``, ``full`` or ``asan``, see ``plan_jobs``) in ``workdir``. Returns the
    counts (cases per field class, packs, probes, outcomes) and every failure (one dict per probe
    finding: case, backend, payload, checksums recomputed or not, read path, kind, cause, detail)."""
    started = time.perf_counter()
    big = big_manifest or (BIG_MANIFEST_FULL if mode == "full" else BIG_MANIFEST_QUICK)
    workdir.mkdir(parents=True, exist_ok=True)
    bases = make_bases(workdir / "bases")
    models = {key: Model.load(path) for key, path in bases.items()}
    cases = {key: build_cases(model, key[1], big) for key, model in models.items()}
    jobs = plan_jobs(cases, mode)
    result: dict[str, Any] = {"mode": mode, "big_manifest": big, "cases": _case_counts(cases, jobs),
                              "packs": 0, "duplicates": 0, "probes": 0, "outcomes": {}, "failures": [],
                              "control": [], "notes": [], "coverage": {}, "paths": {}}
    main_mode = f"asan:{asan_library}" if mode == "asan" else "kernel"
    with contextlib.ExitStack() as stack:
        servers = {"main": ProbeServer(main_mode, workdir / "server-main.log", timeout=timeout)}
        if mode != "asan":
            servers["torch"] = ProbeServer("torch", workdir / "server-torch.log", timeout=timeout)
        for server in servers.values():
            stack.enter_context(server)
        result["kernel"] = servers["main"].info.get("kernel")
        runner = _Runner(servers, workdir, big // 2, result)
        for (backend, payload), path in bases.items():  # the intact packs: every path must read them cleanly
            control = Case("control", "intact pack", "-", lambda m, r: None, sealed=False)
            paths = tuple(p for p in READ_PATHS if _applicable(p, payload) and (mode != "asan" or p in (
                "PackLoader crop",)))
            runner.probe_pack(Job(control, backend, payload, True, paths), path, control=True)
        digests = {key: model.digest() for key, model in models.items()}
        seen: set[str] = set()
        for k, job in enumerate(jobs):
            model = models[(job.backend, job.payload)].copy()
            try:
                job.case.apply(model, job.recompute)
            except Exception:  # noqa: BLE001 - a bug of this harness: reported, the campaign goes on
                runner.harness_error(job, traceback.format_exc())
                continue
            digest = model.digest()
            if digest == digests[(job.backend, job.payload)] or (digest, job.paths) in seen:
                result["duplicates"] += 1
                continue
            seen.add((digest, job.paths))
            place = workdir / "cases" / f"{k}"
            pack = model.write(place / f"pack.{job.backend}")
            runner.probe_pack(job, pack)
            shutil.rmtree(place, ignore_errors=True)
            if log and (k + 1) % 200 == 0:
                log(f"  {k + 1}/{len(jobs)} packs, {len(result['failures'])} failures, "
                    f"{time.perf_counter() - started:.0f} s")
        result["worker_deaths"] = {name: server.deaths for name, server in servers.items()}
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["problems"] = [f"{f['case']}: {f['path']}: {f['kind']}: {f['cause']}" for f in result["failures"]]
    return result


class _Runner:
    """Probes one pack with each of its job's read paths and records outcomes and failures."""

    def __init__(self, servers: dict[str, ProbeServer], workdir: Path, manifest_limit: int,
                 result: dict[str, Any]) -> None:
        self.servers, self.workdir, self.limit, self.result = servers, workdir, manifest_limit, result

    def probe_pack(self, job: Job, pack: Path, control: bool = False) -> None:
        self.result["packs"] += 1
        for server in self.servers.values():
            server.recycle()
        fields = self.result["coverage"].setdefault(job.case.group, {})
        backends = fields.setdefault(job.case.field, [])
        if job.backend not in backends:
            backends.append(job.backend)
        scratch = pack.parent / "scratch"
        for path in job.paths:
            server = self.servers.get(READ_PATHS[path].get("server", "main"), self.servers["main"])
            scratch.mkdir(parents=True, exist_ok=True)
            answer = server.ask({"pack": str(pack), "path": path, "scratch": str(scratch),
                                 "manifest_limit": self.limit})
            shutil.rmtree(scratch, ignore_errors=True)
            self._record(job, path, answer, control)

    def harness_error(self, job: Job, trace: str) -> None:
        finding = {"kind": "harness", "cause": "the fuzz harness could not make the case",
                   "detail": trace[-600:]}
        self._record(job, "-", {"outcome": "harness error", "refused": [], "findings": [finding]}, False)

    def _record(self, job: Job, path: str, answer: dict[str, Any], control: bool) -> None:
        result = self.result
        result["probes"] += 1
        if not control and path in READ_PATHS:
            result["paths"][path] = result["paths"].get(path, 0) + 1
        if "died" in answer or "hang" in answer:
            kind = "signal" if "died" in answer else "hang"
            findings = [{"kind": kind, "cause": f"the worker died ({answer['died']})" if kind == "signal"
                         else f"no answer within {answer['hang']:.0f} s", "detail": answer.get("log", "")}]
            outcome = kind
        else:
            findings, outcome = answer["findings"], answer["outcome"]
            if outcome == "refused" and answer.get("valid") and not control:
                result["notes"].append({"case": job.case.name, "backend": job.backend, "payload": job.payload,
                                        "path": path, "refused though the reference finds it valid":
                                            answer["refused"]})
            if control and outcome != "ok":
                findings = findings or [{"kind": "control", "cause": "refused an intact pack",
                                         "detail": "; ".join(answer["refused"])}]
        counts = result["outcomes"].setdefault(job.case.group, {})
        counts[outcome] = counts.get(outcome, 0) + 1
        for finding in findings:
            checks = ("recomputed" if job.recompute else "not recomputed") if job.case.sealed else "n/a"
            entry = {"case": job.case.name, "group": job.case.group, "field": job.case.field,
                     "value": job.case.value, "backend": job.backend, "payload": job.payload,
                     "checksums": checks, "path": path, **finding}
            (result["control"] if control else result["failures"]).append(entry)


def _case_counts(cases: dict[tuple[str, str], list[Case]], jobs: list[Job]) -> dict[str, dict[str, int]]:
    """Per field class: distinct cases (field and value), fields, and mutated packs planned."""
    out: dict[str, dict[str, int]] = {}
    for group in GROUPS:
        distinct = {(c.field, c.value) for mine in cases.values() for c in mine if c.group == group}
        out[group] = {"cases": len(distinct), "fields": len({f for f, _ in distinct}),
                      "packs": sum(1 for j in jobs if j.case.group == group),
                      "probes": sum(len(j.paths) for j in jobs if j.case.group == group)}
    return out


def failure_report(result: dict[str, Any], limit: int = 12) -> list[str]:
    """The failures grouped by cause (kind and cause), each with the cases that showed it."""
    groups: dict[tuple[str, str], list[dict[str, str]]] = {}
    for failure in result["control"] + result["failures"]:
        groups.setdefault((failure["kind"], failure["cause"]), []).append(failure)
    lines = []
    for (kind, cause), failures in sorted(groups.items(), key=lambda item: (item[0][0], -len(item[1]))):
        lines.append(f"[{kind}] {cause}: {len(failures)} probe(s)")
        for f in failures[:limit]:
            lines.append(f"    {f['case']} [{f['backend']}, {f['payload']}, checksums {f['checksums']}] "
                         f"{f['path']}: {f['detail'][:200]}".rstrip())
        if len(failures) > limit:
            lines.append(f"    ... and {len(failures) - limit} more")
    return lines
