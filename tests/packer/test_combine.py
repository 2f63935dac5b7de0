"""Joining written records into a new pack without re-encoding (``packload.packer.combine``): shards
placed as new parts, renumbered and relabelled in place with their header CRCs right, untouched
shards hard-linked, damaged ones refused, the joined index, and records copied one by one."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from packload import pack
from packload.core.errors import PackFormatError
from packload.core.format import decode_index, decode_record_header, decode_shard_header, entry_path
from packload.loaders.read import PackReader
from packload.packer.combine import (
    ShardPayloads,
    ShardSource,
    copy_records,
    joined_index,
    label_map,
    place_shards,
)
from tests.image_factory import write_image


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("combine")
    for k in range(8):  # PNGs of tens of KB: several 64 KiB shards
        write_image(root / "src" / "ab"[k % 2] / f"img{k}.png", size=(120, 100), seed=k)
    pack(root / "src", root / "p.shards", workers=1, progress=False, shard_size=64 << 10)
    return root / "p.shards"


def _source(pack_path: Path, new_classes: list[str] | None = None) -> tuple[ShardSource, list[tuple]]:
    with PackReader(pack_path) as reader:
        mapping = None if new_classes is None else label_map(reader.classes, new_classes)
        source = ShardSource(pack_path, list(reader.manifest["parts"]), reader.entries.copy(), bytes(reader.paths),
                             mapping)
        records = [(reader.path_of(i), int(reader.entries["label"][i]), bytes(reader.payload(i)))
                   for i in range(reader.records)]
    return source, records


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_label_map() -> None:
    assert label_map(["a", "b"], ["a", "b", "c"]) is None  # nothing moves
    assert label_map(["b", "d"], ["a", "b", "c", "d"]).tolist() == [1, 3]


def test_placed_shards_are_renumbered_and_relabelled_and_the_source_is_untouched(shards: Path,
                                                                                   tmp_path: Path) -> None:
    before = _files(shards)
    source, records = _source(shards, ["0", "a", "b"])
    assert len(source.parts) >= 2
    out = tmp_path / "out"
    out.mkdir()
    placed = place_shards(source, out, part_base=3, record_base=100)
    assert _files(shards) == before
    assert [p["name"] for p in placed] == [f"shard-{3 + k:05d}.bin" for k in range(len(source.parts))]
    number = 100
    for k, part in enumerate(placed):
        data = (out / part["name"]).read_bytes()
        assert part["sha256"] == hashlib.sha256(data).hexdigest() and part["size"] == len(data)
        assert decode_shard_header(data[:16]) is not None and int.from_bytes(data[8:12], "little") == 3 + k
        for row in source.entries[source.entries["part"] == k]:
            meta, start, length, _ = decode_record_header(data, int(row["record_offset"]))  # its CRC checked
            path, label, payload = records[number - 100]
            assert (meta.record, meta.path, meta.label) == (number, path, label + 1)
            assert data[start : start + length] == payload
            number += 1
    assert number == 100 + len(records)


def test_a_shard_that_needs_no_change_is_linked(shards: Path, tmp_path: Path) -> None:
    source, _ = _source(shards)
    out = tmp_path / "out"
    out.mkdir()
    placed = place_shards(source, out, part_base=0, record_base=0)
    assert [p["sha256"] for p in placed] == [p["sha256"] for p in source.parts]
    assert all(os.stat(out / p["name"]).st_ino == os.stat(shards / p["name"]).st_ino for p in placed)


def test_a_damaged_shard_is_refused(shards: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy.shards"
    shutil.copytree(shards, copy)
    source, _ = _source(copy, ["0", "a", "b"])
    victim = copy / source.parts[0]["name"]
    data = bytearray(victim.read_bytes())
    data[int(source.entries["payload_offset"][0])] ^= 0x40
    victim.write_bytes(bytes(data))
    (tmp_path / "out").mkdir()
    with pytest.raises(PackFormatError, match="sha256 differs from the manifest"):
        place_shards(source, tmp_path / "out", part_base=1, record_base=0)


def test_the_joined_index_renumbers_parts_and_concatenates_paths(shards: Path) -> None:
    first, records = _source(shards)
    second, _ = _source(shards, ["b", "a"])
    blob, labels = joined_index([first, second], [0, len(first.parts)])
    entries, paths = decode_index(blob, "joined")
    n = len(records)
    assert len(entries) == 2 * n
    assert [entry_path(entries, paths, i) for i in range(2 * n)] == [p for p, _, _ in records] * 2
    assert entries["part"][n:].tolist() == (first.entries["part"] + len(first.parts)).tolist()
    assert labels.tolist() == [lab for _, lab, _ in records] + [1 - lab for _, lab, _ in records]


def test_records_are_copied_one_by_one_as_stored(shards: Path) -> None:
    source, records = _source(shards, ["a", "x", "b"])
    got: list = []
    payloads = ShardPayloads(source)
    try:
        copied = copy_records(source.entries, source.paths, payloads, got.append, source.label_map)
    finally:
        payloads.close()
    assert copied == sum(len(p) for _, _, p in records)
    assert [(e.path, e.label, e.payload) for e in got] == [(p, 2 * lab, data) for p, lab, data in records]
    assert [e.crc32 for e in got] == source.entries["payload_crc32"].tolist()
    assert all((e.format, e.width, e.height, e.mode) == ("PNG", 120, 100, "RGB") for e in got)
    assert np.array_equal(source.mapped_labels(), 2 * source.entries["label"])
