"""Reliability, corruption: random bit flips in payloads, record headers, indexes, manifests and
shard headers of both backends, and files cut at random lengths. ``verify`` names every damaged
record; readers with checksums on never return a wrong image without an error, never crash (they
run in a child process) and never allocate absurd memory (its address space is capped). The full
counts run from ``benchmarks/reliability.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.corruption import corruption_campaign, corruption_regions, manifest_field
from tests.reliability.decoder_fuzz import fuzz_decoders
from tests.reliability.packs import both_backends


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return both_backends(tmp_path_factory.mktemp("corrupt"), per_class=10)


@pytest.mark.parametrize("backend", ["lmdb", "shards"])
def test_regions_cover_every_record(packs: dict[str, Path], backend: str) -> None:
    regions = corruption_regions(packs[backend])
    assert len(regions["record header"]) == len(regions["payload"]) == 30
    assert [r.record for r in regions["payload"]] == list(range(30))
    assert regions["index"] and regions["manifest"]
    if backend == "shards":
        assert len(regions["shard header"]) >= 2  # small shards: several of them
    else:  # LMDB's own pages (meta, B-tree), outside every value
        values = [r for kind, rs in regions.items() if kind != "lmdb pages" for r in rs]
        assert regions["lmdb pages"] and not any(
            v.start <= p.start < v.end for p in regions["lmdb pages"][:200] for v in values)


@pytest.mark.parametrize("backend", ["lmdb", "shards"])
def test_bit_flips_and_truncations(packs: dict[str, Path], backend: str) -> None:
    pack = packs[backend]
    before = {p: p.read_bytes() for p in ([pack] if pack.is_file() else sorted(pack.iterdir()))}
    result = corruption_campaign(pack, flips=20, truncations=6, seed=11)
    assert result["problems"] == []
    counts = result["counts"]
    # every payload and header flip was named by verify
    for kind in ("payload", "record header"):
        assert counts[kind] == {"reported by verify": sum(counts[kind].values())}, counts
    assert sum(sum(c.values()) for k, c in counts.items() if k.startswith("truncation")) == 6
    assert result["checker_starts"] == 1  # the reader child never crashed or hung
    after = {p: p.read_bytes() for p in before}
    assert after == before  # each damage was undone


def test_manifest_field_names_the_top_level_key() -> None:
    raw = b'{\n "classes": [\n  "a"\n ],\n "skipped": [\n  {\n   "path": "x",\n   "reason": "y"\n  }\n ]\n}\n'
    assert manifest_field(raw, raw.index(b'"a"')) == "classes"
    assert manifest_field(raw, raw.index(b'"y"')) == "skipped"
    assert manifest_field(raw, raw.index(b"kipped")) == "skipped"


def test_fuzz_decoders_raise_only_our_error() -> None:
    result = fuzz_decoders(examples=150, seed=1)
    assert result["problems"] == []
    assert result["examples"] == {"record header": 150, "index": 150, "manifest": 150}


@pytest.mark.parametrize("backend", ["lmdb", "shards"])
def test_checked_reader_refuses_a_damaged_label(packs: dict[str, Path], tmp_path: Path, backend: str) -> None:
    """Labels live in the index, which no record CRC covers: with checksums on, the reader checks the
    index against the manifest's sha256, so a flipped label is an error, not a wrong target."""
    from packload import PackedImageFolder
    from packload.core.errors import ChecksumError
    from tests.reliability.corruption import corruption_regions, flip_bit
    from tests.reliability.crafted import copy_pack

    pack = copy_pack(packs[backend], tmp_path / f"label.{backend}")
    index = corruption_regions(pack)["index"][0]
    flip_bit(pack / index.file if index.file else pack, index.start + 32 + 4, 1)  # entry 0's label: 0 -> 2
    unchecked = PackedImageFolder(pack)
    assert unchecked.targets[0] == 2  # without checksums the damage passes: what verify=True is for
    with pytest.raises(ChecksumError, match="index does not match the sha256"):
        PackedImageFolder(pack, verify=True)



def test_verify_does_not_size_arrays_by_a_damaged_part_number(packs: dict[str, Path], tmp_path: Path) -> None:
    """Found by the full run: a flipped high bit in an LMDB entry's part made verify ask for 4 GiB."""
    from packload.core.errors import PackFormatError
    from packload.loaders.verify import verify
    from tests.reliability.crafted import address_space_cap, copy_pack, index_with, rewrite

    pack = copy_pack(packs["lmdb"], tmp_path / "part.lmdb")
    rewrite(pack, index=index_with(pack, part=(0, 2**29)), fix_sha=False)
    with address_space_cap(1 << 30), pytest.raises(PackFormatError, match="chunk 536870912 is missing"):
        verify(pack, progress=False)


@pytest.mark.parametrize("backend", ["lmdb", "shards"])
def test_reader_does_not_prefetch_a_damaged_length(packs: dict[str, Path], tmp_path: Path, backend: str) -> None:
    """Found by the full run: a flipped high bit in an entry's payload length made the batch
    prefetch size its arrays by it (terabytes), before the read could report the damage."""
    from packload import PackedImageFolder
    from packload.core.errors import PackloadError
    from tests.reliability.crafted import address_space_cap, copy_pack, index_with, rewrite

    pack = copy_pack(packs[backend], tmp_path / f"length.{backend}")
    rewrite(pack, index=index_with(pack, payload_len=(3, 2**40 + 5)), fix_sha=False)
    with address_space_cap(1 << 30), pytest.raises(PackloadError, match="record 3"):
        ds = PackedImageFolder(pack, output="numpy")  # shards: refused here (part sizes are known)
        ds.__getitems__(list(range(8)))  # lmdb: chunk sizes are known only when read
