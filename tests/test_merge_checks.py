"""``merge`` refuses damaged inputs instead of writing them out as a fresh pack that verifies clean.

Every kind of damage ``verify`` reports (a payload byte, a record header, an index field, a byte of
a shard or chunk, the manifest's counts), in either input backend, merged alone (its shards
hard-linked) or after another pack (its shards copied and renumbered), into either output backend:
refused in one line naming the damaged input and the problem, no OUT left, the inputs unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from packload.loaders.read import PackReader
from packload.loaders.verify import verify
from tests.image_factory import make_image_folder
from tests.reliability.corruption import flip_bit
from tests.reliability.crafted import copy_pack, index_with, rewrite
from tests.reliability.packs import cli, one_line_error, pack_small, records_of

BACKENDS = ["lmdb", "shards"]
VICTIM = 5  # the record damaged


def snapshot(path: Path) -> dict[str, bytes]:
    files = sorted(path.rglob("*")) if path.is_dir() else [path]
    return {str(p): p.read_bytes() for p in files if p.is_file()}


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two packs per backend, of different classes, each with several shards or chunks."""
    base = tmp_path_factory.mktemp("merge-checks")
    make_image_folder(base / "one", classes=("ant", "bee", "cow"), per_class=8, seed=1)
    make_image_folder(base / "two", classes=("cow", "dog"), per_class=8, seed=2)
    out = {}
    for name in ("one", "two"):
        for backend in BACKENDS:
            out[f"{name}.{backend}"] = base / f"{name}.{backend}"
            pack_small(base / name, out[f"{name}.{backend}"])
    return out


def _region(pack: Path, kind: str, record: int) -> tuple[Path, int, int]:
    """The file holding ``record`` and where its ``kind`` ("payload" or "record header", with its
    path) lies in that file."""
    with PackReader(pack) as reader:
        entry = reader.entries[record]
        part = int(entry["part"])
        if reader.backend == "shards":
            path, base = pack / reader.part_names[part], 0
        else:  # a chunk is stored once, contiguously, in the LMDB file
            path, base = pack, pack.read_bytes().find(bytes(reader.part_view(part)))
            assert base >= 0
        header, payload = int(entry["record_offset"]), int(entry["payload_offset"])
        end = payload + int(entry["payload_len"])
    return (path, base + header, base + payload) if kind == "record header" else (path, base + payload, base + end)


def payload_byte(pack: Path) -> None:
    path, start, end = _region(pack, "payload", VICTIM)
    flip_bit(path, (start + end) // 2, 3)


def record_header(pack: Path) -> None:
    path, start, _ = _region(pack, "record header", VICTIM)
    flip_bit(path, start + 28, 0)  # the label


def index_label(pack: Path) -> None:
    """The reported case: another valid label in the index, the manifest's sha256 left as it was."""
    with PackReader(pack) as reader:
        label = int(reader.entries["label"][VICTIM])
        classes = len(reader.classes)
    rewrite(pack, index=index_with(pack, label=(VICTIM, (label + 1) % classes)), fix_sha=False)


def shard_byte(pack: Path) -> None:
    """A shard's header (its reserved bytes: only the shard's sha256 covers them), or in an LMDB
    pack a byte of a chunk (the last byte of a record's path)."""
    if pack.is_dir():
        flip_bit(sorted(pack.glob("shard-*.bin"))[-1], 13, 1)
    else:
        path, _, end = _region(pack, "record header", VICTIM)
        flip_bit(path, end - 1, 0)


def _manifest_change(change: Callable[[dict], dict]) -> Callable[[Path], None]:
    def damage(pack: Path) -> None:
        with PackReader(pack) as reader:
            manifest = dict(reader.manifest)
        rewrite(pack, manifest=change(manifest))

    return damage


def _one_more(counts: dict) -> dict:
    first = sorted(counts)[0]
    return dict(counts, **{first: counts[first] + 1})


DAMAGE = {
    "payload byte": payload_byte,
    "record header": record_header,
    "index field": index_label,
    "shard byte": shard_byte,
    "manifest class_counts": _manifest_change(lambda m: dict(m, class_counts=_one_more(m["class_counts"]))),
    "manifest source files": _manifest_change(lambda m: dict(m, source=dict(m["source"], files=m["source"]["files"] + 1))),
    "manifest payload_bytes": _manifest_change(lambda m: dict(m, payload_bytes=m["payload_bytes"] + 1)),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("in_backend", BACKENDS)
@pytest.mark.parametrize("out_backend", BACKENDS)
@pytest.mark.parametrize("position", ["alone", "second"])
def test_merge_refuses_a_damaged_input(packs: dict[str, Path], tmp_path: Path, damage: str, in_backend: str,
                                       out_backend: str, position: str) -> None:
    damaged = copy_pack(packs[f"one.{in_backend}"], tmp_path / f"damaged.{in_backend}")
    DAMAGE[damage](damaged)
    assert not verify(damaged, progress=False)["ok"]  # the damage is real: verify reports it
    good = packs[f"two.{BACKENDS[1 - BACKENDS.index(in_backend)]}"]
    inputs = [damaged] if position == "alone" else [good, damaged]
    before = {path: snapshot(path) for path in inputs}
    out = tmp_path / f"out.{out_backend}"
    code, err = cli(["merge", str(out), *map(str, inputs), "--quiet"])
    assert one_line_error(code, err) is None, err
    assert code == 1, err
    assert str(damaged) in err and "damaged" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [damaged.name]  # no OUT, OUT.partial or OUT.lock
    assert {path: snapshot(path) for path in inputs} == before


@pytest.mark.parametrize("in_backend", BACKENDS)
@pytest.mark.parametrize("out_backend", BACKENDS)
def test_intact_inputs_still_merge(packs: dict[str, Path], tmp_path: Path, in_backend: str, out_backend: str) -> None:
    first, second = packs[f"one.{in_backend}"], packs[f"two.{in_backend}"]
    for inputs in ([first], [second, first]):
        out = tmp_path / f"out-{len(inputs)}.{out_backend}"
        code, err = cli(["merge", str(out), *map(str, inputs), "--quiet"])
        assert code == 0, err
        assert verify(out, progress=False)["ok"]
        with PackReader(out) as reader:
            names = reader.classes
        expected = [(path, names.index(cls), data) for p in inputs for path, cls, data in _named(p)]
        assert records_of(out) == expected


def _named(pack: Path) -> list[tuple[str, str, bytes]]:
    with PackReader(pack) as reader:
        classes = reader.classes
    return [(path, classes[label], data) for path, label, data in records_of(pack)]
