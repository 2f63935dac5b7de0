"""A pack made from a table, through pack, read and unpack, for both backends: the fields come back
as the table gave them (whole columns, per record, batched), ``unpack`` writes the table back, and
``verify`` and the readers catch a damaged fields part."""

from __future__ import annotations

import json
from pathlib import Path

import lmdb
import numpy as np
import pytest
import torch

from packload import (
    CenterCrop,
    ChecksumError,
    PackedImageFolder,
    PackFormatError,
    PackLoader,
    UsageError,
    batch_loader,
    merge,
    pack,
    unpack,
    verify,
)
from packload.core.format import FIELDS_NAME, LMDB_FIELDS_KEY
from packload.packer.table_options import TableOptions
from tests.fields_source import GOOD, HEADER, make_source, read_table, typed

GIVEN = {"age": "int", "attrs": "list[int]"}
BACKENDS = ("shards", "lmdb")


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory):
    return make_source(tmp_path_factory.mktemp("fields"))


@pytest.fixture(scope="module")
def packs(source, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fields-packs")
    out = {}
    for backend in BACKENDS:
        out[backend] = root / f"p.{backend}"
        pack(source.root, out[backend], labels=TableOptions(source.table, types=GIVEN), workers=1, progress=False,
             shard_size=1 << 16)
    return out


def _expected(source, name: str) -> list:
    """Column ``name`` of the good rows, in record order, as its type reads it."""
    return [typed(name, source.row(path)[name]) for path in source.paths]


@pytest.mark.parametrize("backend", BACKENDS)
def test_fields_read_back_as_packed(packs, source, backend: str) -> None:
    ds = PackedImageFolder(packs[backend], output="numpy")
    assert ds.fields == {"age": "int", "height": "float", "smiling": "bool", "caption": "string",
                         "attrs": "list[int]", "embedding": "list[float]", "id": "string"}
    assert [ds.path(i) for i in range(len(ds))] == source.paths
    assert ds.classes == ["cat", "dog", "emu"]
    assert ds.targets == [ds.classes.index(source.row(p)["label"]) for p in source.paths]
    assert ds.field("age").tolist() == _expected(source, "age")
    assert np.array_equal(ds.field("height"), np.array(_expected(source, "height")))
    assert ds.field("smiling").tolist() == _expected(source, "smiling")
    assert ds.field("caption").tolist() == _expected(source, "caption")
    assert [v.tolist() for v in ds.field("attrs")] == _expected(source, "attrs")
    assert ds.field("embedding").tolist() == _expected(source, "embedding")
    assert ds.field("id")[0] == "007" and ds.field("label").tolist() == ds.targets
    image, target = ds[1]
    assert isinstance(target, int) and target == ds.targets[1]  # the default is unchanged: the class index
    with pytest.raises(KeyError, match="no field 'agee': the pack's fields are age, height"):
        ds.field("agee")


@pytest.mark.parametrize("backend", BACKENDS)
def test_targets_one_by_one(packs, source, backend: str) -> None:
    ds = PackedImageFolder(packs[backend], target="caption")
    assert [ds[i][1] for i in range(len(ds))] == _expected(source, "caption")
    pair = PackedImageFolder(packs[backend], target=("label", "attrs"), target_transform=lambda t: (t[0], list(t[1])))
    assert pair[0][1] == (pair.targets[0], _expected(source, "attrs")[0])
    seen = []
    made = PackedImageFolder(packs[backend], target=lambda r: (seen.append(sorted(r)), r["age"] * 2, r["label"])[1:])
    assert made[2][1] == (2 * _expected(source, "age")[2], made.targets[2])
    assert seen[0] == sorted(["label", *made.fields])
    with pytest.raises(ValueError, match="target='captoin': no field 'captoin'"):
        PackedImageFolder(packs[backend], target="captoin")


@pytest.mark.parametrize("backend", BACKENDS)
def test_batches_numbers_as_tensors_strings_as_lists(packs, source, backend: str) -> None:
    ds = PackedImageFolder(packs[backend], target=("age", "height", "smiling", "caption", "attrs", "embedding"))
    images, (age, height, smiling, caption, attrs, embedding) = ds.get_batch([0, 2, 3], crop=CenterCrop(4))
    assert images.shape == (3, 3, 4, 4)
    rows = [source.paths[i] for i in (0, 2, 3)]
    assert age.dtype == torch.int64 and age.tolist() == [int(source.row(p)["age"]) for p in rows]
    assert height.dtype == torch.float64 and smiling.dtype == torch.bool
    assert caption == [source.row(p)["caption"] for p in rows]
    assert [t.tolist() for t in attrs] == [json.loads(source.row(p)["attrs"]) for p in rows]  # lengths differ: a list
    same = ds.get_batch([0, 1], crop=CenterCrop(4))[1][4]
    assert isinstance(same, torch.Tensor) and same.shape == (2, 3)  # one length: one tensor
    assert [t.tolist() for t in embedding] == [_expected(source, "embedding")[i] for i in (0, 2, 3)]
    loader = PackLoader(PackedImageFolder(packs[backend], target="height"), 2, crop=4, threads=2,
                        sampler=ds.sampler(shuffle=False))
    got = [height for _, height in loader]
    assert torch.cat(got).tolist() == _expected(source, "height") and len(got) == 3
    pairs = PackLoader(PackedImageFolder(packs[backend], target=("label", "attrs")), 2, crop=4, threads=0,
                       sampler=ds.sampler(shuffle=False))
    batches = iter(pairs)
    next(batches), next(batches)
    assert pairs.state_dict()["position"] == 4  # samples counted by the images, whatever the targets are
    encoded = PackLoader(PackedImageFolder(packs[backend], target="caption"), 4, encoded=True, threads=0,
                         sampler=ds.sampler(shuffle=False))
    assert [c for _, _, captions in encoded for c in captions] == _expected(source, "caption")
    batches = batch_loader(PackedImageFolder(packs[backend], target=("id", "age")), 3, crop=4,
                           sampler=ds.sampler(shuffle=False), num_workers=1)
    ids = [i for _, (batch_ids, _) in batches for i in batch_ids]
    assert ids == _expected(source, "id")


@pytest.mark.parametrize("backend", BACKENDS)
def test_unpack_writes_the_table_back(packs, source, backend: str, tmp_path: Path) -> None:
    result = unpack(packs[backend], tmp_path / "out", progress=False)
    assert result["table"] == "labels.csv" and result["files"] == len(GOOD)
    written = read_table(tmp_path / "out" / "labels.csv")
    wanted = {row[0]: {k: typed(k, v) for k, v in zip(HEADER[1:], row[1:], strict=True)} for row in GOOD}
    assert written == wanted  # the input's good rows, up to row order and number formatting
    header = (tmp_path / "out" / "labels.csv").read_text("utf-8").splitlines()[0]
    assert header == ",".join(HEADER)
    # the images are the input's, byte for byte, beside it
    for path in source.paths:
        assert (tmp_path / "out" / path).read_bytes() == (source.root / path).read_bytes()


@pytest.mark.parametrize("backend", BACKENDS)
def test_verify_and_readers_catch_a_damaged_fields_part(packs, backend: str, tmp_path: Path) -> None:
    assert verify(packs[backend], progress=False)["ok"]
    damaged = tmp_path / f"d.{backend}"
    pack_copy(packs[backend], damaged)
    size = PackedImageFolder(damaged).manifest["fields"]["size"]
    if backend == "shards":
        data = bytearray((damaged / FIELDS_NAME).read_bytes())
        data[-1] ^= 0xFF  # the last value of the last column
        (damaged / FIELDS_NAME).write_bytes(bytes(data))
    else:
        with lmdb.open(str(damaged), subdir=False, lock=False) as env, env.begin(write=True) as txn:
            data = bytearray(txn.get(LMDB_FIELDS_KEY))
            data[-1] ^= 0xFF
            txn.put(LMDB_FIELDS_KEY, bytes(data))
    report = verify(damaged, progress=False)
    assert not report["ok"] and report["bad_files"][-1]["problem"] == "sha256 differs from the manifest"
    with pytest.raises(ChecksumError, match="does not match the sha256 in the manifest"):
        PackedImageFolder(damaged, verify=True).field("embedding")
    if backend == "shards":  # a part of another size is refused before it is read
        (damaged / FIELDS_NAME).write_bytes(bytes(data[: size - 8]))
        with pytest.raises(PackFormatError, match="smaller than the"):
            PackedImageFolder(damaged).field("age")
        (damaged / FIELDS_NAME).unlink()
        with pytest.raises(PackFormatError, match="fields.bin: missing"):
            PackedImageFolder(damaged, target="age")[0]
        assert "missing" in verify(damaged, progress=False)["bad_files"][-1]["problem"]


def pack_copy(src: Path, dst: Path) -> None:
    import shutil

    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copyfile(src, dst)


def test_packs_without_a_table_have_no_fields(source, tmp_path: Path) -> None:
    pack(source.root, tmp_path / "plain.shards", workers=1, progress=False)
    pack(source.root, tmp_path / "plain.lmdb", workers=1, progress=False)
    assert not (tmp_path / "plain.shards" / FIELDS_NAME).exists()
    for backend in BACKENDS:
        ds = PackedImageFolder(tmp_path / f"plain.{backend}")
        assert ds.fields == {} and "fields" not in ds.manifest and "labels" not in ds.manifest["options"]
        with pytest.raises(ValueError, match="this pack has no fields"):
            PackedImageFolder(tmp_path / f"plain.{backend}", target="age")
    with lmdb.open(str(tmp_path / "plain.lmdb"), subdir=False, readonly=True, lock=False) as env, env.begin() as txn:
        assert txn.get(LMDB_FIELDS_KEY) is None


def test_merge_refuses_packs_with_fields(packs, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="a pack made from a table"):
        merge(tmp_path / "m.shards", [packs["shards"], packs["lmdb"]], progress=False)
    assert not (tmp_path / "m.shards").exists()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_interrupted_pack_resumes_with_its_table(source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    backend: str) -> None:
    from packload.packer import write_lmdb, write_shards

    options = TableOptions(source.table, types=GIVEN)
    reference = tmp_path / f"ref.{backend}"
    pack(source.root, reference, labels=options, workers=1, progress=False)
    writer = write_shards.ShardsWriter if backend == "shards" else write_lmdb.LmdbWriter
    original = writer.write
    calls = []

    def stop_after_four(self, item):  # type: ignore[no-untyped-def]
        calls.append(item.path)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return original(self, item)

    monkeypatch.setattr(writer, "write", stop_after_four)
    dst = tmp_path / f"p.{backend}"
    with pytest.raises(KeyboardInterrupt):
        pack(source.root, dst, labels=options, workers=1, progress=False, checkpoint_every=1)
    monkeypatch.setattr(writer, "write", original)
    with pytest.raises(UsageError, match="--labels was"), pytest.warns(UserWarning, match="stored as text"):
        pack(source.root, dst, labels=TableOptions(source.table), workers=1, progress=False, resume=True)  # other types
    summary = pack(source.root, dst, labels=options, workers=1, progress=False, resume=True)
    assert summary["resumed_at"] == 4
    got, want = PackedImageFolder(dst), PackedImageFolder(reference)
    for name in want.fields:
        assert repr(got.field(name)[:]) == repr(want.field(name)[:]), name
    assert got.manifest["skipped"] == want.manifest["skipped"]
    assert got.manifest["fields"]["sha256"] == want.manifest["fields"]["sha256"]
