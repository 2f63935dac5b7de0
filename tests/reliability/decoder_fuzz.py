"""Hypothesis over the record-header, index and manifest decoders of ``packload.core.format``."""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np


def fuzz_decoders(examples: int, seed: int = 0) -> dict[str, Any]:
    """Hypothesis over the record-header, index and manifest decoders: each input either decodes or
    raises ``PackFormatError``; anything else is a problem. Returns examples run and problems."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed
    from hypothesis import strategies as st

    from packload.core.errors import PackFormatError
    from packload.core.format import (
        FORMAT_VERSION,
        INDEX_ENTRY,
        INDEX_MAGIC,
        RECORD_MAGIC,
        check_entries_fit,
        decode_index,
        decode_record_header,
        entry_path,
    )
    from packload.core.manifest import decode_manifest

    counts = {"record header": 0, "index": 0, "manifest": 0}
    problems: list[str] = []
    config = settings(max_examples=examples, deadline=None, database=None, derandomize=False,
                      suppress_health_check=list(HealthCheck))

    def guard(kind: str, call: Callable[[], Any]) -> None:
        counts[kind] += 1
        try:
            call()
        except PackFormatError:
            pass
        except Exception as exc:  # noqa: BLE001 - what the fuzz looks for
            problems.append(f"{kind}: {type(exc).__name__}: {exc}")

    def forged(body: bytes, path: bytes, tail: bytes) -> bytes:
        body = (body + bytes(48))[:48]
        body = body[:32] + len(path).to_bytes(2, "little") + body[34:]
        return RECORD_MAGIC + zlib.crc32(path, zlib.crc32(body)).to_bytes(4, "little") + body + path + tail

    records = st.one_of(st.binary(max_size=300), st.binary(max_size=300).map(lambda b: RECORD_MAGIC + b),
                        st.builds(forged, st.binary(min_size=48, max_size=48), st.binary(max_size=40),
                                  st.binary(max_size=120)))

    @hseed(seed)
    @config
    @given(records, st.integers(-8, 80))
    def record_case(buf: bytes, offset: int) -> None:
        def run() -> None:
            meta, start, length, _ = decode_record_header(memoryview(buf), offset)
            assert 0 <= offset and start + length <= len(buf) and isinstance(meta.path, str)
        guard("record header", run)

    def index_blob(count: int, paths_len: int, body: bytes, version: int) -> bytes:
        need = count * INDEX_ENTRY.itemsize + paths_len
        body = (body * (need // max(len(body), 1) + 1))[:need] if body else bytes(need)
        return (INDEX_MAGIC + version.to_bytes(4, "little") + count.to_bytes(8, "little") + (64).to_bytes(4, "little")
                + bytes(4) + paths_len.to_bytes(8, "little") + body)

    indexes = st.one_of(st.binary(max_size=400),
                        st.builds(index_blob, st.integers(0, 5), st.integers(0, 60), st.binary(max_size=400),
                                  st.sampled_from([FORMAT_VERSION, FORMAT_VERSION, 0, 2, 2**32 - 1])))

    @hseed(seed)
    @config
    @given(indexes, st.lists(st.integers(0, 2**64 - 1), max_size=4))
    def index_case(buf: bytes, parts: list[int]) -> None:
        def run() -> None:
            entries, paths = decode_index(buf, "fuzz")
            for i in range(len(entries)):
                entry_path(entries, paths, i)
            check_entries_fit(entries, np.array(parts, dtype=np.uint64), "fuzz")
        guard("index", run)

    json_values = st.recursive(
        st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=12)
    valid = {"format": "packload", "version": 1, "backend": "shards", "encoding": "keep", "records": 2,
             "classes": ["a"], "skipped": [], "class_counts": {"a": 2}, "payload_bytes": 10,
             "index": {"name": "index.bin", "size": 160, "sha256": "0" * 64},
             "parts": [{"name": "shard-00000.bin", "size": 100, "sha256": "0" * 64, "records": 2}],
             "ignored": [], "source": {"name": "s", "files": 2, "bytes": 10}, "options": {}, "labelled": True}

    def mutated(key: str, value: Any) -> bytes:
        return json.dumps(dict(valid, **{key: value})).encode()

    manifests = st.one_of(st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode()),
                          st.builds(mutated, st.sampled_from(sorted(valid)), json_values))

    @hseed(seed)
    @config
    @given(manifests)
    def manifest_case(raw: bytes) -> None:
        def run() -> None:
            manifest = decode_manifest(raw, "fuzz")
            _use_manifest(manifest)
        guard("manifest", run)

    record_case()
    index_case()
    manifest_case()
    return {"examples": counts, "problems": sorted(set(problems))}


def _use_manifest(manifest: dict[str, Any]) -> None:
    """A decoded manifest must have the documented types in every field that info and verify use."""
    def kind(key: str, types: type | tuple[type, ...], default: Any = None) -> Any:
        value = manifest.get(key, default)
        assert isinstance(value, types), f"decoded manifest has {key} = {value!r}"
        return value

    counts = kind("class_counts", dict, {})
    assert all(isinstance(v, int) for v in counts.values()), f"class_counts = {counts!r}"
    kind("payload_bytes", (int, type(None)))
    index = kind("index", dict, {})
    assert isinstance(index.get("sha256", ""), str), f"index = {index!r}"
    kind("ignored", list, [])
    kind("source", dict, {})
    kind("options", dict, {})
    if manifest["backend"] == "shards":
        parts = kind("parts", list, [])
        assert all(isinstance(p, dict) and isinstance(p.get("name"), str) for p in parts), f"parts = {parts!r}"
    else:
        kind("parts", dict, {})
