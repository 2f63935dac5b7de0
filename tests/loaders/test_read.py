"""``PackReader`` (``packload.loaders.read``): payloads handed out as the pack stores them, one at a
time or batched, as views or bytes, checked against their CRC on request; every field checked when
the pack is opened; and the paths that are no pack refused with what to do."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from packload.core.errors import ChecksumError, IncompletePackError, PackFormatError, UsageError
from packload.loaders.read import PackReader, detect_backend
from tests.reliability.corruption import corruption_regions, flip_bit
from tests.reliability.crafted import copy_pack, index_with, rewrite
from tests.reliability.packs import both_backends, records_of

BACKENDS = ["lmdb", "shards"]


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return both_backends(tmp_path_factory.mktemp("read"), per_class=4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_payloads_one_at_a_time_and_batched_agree(packs: dict[str, Path], backend: str) -> None:
    expected = records_of(packs[backend])
    with PackReader(packs[backend]) as reader:
        assert reader.backend == backend and reader.records == len(expected) == 12
        assert reader.classes == ["a", "b", "c"] and reader.labels().tolist() == [lab for _, lab, _ in expected]
        order = [11, 0, 5, 5, -1, 3]
        want = [expected[i][2] for i in order]
        assert [bytes(reader.payload(i)) for i in order] == want
        assert [bytes(v) for v in reader.payloads(order, verify=True)] == want
        assert reader.payload_bytes(order, verify=True) == want
        assert [reader.path_of(i) for i in (0, -1)] == [expected[0][0], expected[-1][0]]
        assert reader.format_of(0) in ("JPEG", "PNG") and reader.identity == reader.manifest["id"]
        with pytest.raises(IndexError, match="record 12 out of range"):
            reader.payload(12)
        with pytest.raises(IndexError, match="record -13 out of range"):
            reader.payloads([0, -13])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_damaged_payload_is_refused_with_checksums_on(packs: dict[str, Path], backend: str,
                                                        tmp_path: Path) -> None:
    pack = copy_pack(packs[backend], tmp_path / f"d{packs[backend].suffix}")
    region = corruption_regions(pack)["payload"][7]
    flip_bit(pack / region.file if region.file else pack, region.start, 0)
    with PackReader(pack) as reader:
        assert bytes(reader.payload(7)) != records_of(packs[backend])[7][2]  # checksums off: as stored
        for read in (lambda: reader.payload(7, verify=True), lambda: reader.payloads([6, 7], verify=True),
                     lambda: reader.payload_bytes([7], verify=True)):
            with pytest.raises(ChecksumError, match=f"record 7 \\({reader.path_of(7)}\\)"):
                read()


def test_what_the_index_says_is_checked_at_open(packs: dict[str, Path], tmp_path: Path) -> None:
    pack = copy_pack(packs["shards"], tmp_path / "labels.shards")
    rewrite(pack, index=index_with(pack, label=(2, 3)))  # a fourth class of three
    with pytest.raises(PackFormatError, match="labels outside the manifest's 3 classes"):
        PackReader(pack)
    pack = copy_pack(packs["shards"], tmp_path / "count.shards")
    with PackReader(pack) as reader:
        manifest = dict(reader.manifest)
    rewrite(pack, manifest=dict(manifest, records=11))
    with pytest.raises(PackFormatError, match="manifest says 11 records, index holds 12"):
        PackReader(pack)
    pack = copy_pack(packs["lmdb"], tmp_path / "sha.lmdb")
    rewrite(pack, index=index_with(pack, orientation=(0, 3)), fix_sha=False)
    PackReader(pack).close()  # an orientation in range opens...
    with pytest.raises(ChecksumError, match="does not match the sha256"):
        PackReader(pack, check_index=True)  # ...but not where the index must match the manifest


def test_paths_that_are_no_pack(packs: dict[str, Path], tmp_path: Path) -> None:
    assert detect_backend(packs["lmdb"]) == "lmdb" and detect_backend(packs["shards"]) == "shards"
    with pytest.raises(UsageError, match="no such pack"):
        PackReader(tmp_path / "missing.lmdb")
    os.mkfifo(tmp_path / "fifo.lmdb")
    with pytest.raises(UsageError, match="not a file or folder"):
        PackReader(tmp_path / "fifo.lmdb")
    (tmp_path / "half.shards.partial").mkdir()
    with pytest.raises(IncompletePackError, match="--resume"):
        PackReader(tmp_path / "half.shards")
    with pytest.raises(IncompletePackError, match="unfinished pack"):
        PackReader(tmp_path / "half.shards.partial")


def test_a_reader_is_not_sent_to_other_processes_and_not_used_closed(packs: dict[str, Path]) -> None:
    reader = PackReader(packs["shards"])
    with pytest.raises(TypeError, match="pass the pack's path"):
        pickle.dumps(reader)
    reader.close()
    assert reader.closed and reader.advise([0, 1]) == 0
    with pytest.raises(PackFormatError, match="this reader is closed"):
        reader.part_view(0)
