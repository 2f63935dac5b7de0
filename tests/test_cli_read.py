"""The subcommands that read a pack (``packload.cli_read``), run by their handlers: ``info``'s lines
with a long class list cut short, ``verify`` silent under ``--quiet`` on a sound pack but never on a
damaged one, and ``unpack``'s one line."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from packload import pack
from packload.cli_read import add_info, add_unpack, add_verify
from packload.cli_report import EXIT_ERROR, EXIT_OK
from tests.image_factory import make_image_folder

CLASSES = tuple(f"c{k:02d}" for k in range(23))


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli-read")
    make_image_folder(root / "images", classes=CLASSES, per_class=1)
    pack(root / "images", root / "p.shards", workers=1, progress=False)
    return root / "p.shards"


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="packload")
    sub = parser.add_subparsers(dest="command")
    for register in (add_info, add_verify, add_unpack):
        register(sub)
    args = parser.parse_args(argv)
    return args.run(args)


def test_info_lists_twenty_classes_and_counts_the_rest(shards: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("info", str(shards)) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{shards}: ") and "  records   23" in lines and "  classes   23" in lines
    assert [line for line in lines if line.startswith("    c")] == [f"    {name}: 1" for name in CLASSES[:20]]
    assert "    ... and 3 more classes" in lines
    assert "  skipped   0 broken files, 0 left out" in lines


def test_verify_is_quiet_on_a_sound_pack_and_never_on_a_damaged_one(shards: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert run("verify", str(shards), "--quiet") == EXIT_OK
    assert capsys.readouterr().out == ""
    damaged = tmp_path / "d.shards"
    damaged.mkdir()
    for part in shards.iterdir():
        data, middle = part.read_bytes(), part.stat().st_size // 2
        if part.name.startswith("shard-"):  # zeros over the images in the middle, the size kept
            data = data[:middle] + bytes(512) + data[middle + 512:]
        (damaged / part.name).write_bytes(data)
    assert run("verify", str(damaged), "--quiet") == EXIT_ERROR
    out = capsys.readouterr().out
    assert out.startswith(f"{damaged}: 23 records, ") and "damaged record" in out


def test_unpack_says_what_it_wrote(shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("unpack", str(shards), str(tmp_path / "out")) == EXIT_OK
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith("unpacked 23 files (") and line.endswith(f" MB) into {tmp_path / 'out'}")
    assert len([p for p in (tmp_path / "out").rglob("*") if p.is_file()]) == 23
