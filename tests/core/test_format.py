"""Tests for packload.core.format: record headers, the index and the manifest, as bytes on disk.

Round trips check that what the writers encode the readers decode unchanged; the rejection tests damage
real encoded bytes one field at a time and check that each damage is refused with ``PackFormatError``
(never another exception type, never a silently wrong value). Hypothesis fuzzes both decoders.
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from packload.core.errors import PackFormatError  # noqa: E402
from packload.core.format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    INDEX_ENTRY,
    INDEX_HEADER,
    INDEX_MAGIC,
    PAYLOAD_FORMATS,
    RECORD_HEADER,
    RECORD_MAGIC,
    RecordMeta,
    check_entries_fit,
    decode_index,
    decode_record_header,
    encode_index,
    encode_record,
    entry_path,
    index_entry,
    payload_format_code,
)
from packload.core.manifest import decode_manifest, encode_manifest

HEADER = RECORD_HEADER.itemsize  # 56
UNICODE_PATH = "chats/café ünï 猫 -x.png"


def meta(**overrides: object) -> RecordMeta:
    fields: dict[str, object] = dict(record=7, label=3, width=640, height=480, format="JPEG", mode="RGB",
                                     orientation=6, path=UNICODE_PATH)
    fields.update(overrides)
    return RecordMeta(**fields)  # type: ignore[arg-type]


def record_bytes(m: RecordMeta, payload: bytes) -> bytes:
    head, _ = encode_record(m, payload)
    return head + payload


# -- record header ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", PAYLOAD_FORMATS)
def test_record_round_trip_every_payload_format(fmt: str) -> None:
    m = meta(format=fmt, mode="RGB" if fmt == "raw" else "P")
    payload = bytes(range(256)) * 3 + fmt.encode()
    head, crc = encode_record(m, payload)
    assert head[:4] == RECORD_MAGIC
    assert len(head) == HEADER + len(UNICODE_PATH.encode("utf-8"))
    assert crc == zlib.crc32(payload)
    got, payload_start, payload_len, payload_crc = decode_record_header(head + payload)
    assert got == m
    assert (payload_start, payload_len, payload_crc) == (len(head), len(payload), crc)
    assert (head + payload)[payload_start : payload_start + payload_len] == payload


def test_record_round_trip_extremes_and_offset() -> None:
    """Unicode path, unlabelled, huge record number, 16-bit mode, no orientation, inside a larger buffer."""
    m = meta(record=2**40 + 5, label=-1, width=2**32 - 1, height=1, format="PNG", mode="I;16", orientation=0,
             path="ünï/コード/😀.png")
    payload = b"\x89PNG fake payload"
    prefix = b"\x00" * 13
    buf = prefix + record_bytes(m, payload) + b"next record follows"
    got, start, length, crc = decode_record_header(memoryview(buf), len(prefix))
    assert got == m
    assert buf[start : start + length] == payload
    assert crc == zlib.crc32(payload)


def test_record_empty_path_and_payload() -> None:
    m = meta(path="", format="raw")
    got, start, length, _ = decode_record_header(record_bytes(m, b""))
    assert (got.path, start, length) == ("", HEADER, 0)


def test_unknown_pil_format_is_stored_as_other() -> None:
    assert payload_format_code("GIF") == PAYLOAD_FORMATS.index("other")
    assert payload_format_code(None) == PAYLOAD_FORMATS.index("other")
    got, *_ = decode_record_header(record_bytes(meta(format="GIF"), b"GIF89a"))
    assert got.format == "other"


def test_encode_record_refuses_path_longer_than_u16() -> None:
    with pytest.raises(PackFormatError, match="longer than 65535 bytes"):
        encode_record(meta(path="é" * 40000), b"x")  # 80000 UTF-8 bytes


def test_record_header_rejects_bad_magic() -> None:
    buf = bytearray(record_bytes(meta(), b"payload"))
    buf[:4] = b"PLR2"
    with pytest.raises(PackFormatError, match="bad magic"):
        decode_record_header(bytes(buf))


@pytest.mark.parametrize("position", [4, 8, 15, 16, 24, 28, 40, 47, 48, 55, HEADER, HEADER + 5])
def test_record_header_rejects_crc_mismatch(position: int) -> None:
    """A flipped bit anywhere in the header CRC, the header body or the path is caught by the CRC."""
    buf = bytearray(record_bytes(meta(), b"payload"))
    buf[position] ^= 0x01
    with pytest.raises(PackFormatError, match="header checksum mismatch"):
        decode_record_header(bytes(buf))


def test_record_header_rejects_short_buffers_and_bad_offsets() -> None:
    buf = record_bytes(meta(), b"payload")
    with pytest.raises(PackFormatError, match="runs past the end"):
        decode_record_header(buf[: HEADER - 1])
    with pytest.raises(PackFormatError, match="runs past the end"):
        decode_record_header(buf, len(buf) - HEADER + 1)
    with pytest.raises(PackFormatError, match="runs past the end"):
        decode_record_header(buf, -1)
    with pytest.raises(PackFormatError, match="runs past the end"):
        decode_record_header(b"")


def test_record_header_rejects_path_past_end() -> None:
    m = meta()
    head, _ = encode_record(m, b"")
    with pytest.raises(PackFormatError, match="path runs past the end"):
        decode_record_header(head[:-1])


def test_record_header_rejects_payload_past_end() -> None:
    buf = record_bytes(meta(), b"0123456789")
    decode_record_header(buf)  # whole: fine
    with pytest.raises(PackFormatError, match="payload runs past the end"):
        decode_record_header(buf[:-1])


def _forge_header(*, payload_len: int, fmt: int, path: bytes = b"p.png") -> bytes:
    """A header with a *valid* CRC over arbitrary field values (what a buggy writer could produce)."""
    body = struct.pack("<QQIiIIHBB8sI", 0, payload_len, 0, 0, 1, 1, len(path), fmt, 0, b"RGB", 0)
    crc = zlib.crc32(path, zlib.crc32(body))
    return RECORD_MAGIC + struct.pack("<I", crc) + body + path


def test_record_header_rejects_unknown_payload_format() -> None:
    buf = _forge_header(payload_len=0, fmt=len(PAYLOAD_FORMATS))
    with pytest.raises(PackFormatError, match="unknown payload format"):
        decode_record_header(buf)
    # The same forged header with a known code decodes: only the format code is at fault.
    assert decode_record_header(_forge_header(payload_len=0, fmt=0))[0].format == "raw"


def test_record_header_rejects_invalid_utf8_path() -> None:
    """A path that is not UTF-8 under a *correct* CRC (a buggy or hostile writer) is refused."""
    with pytest.raises(PackFormatError, match="not valid UTF-8"):
        decode_record_header(_forge_header(payload_len=0, fmt=1, path=b"caf\xe9.png"))
    assert decode_record_header(_forge_header(payload_len=0, fmt=1, path="café.png".encode()))[0].path == "café.png"


def test_record_header_rejects_huge_payload_len() -> None:
    with pytest.raises(PackFormatError, match="payload runs past the end"):
        decode_record_header(_forge_header(payload_len=2**64 - 1, fmt=1) + b"abc")


# -- index -----------------------------------------------------------------------------------------------


def build_index(paths: list[str], part_of: list[int] | None = None) -> tuple[np.ndarray, bytes, list[RecordMeta]]:
    """Entries and paths blob for records laid out back to back, as the writers lay them out."""
    rows, blob, metas = [], bytearray(), []
    offset = 16
    for i, path in enumerate(paths):
        m = meta(record=i, label=i % 3 - (i == 0), path=path, format=PAYLOAD_FORMATS[i % len(PAYLOAD_FORMATS)],
                 orientation=i % 9, width=10 + i, height=20 + i)
        payload_len = 100 + i
        part = part_of[i] if part_of else 0
        rows.append(index_entry(m, part, offset, payload_len, 1000 + i, len(blob)))
        blob += path.encode("utf-8")
        offset += HEADER + len(path.encode("utf-8")) + payload_len
        metas.append(m)
    entries = np.array(rows, dtype=INDEX_ENTRY) if rows else np.zeros(0, INDEX_ENTRY)
    return entries, bytes(blob), metas


PATHS = ["cat/a.jpg", UNICODE_PATH, "dog/deep/er/b c.PNG", "-dash.webp"]


def test_index_round_trip() -> None:
    entries, blob, metas = build_index(PATHS, part_of=[0, 0, 1, 2])
    raw = encode_index(entries, blob)
    assert len(raw) == INDEX_HEADER.itemsize + len(PATHS) * INDEX_ENTRY.itemsize + len(blob)
    got, paths = decode_index(raw, "idx")
    assert paths == blob
    assert got.dtype == INDEX_ENTRY
    assert got.tobytes() == entries.tobytes()
    assert [entry_path(got, paths, i) for i in range(len(PATHS))] == PATHS
    assert got["part"].tolist() == [0, 0, 1, 2]
    assert got["label"].tolist() == [m.label for m in metas]
    assert [PAYLOAD_FORMATS[f] for f in got["format"]] == [m.format for m in metas]
    # payload_offset is the record offset plus the header and the path
    assert (got["payload_offset"] - got["record_offset"]).tolist() == [HEADER + len(p.encode()) for p in PATHS]


def test_index_round_trip_empty() -> None:
    got, paths = decode_index(encode_index(np.zeros(0, INDEX_ENTRY), b""), "idx")
    assert len(got) == 0 and paths == b""


def test_index_entries_are_read_only_views_of_read_only_buffers() -> None:
    entries, blob, _ = build_index(PATHS)
    got, _ = decode_index(encode_index(entries, blob), "idx")
    with pytest.raises(ValueError):
        got["label"][0] = 5


def _index_header(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, INDEX_HEADER, count=1).copy()


def _with_header(raw: bytes, **fields: int | bytes) -> bytes:
    header = _index_header(raw)
    for name, value in fields.items():
        header[0][name] = value
    return header.tobytes() + raw[INDEX_HEADER.itemsize :]


@pytest.fixture
def index_raw() -> bytes:
    entries, blob, _ = build_index(PATHS)
    return encode_index(entries, blob)


@pytest.mark.parametrize("delta", [-1, 1, 2**40])
def test_decode_index_rejects_wrong_count(index_raw: bytes, delta: int) -> None:
    with pytest.raises(PackFormatError, match=r"where\.bin: index claims"):
        decode_index(_with_header(index_raw, count=len(PATHS) + delta), "where.bin")


@pytest.mark.parametrize("delta", [-1, 1])
def test_decode_index_rejects_wrong_paths_len(index_raw: bytes, delta: int) -> None:
    length = int(_index_header(index_raw)[0]["paths_len"])
    with pytest.raises(PackFormatError, match="index claims"):
        decode_index(_with_header(index_raw, paths_len=length + delta), "idx")


@pytest.mark.parametrize("cut", [1, INDEX_ENTRY.itemsize, -INDEX_HEADER.itemsize])
def test_decode_index_rejects_truncated_or_padded(index_raw: bytes, cut: int) -> None:
    damaged = index_raw[:-cut] if cut > 0 else index_raw + b"\0" * -cut
    with pytest.raises(PackFormatError, match="index claims .* but holds"):
        decode_index(damaged, "idx")


def test_decode_index_rejects_too_short_bad_magic_version_entry_size(index_raw: bytes) -> None:
    with pytest.raises(PackFormatError, match="too short"):
        decode_index(index_raw[: INDEX_HEADER.itemsize - 1], "idx")
    with pytest.raises(PackFormatError, match="not a packload index"):
        decode_index(_with_header(index_raw, magic=b"XXXX"), "idx")
    with pytest.raises(PackFormatError, match="index version 99.*upgrade packload"):
        decode_index(_with_header(index_raw, version=99), "idx")
    with pytest.raises(PackFormatError, match="entries of 48 bytes"):
        decode_index(_with_header(index_raw, entry_size=48), "idx")


def _with_entry(raw: bytes, i: int, **fields: int) -> bytes:
    count = int(_index_header(raw)[0]["count"])
    start = INDEX_HEADER.itemsize
    entries = np.frombuffer(raw, INDEX_ENTRY, count=count, offset=start).copy()
    for name, value in fields.items():
        entries[i][name] = value
    return raw[:start] + entries.tobytes() + raw[start + count * INDEX_ENTRY.itemsize :]


def test_decode_index_rejects_path_past_blob(index_raw: bytes) -> None:
    length = int(_index_header(index_raw)[0]["paths_len"])
    with pytest.raises(PackFormatError, match="points past its paths blob"):
        decode_index(_with_entry(index_raw, 2, path_offset=length), "idx")
    with pytest.raises(PackFormatError, match="points past its paths blob"):
        decode_index(_with_entry(index_raw, 3, path_len=0xFFFF), "idx")


def test_decode_index_rejects_path_offset_overflow(index_raw: bytes) -> None:
    damaged = _with_entry(index_raw, 1, path_offset=2**64 - 1, path_len=2)  # the uint64 sum wraps to 1
    with pytest.raises(PackFormatError, match="points past its paths blob"):
        decode_index(damaged, "idx")


def test_decode_index_rejects_unknown_payload_format(index_raw: bytes) -> None:
    decode_index(_with_entry(index_raw, 2, format=len(PAYLOAD_FORMATS) - 1), "idx")  # the last code is fine
    with pytest.raises(PackFormatError, match="unknown payload format"):
        decode_index(_with_entry(index_raw, 2, format=len(PAYLOAD_FORMATS)), "idx")


def test_entry_path_rejects_invalid_utf8() -> None:
    entries, blob, _ = build_index(["ab", "cd"])
    with pytest.raises(PackFormatError, match="record 1: stored path is not valid UTF-8"):
        entry_path(entries, b"ab\xff\xfe", 1)
    assert entry_path(entries, blob, 1) == "cd"


def test_check_entries_fit_accepts_exact_fit() -> None:
    entries, _, _ = build_index(PATHS, part_of=[0, 0, 1, 1])
    ends = (entries["payload_offset"] + entries["payload_len"]).astype(np.uint64)
    sizes = np.array([ends[1], ends[3]], dtype=np.uint64)
    check_entries_fit(entries, sizes, "idx")  # exactly fits: no error
    check_entries_fit(np.zeros(0, INDEX_ENTRY), np.zeros(0, np.uint64), "idx")
    with pytest.raises(PackFormatError, match="record 3 points past the end of part 1"):
        check_entries_fit(entries, sizes - np.array([0, 1], dtype=np.uint64), "idx")
    with pytest.raises(PackFormatError, match="record 1 points past the end of part 0"):
        check_entries_fit(entries, sizes - np.array([1, 0], dtype=np.uint64), "idx")


def test_check_entries_fit_rejects_out_of_range_part() -> None:
    entries, _, _ = build_index(PATHS, part_of=[0, 1, 2, 3])
    with pytest.raises(PackFormatError, match="index names part 3 but the pack has 3"):
        check_entries_fit(entries, np.full(3, 10**9, dtype=np.uint64), "where.bin")


def test_check_entries_fit_rejects_offset_past_end() -> None:
    entries, _, _ = build_index(PATHS)
    entries = entries.copy()
    entries[2]["payload_offset"] = 10**9
    with pytest.raises(PackFormatError, match=r"where\.bin: record 2 points past the end of part 0"):
        check_entries_fit(entries, np.array([10**6], dtype=np.uint64), "where.bin")


def test_check_entries_fit_rejects_uint64_overflow() -> None:
    entries, _, _ = build_index(PATHS)
    entries = entries.copy()
    entries[1]["payload_offset"] = 2**64 - 8
    entries[1]["payload_len"] = 16  # offset + length wraps to 8, inside the part
    with pytest.raises(PackFormatError, match="record 1 points past the end"):
        check_entries_fit(entries, np.array([10**6], dtype=np.uint64), "idx")


# -- manifest --------------------------------------------------------------------------------------------


def valid_manifest() -> dict:
    return {"format": FORMAT_NAME, "version": FORMAT_VERSION, "backend": "shards", "encoding": "keep",
            "records": 3, "classes": ["cat", "dög"], "skipped": [], "parts": [{"name": "shard-00000.bin"}]}


def test_manifest_round_trip() -> None:
    manifest = valid_manifest()
    raw = encode_manifest(manifest)
    assert "dög".encode() in raw  # UTF-8, not \\u escapes
    assert raw == encode_manifest(dict(reversed(list(manifest.items()))))  # key order does not matter
    assert decode_manifest(raw, "m.json") == manifest


@pytest.mark.parametrize("raw", [b"", b"{not json", b"\xff\xfe{}", b"{\"format\": \"packload\""])
def test_manifest_rejects_non_json(raw: bytes) -> None:
    with pytest.raises(PackFormatError, match=r"m\.json: manifest is not valid JSON"):
        decode_manifest(raw, "m.json")


@pytest.mark.parametrize("value", [[], "packload", 1, None])
def test_manifest_rejects_non_object(value: object) -> None:
    with pytest.raises(PackFormatError, match="not a packload manifest"):
        decode_manifest(json.dumps(value).encode(), "m.json")


@pytest.mark.parametrize("name", ["ffcv", "Packload", None])
def test_manifest_rejects_wrong_format_name(name: object) -> None:
    with pytest.raises(PackFormatError, match="not a packload manifest"):
        decode_manifest(encode_manifest(dict(valid_manifest(), format=name)), "m.json")


@pytest.mark.parametrize("version", [0, 2, 99, "1", None])
def test_manifest_rejects_unknown_version(version: object) -> None:
    with pytest.raises(PackFormatError, match=f"version {version!r}.*upgrade packload"):
        decode_manifest(encode_manifest(dict(valid_manifest(), version=version)), "m.json")


@pytest.mark.parametrize("field", ["backend", "encoding", "records", "classes", "skipped"])
def test_manifest_rejects_missing_field(field: str) -> None:
    manifest = valid_manifest()
    del manifest[field]
    with pytest.raises(PackFormatError, match=f"manifest lacks {field}"):
        decode_manifest(encode_manifest(manifest), "m.json")


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("backend", "zip", "unknown backend or encoding"),
        ("encoding", "avif", "unknown backend or encoding"),
        ("records", -1, "record count -1 is not valid"),
        ("records", "3", "record count '3' is not valid"),
        ("records", 3.0, "record count 3.0 is not valid"),
        ("classes", "cat", "classes must be a list"),
        ("classes", ["cat", 1], "classes must be a list"),
        ("classes", None, "classes must be a list"),
    ],
)
def test_manifest_rejects_bad_types(field: str, value: object, match: str) -> None:
    with pytest.raises(PackFormatError, match=match):
        decode_manifest(encode_manifest(dict(valid_manifest(), **{field: value})), "m.json")


def test_manifest_rejects_boolean_record_count() -> None:
    with pytest.raises(PackFormatError):
        decode_manifest(encode_manifest(dict(valid_manifest(), records=True)), "m.json")


def test_manifest_rejects_non_list_skipped() -> None:
    with pytest.raises(PackFormatError):
        decode_manifest(encode_manifest(dict(valid_manifest(), skipped=5)), "m.json")


def test_manifest_rejects_deeply_nested_json() -> None:
    raw = b'{"format": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(PackFormatError):
        decode_manifest(raw, "m.json")


# -- fuzzing ---------------------------------------------------------------------------------------------

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _forged_record(fields: tuple, path: bytes, tail: bytes) -> bytes:
    """Magic, a correct header CRC over arbitrary field values and path, then arbitrary bytes."""
    record, payload_len, crc, label, width, height, fmt, orientation, mode = fields
    body = struct.pack("<QQIiIIHBB8sI", record, payload_len, crc, label, width, height, len(path), fmt,
                       orientation, mode, 0)
    return RECORD_MAGIC + struct.pack("<I", zlib.crc32(path, zlib.crc32(body))) + body + path + tail


record_fields = st.tuples(
    st.integers(0, 2**64 - 1), st.one_of(st.integers(0, 64), st.integers(0, 2**64 - 1)), st.integers(0, 2**32 - 1),
    st.integers(-(2**31), 2**31 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(0, 255),
    st.integers(0, 255), st.binary(min_size=0, max_size=8),
)
record_buffers = st.one_of(
    st.binary(max_size=200),
    st.binary(max_size=200).map(lambda rest: RECORD_MAGIC + rest),
    st.builds(_forged_record, record_fields, st.binary(max_size=40), st.binary(max_size=80)),
)


@FUZZ
@given(buf=record_buffers, offset=st.one_of(st.just(0), st.integers(-4, 64)))
def test_fuzz_decode_record_header_raises_only_pack_format_error(buf: bytes, offset: int) -> None:
    try:
        m, start, length, _ = decode_record_header(buf, offset)
    except PackFormatError:
        return
    assert m.format in PAYLOAD_FORMATS
    assert 0 <= offset and offset + HEADER <= start and start + length <= len(buf)


@FUZZ
@given(
    path=st.text(max_size=30),
    payload=st.binary(max_size=60),
    fmt=st.sampled_from(PAYLOAD_FORMATS),
    data=st.data(),
)
def test_fuzz_single_byte_flip_in_a_valid_record(path: str, payload: bytes, fmt: str, data: st.DataObject) -> None:
    """A flipped byte in the header or path is always refused; one in the payload leaves the header
    readable and unchanged (the payload CRC, which readers check, then no longer matches)."""
    m = meta(path=path, format=fmt)
    buf = bytearray(record_bytes(m, payload))
    position = data.draw(st.integers(0, len(buf) - 1))
    buf[position] ^= data.draw(st.integers(1, 255))
    head_len = HEADER + len(path.encode("utf-8", "surrogateescape"))
    if position < head_len:
        with pytest.raises(PackFormatError):
            decode_record_header(bytes(buf))
    else:
        got, start, length, crc = decode_record_header(bytes(buf))
        assert got == m and (start, length) == (head_len, len(payload))
        assert zlib.crc32(bytes(buf[start : start + length])) != crc


def _index_with_rest(rest: bytes) -> bytes:
    return INDEX_MAGIC + struct.pack("<I", FORMAT_VERSION) + rest


def _consistent_index(count: int, paths_len: int, body: bytes) -> bytes:
    """A header whose counts match the blob size, over arbitrary entry and path bytes."""
    need = count * INDEX_ENTRY.itemsize + paths_len
    body = (body * (need // max(len(body), 1) + 1))[:need] if body else b"\0" * need
    header = struct.pack("<4sIQIIQ", INDEX_MAGIC, FORMAT_VERSION, count, INDEX_ENTRY.itemsize,
                         0, paths_len)
    return header + body


index_buffers = st.one_of(
    st.binary(max_size=300),
    st.binary(max_size=300).map(_index_with_rest),
    st.builds(_consistent_index, st.integers(0, 4), st.integers(0, 40), st.binary(max_size=300)),
)


@FUZZ
@given(buf=index_buffers, parts=st.lists(st.integers(0, 2**64 - 1), max_size=3))
def test_fuzz_decode_index_raises_only_pack_format_error(buf: bytes, parts: list[int]) -> None:
    try:
        entries, paths = decode_index(buf, "fuzz")
    except PackFormatError:
        return
    assert len(buf) == INDEX_HEADER.itemsize + len(entries) * INDEX_ENTRY.itemsize + len(paths)
    try:
        check_entries_fit(entries, np.array(parts, dtype=np.uint64), "fuzz")
    except PackFormatError:
        return
    ends = entries["payload_offset"].astype(object) + entries["payload_len"].astype(object)
    for part, end in zip(entries["part"].tolist(), ends.tolist(), strict=True):
        assert end <= parts[part]


@FUZZ
@given(data=st.data())
def test_fuzz_single_byte_flip_in_a_valid_index(data: st.DataObject) -> None:
    """Any flip in the index header (but its reserved word) is refused; elsewhere the index either
    decodes to the same shape or is refused, never with another exception."""
    paths = data.draw(st.lists(st.text(max_size=12), min_size=0, max_size=4))
    entries, blob, _ = build_index(paths)
    buf = bytearray(encode_index(entries, blob))
    position = data.draw(st.integers(0, len(buf) - 1))
    buf[position] ^= data.draw(st.integers(1, 255))
    reserved = range(20, 24)
    if position < INDEX_HEADER.itemsize and position not in reserved:
        with pytest.raises(PackFormatError):
            decode_index(bytes(buf), "fuzz")
        return
    try:
        got, got_paths = decode_index(bytes(buf), "fuzz")
    except PackFormatError:
        assert position >= INDEX_HEADER.itemsize  # only a damaged path_offset/path_len may be refused here
        return
    assert len(got) == len(paths) and len(got_paths) == len(blob)
