"""``packload merge`` (``packload.merger``): packs made separately joined into one, read back record by record."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import packload.packer.encode_stream as encode_stream
from packload import EncodeOptions, merge, pack
from packload.cli import main
from packload.loaders.read import PackReader
from packload.loaders.verify import verify
from packload.packer.destination import partial_path
from tests.image_factory import make_image_folder, write_broken_files


def records_by_class_name(path: Path) -> list[tuple]:
    """Every record as (path, class name, payload, width, height, format, mode, crc)."""
    with PackReader(path) as reader:
        e = reader.entries
        return [(reader.path_of(i), reader.classes[int(e["label"][i])], bytes(reader.payload(i, verify=True)),
                 int(e["width"][i]), int(e["height"][i]), int(e["format"][i]), bytes(e["mode"][i]),
                 int(e["payload_crc32"][i])) for i in range(reader.records)]


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two packs of different class lists ({ant, bee} and {bee, cow, dog}), each as shards and LMDB,
    with small shards so each has several; plus a raw-encoded one."""
    base = tmp_path_factory.mktemp("merge-in")
    make_image_folder(base / "one", classes=("ant", "bee"), per_class=30, seed=1)
    write_broken_files(base / "one" / "bee")
    make_image_folder(base / "two", classes=("bee", "cow", "dog"), per_class=25, seed=2)
    out = {}
    for name in ("one", "two"):
        for suffix in ("shards", "lmdb"):
            out[f"{name}.{suffix}"] = base / f"{name}.{suffix}"
            pack(base / name, out[f"{name}.{suffix}"], workers=1, progress=False, shard_size=1 << 16)
    out["raw.shards"] = base / "raw.shards"
    pack(base / "two", out["raw.shards"], options=EncodeOptions(encoding="raw", size=(8, 8)), progress=False)
    return out


@pytest.mark.parametrize("inputs", [("one.shards", "two.shards"), ("one.lmdb", "two.lmdb"),
                                    ("one.shards", "two.lmdb"), ("two.lmdb", "one.shards")])
@pytest.mark.parametrize("out_name", ["merged.shards", "merged.lmdb"])
def test_merged_pack_reads_as_the_inputs_in_order(packs: dict[str, Path], tmp_path: Path, inputs: tuple[str, str],
                                                  out_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / out_name
    assert main(["merge", str(out), *(str(packs[name]) for name in inputs), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    expected = [r for name in inputs for r in records_by_class_name(packs[name])]
    assert summary["records"] == len(expected) == 135 and summary["classes"] == 4
    assert records_by_class_name(out) == expected  # same records, same order, labels remapped by name
    with PackReader(out) as reader:
        manifest = reader.manifest
        assert reader.classes == ["ant", "bee", "cow", "dog"]
        assert manifest["class_counts"] == {"ant": 30, "bee": 55, "cow": 25, "dog": 25}
        assert [s["path"] for s in manifest["skipped"]] == [s["path"] for s in
                                                           PackReader(packs["one.shards"]).manifest["skipped"]]
        assert [m["records"] for m in manifest["merged_from"]] == [60 if "one" in n else 75 for n in inputs]
    assert verify(out, progress=False)["ok"]
    assert main(["verify", str(out), "--quiet"]) == 0
    assert not partial_path(out).exists()


def test_unchanged_shards_are_hard_linked_and_inputs_untouched(packs: dict[str, Path], tmp_path: Path) -> None:
    before = {p.name: p.read_bytes() for p in packs["two.shards"].iterdir()}
    result = merge(tmp_path / "m", [packs["one.shards"], packs["two.shards"]], progress=False)
    first = sorted(packs["one.shards"].glob("shard-*.bin"))
    assert result["shards_linked"] == len(first) > 1  # labels of "one" keep their numbers
    assert os.path.samestat(first[0].stat(), (tmp_path / "m" / first[0].name).stat())
    assert {p.name: p.read_bytes() for p in packs["two.shards"].iterdir()} == before  # copied, then patched
    assert len(list((tmp_path / "m").glob("shard-*.bin"))) == len(first) + len(before) - 2 > len(first) + 1
    assert result["remapped"] == 1


def test_one_input_converts_between_backends(packs: dict[str, Path], tmp_path: Path) -> None:
    merge(tmp_path / "two.lmdb", [packs["two.shards"]], progress=False)
    with PackReader(tmp_path / "two.lmdb") as a, PackReader(packs["two.lmdb"]) as b:
        assert a.index_bytes() == b.index_bytes()  # the same chunks as packing to LMDB directly


def test_duplicate_input_is_refused(packs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one = str(packs["one.shards"])
    assert main(["merge", str(tmp_path / "m"), one, str(packs["two.shards"]), one + "/"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "given twice" in err
    copy = tmp_path / "copy.shards"
    shutil.copytree(packs["one.shards"], copy)
    assert main(["merge", str(tmp_path / "m"), one, str(copy)]) == 2
    assert "holds the same records as" in capsys.readouterr().err
    assert not (tmp_path / "m").exists() and not partial_path(tmp_path / "m").exists()


@pytest.mark.parametrize("backend", ["shards", "lmdb"])
def test_an_unfinished_pack_is_refused(packs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str], backend: str) -> None:
    source = tmp_path / "src"
    make_image_folder(source, classes=("ant",), per_class=12, seed=3)
    real, calls = encode_stream.encode_chunk, []

    def interrupted(root: str, samples: list, options: EncodeOptions) -> list:
        calls.append(1)
        if len(calls) > 2:
            raise KeyboardInterrupt
        return real(root, samples, options)

    monkeypatch.setattr(encode_stream, "encode_chunk", interrupted)
    monkeypatch.setattr(encode_stream, "CHUNK_FILES", 3)
    dst = tmp_path / f"cut.{backend}"
    with pytest.raises(KeyboardInterrupt):
        pack(source, dst, workers=1, progress=False, checkpoint_every=3)
    assert partial_path(dst).exists() and not dst.exists()
    for given in (partial_path(dst), dst):
        assert main(["merge", str(tmp_path / "m"), str(packs["one.shards"]), str(given)]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and ("did not finish" in err or "unfinished pack" in err), err
        assert "--resume" in err
    assert not (tmp_path / "m").exists() and not partial_path(tmp_path / "m").exists()


def test_mismatched_encodings_are_refused(packs: dict[str, Path], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["merge", str(tmp_path / "m"), str(packs["one.shards"]), str(packs["raw.shards"])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "encoding 'keep' vs 'raw'" in err and "cannot be mixed" in err


def test_existing_out_needs_overwrite(packs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m.lmdb"
    args = ["merge", str(out), str(packs["one.lmdb"]), str(packs["two.shards"]), "--quiet"]
    assert main(args) == 0 and capsys.readouterr().out == ""
    assert main(args) == 2
    assert "already exists; add --overwrite" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0
    assert verify(out, progress=False)["ok"]


def test_out_inside_an_input_is_refused(packs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["merge", str(packs["one.shards"] / "m"), str(packs["one.shards"]), str(packs["two.shards"])]) == 2
    assert "inside it" in capsys.readouterr().err
