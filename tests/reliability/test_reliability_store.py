"""Reliability, the object-store surfaces: the block cache owns only what it wrote and serves only what
it recorded, a pack replaced under an open reader is refused and never mixed, URL destinations keep
the local rules, every request has a deadline, and URLs never show their secrets. Small counts of
``tests/reliability/object_store.py``; ``benchmarks/reliability.py --only store`` runs the full ones."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[dev]')")
pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")

from packload.packer.pipeline import pack  # noqa: E402
from tests.image_factory import make_image_folder, write_broken_files  # noqa: E402
from tests.object_store import ObjectStore  # noqa: E402
from tests.reliability import object_store as checks  # noqa: E402

BUCKET = "bkt-reliability"  # moto keeps one store per process: a bucket of this file's own


@pytest.fixture(scope="module")
def store():
    with ObjectStore() as s:
        s.make_bucket(BUCKET)
        yield s


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("store-packs")
    make_image_folder(root / "a", classes=("ant", "bee", "cow"), per_class=10)
    make_image_folder(root / "b", classes=("dog", "emu"), per_class=13, seed=9)
    write_broken_files(root / "broken" / "x")
    pack(root / "a", root / "a.shards", shard_size=1 << 16, progress=False)
    pack(root / "b", root / "b.shards", shard_size=1 << 16, progress=False)
    pack(root / "a", root / "a.lmdb", progress=False)
    return {name: root / name for name in ("a", "b", "broken", "a.shards", "b.shards", "a.lmdb")}


def test_the_cache_owns_only_what_it_wrote(tmp_path: Path) -> None:
    result = checks.cache_ownership(tmp_path, runs=6)
    assert result["problems"] == []
    assert result["puts"] >= 120 and result["user_files"] >= 30


def test_damaged_cache_entries_are_never_served(store, packs, tmp_path: Path) -> None:
    result = checks.cache_damage(store, BUCKET, packs["a.shards"], tmp_path, events=2 * len(checks.DAMAGES))
    assert result["problems"] == []
    assert set(result["by_kind"]) == set(checks.DAMAGES) and result["refetched"] >= len(checks.DAMAGES)


def test_a_pack_replaced_under_a_reader_is_refused_never_mixed(store, packs, tmp_path: Path) -> None:
    result = checks.replaced_under_reader(store, BUCKET, packs["a.shards"], packs["b.shards"], packs["b"], tmp_path,
                                          runs=len(checks.REPLACEMENTS))
    assert result["problems"] == []
    assert result["refused"] > 0 and result["served"] > 0


def test_url_destinations_keep_the_local_rules(store, packs, tmp_path: Path) -> None:
    result = checks.destinations(store, BUCKET, packs, tmp_path)
    assert result["problems"] == []
    assert result["refused"] == result["attempts"] == 32 and result["failed_packs"] == 4


def test_a_stalled_store_is_given_up_on_in_bounded_time(store, packs, tmp_path: Path) -> None:
    result = checks.stalls(store, BUCKET, packs["a.shards"], packs["a.lmdb"], tmp_path)
    assert result["problems"] == []
    assert len(result["cases"]) == 10 and all(case["error"] for case in result["cases"])


def test_faults_drawn_at_random_give_the_pack_or_one_line(store, packs, tmp_path: Path) -> None:
    result = checks.faults(store, BUCKET, packs["a.shards"], tmp_path, trials=6)
    assert result["problems"] == []
    assert sum(result["faults"].values()) > 0 and result["whole"] + result["refused"] == 6


def test_urls_never_show_their_secrets(store, packs, tmp_path: Path) -> None:
    result = checks.redaction(store, BUCKET, packs["a.lmdb"], tmp_path)
    assert result["problems"] == []
    assert result["runs"] == 16
