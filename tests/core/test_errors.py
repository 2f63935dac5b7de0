"""The errors packload raises (``packload.core.errors``), from real operations on real packs: each
is the documented class, so a caller can catch it as such (a usage error as ``ValueError``, a write
error as ``OSError``, every one as ``PackloadError``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from packload import (
    ChecksumError,
    IncompletePackError,
    PackFormatError,
    PackloadError,
    PackReader,
    SkippedFileError,
    UsageError,
    pack,
)
from packload.core.errors import WriteError
from tests.image_factory import make_image_folder, write_broken_files


@pytest.fixture()
def source(tmp_path: Path) -> Path:
    make_image_folder(tmp_path / "src", classes=("a", "b"), per_class=2, seed=1)
    return tmp_path / "src"


def test_bad_arguments_are_usage_errors_and_value_errors(source: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not found") as caught:
        pack(tmp_path / "missing", tmp_path / "x.shards", progress=False)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, PackloadError)
    pack(source, tmp_path / "p.shards", workers=1, progress=False)
    with pytest.raises(ValueError, match="already exists"):
        pack(source, tmp_path / "p.shards", workers=1, progress=False)
    with pytest.raises(UsageError, match="no such pack"):
        PackReader(tmp_path / "nothing.lmdb")


def test_damaged_packs_are_format_and_checksum_errors(source: Path, tmp_path: Path) -> None:
    dst = tmp_path / "p.shards"
    pack(source, dst, workers=1, progress=False)
    with PackReader(dst) as reader:
        entry = reader.entries[1]
        shard = dst / reader.part_names[int(entry["part"])]
    data = bytearray(shard.read_bytes())
    data[int(entry["payload_offset"]) + 3] ^= 0xFF
    shard.write_bytes(bytes(data))
    with PackReader(dst) as reader:
        with pytest.raises(ChecksumError, match="checksum mismatch") as caught:
            reader.payload(1, verify=True)
        assert isinstance(caught.value, PackFormatError)
    (dst / "index.bin").write_bytes(b"not an index")
    with pytest.raises(PackFormatError):
        PackReader(dst)


def test_an_unfinished_pack_is_an_incomplete_pack_error(source: Path, tmp_path: Path) -> None:
    (tmp_path / "p.shards.partial").mkdir()
    with pytest.raises(IncompletePackError, match="--resume") as caught:
        PackReader(tmp_path / "p.shards")
    assert isinstance(caught.value, PackFormatError)


def test_strict_packing_of_a_broken_file_is_a_skipped_file_error(source: Path, tmp_path: Path) -> None:
    write_broken_files(source / "a")
    with pytest.raises(SkippedFileError) as caught:
        pack(source, tmp_path / "s.shards", workers=1, progress=False, strict=True)
    assert isinstance(caught.value, PackloadError) and not isinstance(caught.value, ValueError)


def test_write_errors_are_os_errors() -> None:
    assert issubclass(WriteError, OSError) and issubclass(WriteError, PackloadError)
    error = WriteError(28, "No space left on device", "/x")
    assert error.errno == 28 and error.filename == "/x"
