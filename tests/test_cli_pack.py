"""The subcommands that write a pack (``packload.cli_pack``): sizes as people write them, the one-line
summary of a pack (fresh, unlabelled or resumed), the flags refused where they do not apply, and a
real pack and merge with their reports."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from packload.cli_pack import add_merge, add_pack, pack_summary, parse_bytes, parse_hw, run_merge, run_pack
from packload.cli_report import EXIT_OK
from packload.core.errors import UsageError
from tests.image_factory import make_image_folder


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(prog="packload")
    sub = made.add_subparsers(dest="command")
    add_pack(sub)
    add_merge(sub)
    return made


def test_sizes_are_read_as_people_write_them() -> None:
    assert parse_bytes("256M") == 256 << 20 and parse_bytes(" 1 GiB ") == 1 << 30 and parse_bytes("65536") == 65536
    assert parse_hw("32x48") == (32, 48) and parse_hw(" 7 X 9 ") == (7, 9)
    for bad in ("lots", "1.5G", "-1M"):
        with pytest.raises(argparse.ArgumentTypeError, match="write for example 256M"):
            parse_bytes(bad)
    for bad in ("32", "0x4", "4x"):
        with pytest.raises(argparse.ArgumentTypeError, match="HEIGHTxWIDTH"):
            parse_hw(bad)


SUMMARY = {"records": 3, "classes": 0, "destination": "out.lmdb", "backend": "lmdb", "encoding": "keep",
           "seconds": 2.0, "files_per_s": 1.5, "mb_per_s": 0.4, "pack_bytes": 2_500_000, "source_bytes": 2_000_000}


def test_the_summary_says_what_was_packed_and_how_fast() -> None:
    assert pack_summary(SUMMARY) == ("packed 3 images (unlabelled: no class folders) into out.lmdb [lmdb, keep] in "
                                     "2.0 s: 2 files/s, 0 MB/s; 2.5 MB from 2.0 MB")
    resumed = {**SUMMARY, "classes": 2, "resumed_at": 1, "files_this_run": 2, "files_total": 3,
               "ray": {"tasks": 4, "tasks_kept": 1}}
    assert pack_summary(resumed).startswith("resumed at file 1 (1 of 4 Ray tasks were done): packed 2 more files "
                                            "in 2.0 s")
    assert "the pack holds 3 images (2 classes) of 3 files into out.lmdb" in pack_summary(resumed)
    assert "files/s" not in pack_summary({**SUMMARY, "seconds": 0.0}), "no rate for no time"


@pytest.mark.parametrize("argv,refused", [
    (["--ray-address", "auto"], "--ray-address and --task-files apply to --engine ray"),
    (["--path-column", "file"], "--path-column describes a table of labels"),
    (["--engine", "ray", "--workers", "2"], "--workers does not apply to --engine ray"),
])
def test_flags_that_do_not_apply_are_refused_before_any_work(argv: list[str], refused: str, tmp_path: Path) -> None:
    args = parser().parse_args(["pack", str(tmp_path / "none"), str(tmp_path / "out.lmdb"), *argv])
    with pytest.raises(UsageError, match=refused):
        run_pack(args)
    assert not (tmp_path / "out.lmdb").exists()


def test_a_url_source_needs_ray(tmp_path: Path) -> None:
    args = parser().parse_args(["pack", "s3://bucket/images/", str(tmp_path / "out.lmdb")])
    with pytest.raises(UsageError, match="a source at a URL is packed with --engine ray"):
        run_pack(args)


def test_a_pack_and_a_merge_report_what_they_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_image_folder(tmp_path / "images", classes=("ant", "bee"), per_class=2)
    for name in ("a.shards", "b.lmdb"):
        args = parser().parse_args(["pack", str(tmp_path / "images"), str(tmp_path / name), "--workers", "1",
                                    "--quiet"])
        assert run_pack(args) == EXIT_OK
    assert capsys.readouterr().out == "", "--quiet: no summary"
    args = parser().parse_args(["merge", str(tmp_path / "m.lmdb"), str(tmp_path / "a.shards"),
                                str(tmp_path / "b.lmdb"), "--json"])
    assert run_merge(args) == EXIT_OK
    document = json.loads(capsys.readouterr().out)
    assert document["command"] == "merge" and document["records"] == 8 and document["classes"] == 2
    args = parser().parse_args(["pack", str(tmp_path / "images"), str(tmp_path / "c.lmdb"), "--workers", "1"])
    assert run_pack(args) == EXIT_OK
    assert capsys.readouterr().out.startswith("packed 4 images (2 classes) into ")
