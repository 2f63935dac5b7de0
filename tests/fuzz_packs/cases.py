"""The binary field cases: every field of the index header, an index entry, a record header, a
record's path and a shard header, set to the edge values of its type and to values chosen from the
pack itself (just past an end, another record's, a neighbour's bytes)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.fuzz_packs.model import (
    ENTRY_FIELDS,
    HEAD,
    INDEX_ENTRY,
    INDEX_HEADER_FIELDS,
    RECORD_FIELDS,
    SHARD_FIELDS,
    SIZES,
    Model,
    put_field,
)

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
    size, signed = SIZES[kind]
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
    size, signed = SIZES[kind]
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
class Plan:
    """Facts of an intact base pack that contextual values are made of."""

    model: Model
    target: int  # the record whose entry and header the cases change
    neighbour: int  # another record in the same part
    other: int  # a record in another part
    classes: int

    @classmethod
    def of(cls, model: Model) -> Plan:
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


def index_header_cases(plan: Plan) -> list[Case]:
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


def index_entry_cases(plan: Plan, payload: str) -> list[Case]:
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


def _location_cases(plan: Plan, payload: str) -> list[Case]:
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


def record_header_cases(plan: Plan) -> list[Case]:
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


def record_path_cases(plan: Plan) -> list[Case]:
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


def shard_header_cases(plan: Plan) -> list[Case]:
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
                               lambda m, o=offset, k=kind, v=value: put_field(m.parts[part], o, k, v),
                               quick=quick))
    return cases
