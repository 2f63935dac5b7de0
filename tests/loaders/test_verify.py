"""``info`` and ``verify`` (``packload.loaders.verify``): what a pack holds, and every byte checked
against its checksums, each damage named (the record and its path, or the file), on both backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from packload.loaders.read import PackReader
from packload.loaders.verify import file_problems, info, manifest_problems, record_problem, verify
from tests.reliability.corruption import corruption_regions, flip_bit
from tests.reliability.crafted import copy_pack, craft_pack, jpeg_bytes, rewrite
from tests.reliability.packs import both_backends, records_of

BACKENDS = ["lmdb", "shards"]


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return both_backends(tmp_path_factory.mktemp("verify"), per_class=4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_info_says_what_the_pack_holds(packs: dict[str, Path], backend: str) -> None:
    got = info(packs[backend])
    assert (got["backend"], got["encoding"], got["format_version"], got["records"]) == (backend, "keep", 1, 12)
    assert got["classes"] == ["a", "b", "c"] and got["class_counts"] == {"a": 4, "b": 4, "c": 4}
    assert got["labelled"] and got["skipped_count"] == len(got["skipped"]) == 5  # the broken files of b
    assert got["payload_bytes"] == sum(len(p) for _, _, p in records_of(packs[backend]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_intact_pack_verifies(packs: dict[str, Path], backend: str) -> None:
    report = verify(packs[backend], decode=True, progress=False)
    assert report["ok"] and report["records"] == 12 and report["decoded"]
    assert report["bad_records"] == [] and report["bad_files"] == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_damaged_payload_names_its_record(packs: dict[str, Path], backend: str, tmp_path: Path) -> None:
    pack = copy_pack(packs[backend], tmp_path / f"d{packs[backend].suffix}")
    region = corruption_regions(pack)["payload"][5]
    flip_bit(pack / region.file if region.file else pack, (region.start + region.end) // 2, 2)
    report = verify(pack, progress=False)
    assert not report["ok"]
    with PackReader(pack) as reader:
        path = reader.path_of(5)
        assert record_problem(reader, 5) == "payload checksum mismatch: the stored bytes are damaged"
        assert record_problem(reader, 5, payload=False) is None and record_problem(reader, 4) is None
    assert [(b["record"], b["path"]) for b in report["bad_records"]] == [(5, path)]
    if backend == "shards":  # the shard's whole-file checksum fails too
        assert [b["file"] for b in report["bad_files"]] == [region.file]


def test_a_damaged_record_header_is_named(packs: dict[str, Path], tmp_path: Path) -> None:
    pack = copy_pack(packs["shards"], tmp_path / "h.shards")
    region = corruption_regions(pack)["record header"][2]
    flip_bit(pack / region.file, region.start + 28, 0)  # the label
    report = verify(pack, progress=False)
    assert [b["record"] for b in report["bad_records"]] == [2]
    assert report["bad_records"][0]["problem"].startswith("record header damaged")


def test_manifest_counts_that_disagree_with_the_index_are_reported(packs: dict[str, Path], tmp_path: Path) -> None:
    pack = copy_pack(packs["lmdb"], tmp_path / "m.lmdb")
    with PackReader(pack) as reader:
        manifest = dict(reader.manifest)
    rewrite(pack, manifest=dict(manifest, class_counts={"a": 5, "b": 4, "c": 3}, payload_bytes=7))
    with PackReader(pack) as reader:
        assert file_problems(reader) == []
        assert [p["problem"] for p in manifest_problems(reader)] == ["class_counts disagree with the index",
                                                                     "payload_bytes disagrees with the index"]
    assert not verify(pack, progress=False)["ok"]


def test_decode_finds_a_payload_whose_checksum_is_right(tmp_path: Path) -> None:
    pack = craft_pack(tmp_path / "c.shards", [("a/fine.jpg", 0, jpeg_bytes()), ("a/junk.jpg", 0, b"not a jpeg")])
    assert verify(pack, progress=False)["ok"]  # every checksum is right
    report = verify(pack, decode=True, progress=False)
    assert [b["path"] for b in report["bad_records"]] == ["a/junk.jpg"]
    assert report["bad_records"][0]["problem"].startswith("does not decode")
