"""The shards backend of ``PackReader`` (``packload.loaders.read_shards``): the shards as the manifest
lists them, each checked (size, header) before it is read, files opened through the folder taken at
open (a replaced pack does not mix with the one opened), and every kind of damaged folder refused
with an error that names the file."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from packload.core.errors import IncompletePackError, PackFormatError, UsageError
from packload.core.format import decode_shard_header
from packload.loaders import read_shards
from packload.loaders.read import PackReader
from tests.reliability.packs import make_source, pack_small, records_of


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("read-shards")
    pack_small(make_source(root / "src", per_class=4, big=2), root / "p.shards")  # several 64 KiB shards
    return root / "p.shards"


def _copy(pack: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pack, tmp_path / "copy.shards"))


def _manifest(pack: Path) -> dict:
    return json.loads((pack / "manifest.json").read_text())


def test_the_shards_are_the_manifests(pack: Path) -> None:
    manifest = _manifest(pack)
    with PackReader(pack) as reader:
        assert reader.part_names == [p["name"] for p in manifest["parts"]] and len(reader.part_names) >= 2
        for k, name in enumerate(reader.part_names):
            view = reader.part_view(k)
            assert bytes(view) == (pack / name).read_bytes() and decode_shard_header(view[:16]) == (1, k)


def test_a_reader_goes_on_reading_the_pack_it_opened(pack: Path, tmp_path: Path) -> None:
    copy = _copy(pack, tmp_path)
    expected = records_of(copy)
    with PackReader(copy) as reader:
        os.rename(copy, tmp_path / "moved.shards")
        (tmp_path / "copy.shards").mkdir()  # another folder at the path (another pack, say)
        assert [bytes(reader.payload(i)) for i in range(reader.records)] == [p for _, _, p in expected]


def test_damaged_folders_are_refused_by_file(pack: Path, tmp_path: Path) -> None:
    copy = _copy(pack, tmp_path)
    first = _manifest(copy)["parts"][0]["name"]
    with open(copy / first, "ab") as f:
        f.write(b"x")
    with pytest.raises(PackFormatError, match=f"{first}: .* bytes, the manifest says"):
        PackReader(copy)
    os.unlink(copy / first)
    with pytest.raises(PackFormatError, match=f"{first}: shard missing"):
        PackReader(copy)
    shutil.rmtree(copy)

    copy = _copy(pack, tmp_path)
    os.unlink(copy / "index.bin")
    os.mkfifo(copy / "index.bin")  # opened without blocking: an error, not a hang
    with pytest.raises(PackFormatError, match="index.bin: .*not a regular file"):
        PackReader(copy)
    shutil.rmtree(copy)

    copy = _copy(pack, tmp_path)
    manifest = _manifest(copy)
    manifest["parts"][0]["name"] = "../" + first
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PackFormatError, match="is not a plain file name"):
        PackReader(copy)
    os.unlink(copy / "manifest.json")
    with pytest.raises(IncompletePackError, match="manifest.json is missing"):
        PackReader(copy)  # shards but no manifest: not to be trusted
    (tmp_path / "plain").mkdir()
    with pytest.raises(UsageError, match="not a pack"):
        PackReader(tmp_path / "plain")


def test_a_shard_of_another_place_is_refused_when_read(pack: Path, tmp_path: Path) -> None:
    copy = _copy(pack, tmp_path)
    first = _manifest(copy)["parts"][0]["name"]
    with open(copy / first, "r+b") as f:
        f.seek(8)
        f.write((5).to_bytes(4, "little"))  # its header says part 5
    with PackReader(copy) as reader:
        with pytest.raises(PackFormatError, match="not shard 0 of this pack"):
            reader.payload(0)


def test_a_manifest_larger_than_the_limit_is_refused_unread(pack: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(read_shards, "MANIFEST_LIMIT", 100)
    with pytest.raises(PackFormatError, match="manifest.json: .*more than the 100 allowed"):
        PackReader(pack)
