"""The manifest cases: every key set to values of every JSON type and to values chosen from the
pack, keys nested in ``parts`` and ``index``, and manifests that are not the JSON a JSON library
writes (not UTF-8, truncated, deep nesting, NaN, 5000-digit integers, oversized)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from tests.fuzz_packs.cases import Case, Plan
from tests.fuzz_packs.model import ENCODINGS, Model, manifest_bytes

LONG_STRING = 1 << 20  # characters of the "very long string" JSON value


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


def manifest_cases(plan: Plan, big: int) -> list[Case]:
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


def _nested_manifest_cases(plan: Plan) -> list[Case]:
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


def _raw_manifest_cases(plan: Plan, big: int) -> list[Case]:
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
