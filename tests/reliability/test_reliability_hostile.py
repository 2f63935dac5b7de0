"""Reliability, hostile packs and files: crafted indexes and manifests (huge counts, negative or
out-of-range offsets, bad labels, unknown versions, shard names with ``..``), record paths that
would escape the unpack folder, and decompression bombs. Each is refused by our one-line error;
nothing is written outside the target folder and nothing is unpickled. Also the file-system limits
(disk full, file-size limit) and LMDB map growth. The full counts run from ``benchmarks/reliability.py``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from packload import PackedImageFolder
from packload.core.errors import PackFormatError
from packload.loaders.verify import verify
from tests.reliability.crafted import craft_pack, jpeg_bomb, jpeg_bytes
from tests.reliability.full_disk import lmdb_map_growth_check, write_limit_check
from tests.reliability.hostile import hostile_suite
from tests.reliability.packs import make_source, pack_both, pack_small, records_of


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_source(tmp_path_factory.mktemp("src"), per_class=4)


@pytest.fixture(scope="module")
def packs(source: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return pack_both(source, tmp_path_factory.mktemp("packs"))


def test_hostile_packs_are_refused(packs: dict[str, Path], tmp_path: Path) -> None:
    result = hostile_suite(packs, tmp_path / "hostile")
    assert result["problems"] == []
    assert result["cases"] >= 60
    assert result["pack_time_bomb_runs"] == 12  # 4 check/encoding modes x 2 backends, and --strict in each mode
    outcomes = result["outcomes"]
    # spot checks of what the suite judged: the messages are ours and say what is wrong
    assert outcomes["lmdb: label 99 of 3 classes"]["read (checksums off)"].startswith("refused")
    assert "would escape the output folder" in outcomes["shards: record path '../escape.png'"]["unpack"]
    assert "version 2" in outcomes["shards: index version 2"]["info"]
    assert "upgrade packload" in outcomes["lmdb: manifest version 2"]["read (checksums on)"]
    assert not (tmp_path / "escape.png").exists() and not (tmp_path / "hostile" / "absolute.png").exists()


@pytest.mark.parametrize("backend", ["lmdb", "shards"])
def test_jpeg_bomb_is_refused_on_the_fast_decoder_too(tmp_path: Path, backend: str) -> None:
    """libjpeg-turbo does not apply PIL's pixel limit; the reader must, before allocating."""
    pack = craft_pack(tmp_path / f"b.{backend}", [("a/ok.jpg", 0, jpeg_bytes()), ("a/bomb.jpg", 0, jpeg_bomb())])
    for output in ("numpy", "tensor", "pil"):
        ds = PackedImageFolder(pack, output=output, fast_jpeg=True, verify=True)
        assert tuple(ds[0][0].shape if output != "pil" else ds[0][0].size[::-1])[:2] in ((40, 48), (3, 40))
        with pytest.raises(PackFormatError, match="MAX_IMAGE_PIXELS on purpose"):
            ds[1]
    report = verify(pack, decode=True, progress=False)
    assert [bad["record"] for bad in report["bad_records"]] == [1]
    assert "MAX_IMAGE_PIXELS" in report["bad_records"][0]["problem"]


def test_unpack_of_a_hostile_path_writes_nothing(tmp_path: Path) -> None:
    from tests.reliability.packs import cli

    pack = craft_pack(tmp_path / "h.shards", [("a/fine.jpg", 0, jpeg_bytes()), ("../../evil.jpg", 0, jpeg_bytes())])
    out = tmp_path / "deep" / "out"
    code, err = cli(["unpack", "--quiet", str(pack), str(out)])
    assert code == 1 and "would escape the output folder" in err and len(err.strip().splitlines()) == 1
    assert not out.exists() and not (tmp_path / "evil.jpg").exists()


@pytest.mark.parametrize("backend", ["lmdb", "shards"])
def test_file_size_limit_then_resume(source: Path, packs: dict[str, Path], tmp_path: Path, backend: str) -> None:
    big = make_source(tmp_path / "big", per_class=2, big=4)
    reference = tmp_path / f"ref.{backend}"
    pack_small(big, reference)
    limit = 300_000 if backend == "lmdb" else 40_000  # shards are small files: a limit below one
    result = write_limit_check(big, tmp_path, reference, backend, "fsize", limit)
    assert result["problems"] == [], result
    assert result["exit"] == 1 and "--resume" in result["error"]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small filesystem needs root")
@pytest.mark.parametrize("backend", ["lmdb", "shards"])
def test_disk_full_then_resume(tmp_path: Path, backend: str) -> None:
    big = make_source(tmp_path / "big", per_class=2, big=4)
    reference = tmp_path / f"ref.{backend}"
    pack_small(big, reference)
    result = write_limit_check(big, tmp_path, reference, backend, "tmpfs", 400_000)
    if "skipped" in result:
        pytest.skip(result["skipped"])
    assert result["problems"] == [], result


def test_lmdb_map_full_grows(source: Path, packs: dict[str, Path], tmp_path: Path) -> None:
    result = lmdb_map_growth_check(make_source(tmp_path / "src", per_class=3, big=3), tmp_path / "g.lmdb",
                                   _reference(tmp_path))
    assert result["problems"] == []
    assert result["final_map"] > result["start_map"]


def _reference(tmp_path: Path) -> Path:
    ref = tmp_path / "ref.lmdb"
    pack_small(tmp_path / "src", ref)
    assert records_of(ref)
    return ref
