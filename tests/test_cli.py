"""The command line, called through ``main(argv)``: the user's commands and every bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from PIL import Image

from packload.cli import main, module_main, pack_main
from tests.image_factory import make_image_folder, write_broken_files, write_odd_images


@pytest.fixture()
def images(tmp_path):
    root = tmp_path / "images"
    make_image_folder(root, classes=("cat", "dog"), per_class=5, seed=2)
    write_odd_images(root / "dog")
    return root


def run_json(capsys, argv, expect=0):
    code = main(argv + ["--json"])
    out, err = capsys.readouterr()
    assert code == expect, err
    return json.loads(out)


@pytest.mark.parametrize("name", ["data.lmdb", "data.shards"])
def test_pack_info_verify_unpack(images, tmp_path, capsys, name):
    dst = tmp_path / name
    summary = run_json(capsys, ["pack", str(images), str(dst)])
    count = len([p for p in images.rglob("*") if p.is_file()])
    assert summary["records"] == count and summary["skipped"] == 0
    assert summary["backend"] == ("lmdb" if name.endswith(".lmdb") else "shards")
    info = run_json(capsys, ["info", str(dst)])
    assert info["records"] == count and info["classes"] == ["cat", "dog"]
    assert info["class_counts"]["cat"] == 5
    report = run_json(capsys, ["verify", str(dst), "--decode"])
    assert report["ok"] and report["bad_records"] == []
    restored = tmp_path / "restored"
    run_json(capsys, ["unpack", str(dst), str(restored)])
    for original in (p for p in images.rglob("*") if p.is_file()):
        assert (restored / original.relative_to(images)).read_bytes() == original.read_bytes()
    if dst.suffix == ".lmdb":
        assert not (tmp_path / (name + "-lock")).exists()
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, "images", "restored"])


def test_human_output_and_short_forms(images, tmp_path, capsys):
    assert pack_main([str(images), str(tmp_path / "a.shards"), "--quiet"]) == 0
    assert capsys.readouterr().out == ""
    assert module_main([str(images), str(tmp_path / "b.lmdb")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("packed ") and "files/s" in out
    assert module_main(["info", str(tmp_path / "b.lmdb")]) == 0
    assert "records" in capsys.readouterr().out
    assert main(["pack", str(images), str(tmp_path / "c.bin"), "--format", "lmdb", "--quiet"]) == 0
    assert (tmp_path / "c.bin").is_file()


def test_console_entry_point_runs_as_module(images, tmp_path):
    result = subprocess.run([sys.executable, "-m", "packload", str(images), str(tmp_path / "m.lmdb"), "--json"],
                            capture_output=True, text=True, cwd=os.getcwd())
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["records"] == len([p for p in images.rglob("*") if p.is_file()])


def expect_error(capsys, argv, *words, code=2):
    assert main(argv) == code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err  # one line, no traceback
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_bad_sources(tmp_path, capsys):
    expect_error(capsys, ["pack", str(tmp_path / "nope"), str(tmp_path / "x.lmdb")], "nope", "not found")
    (tmp_path / "file.txt").write_text("x")
    expect_error(capsys, ["pack", str(tmp_path / "file.txt"), str(tmp_path / "x.lmdb")], "not a folder")
    (tmp_path / "empty").mkdir()
    expect_error(capsys, ["pack", str(tmp_path / "empty"), str(tmp_path / "x.lmdb")], "no images found")
    (tmp_path / "junk" / "a").mkdir(parents=True)
    write_broken_files(tmp_path / "junk" / "a")
    expect_error(capsys, ["pack", str(tmp_path / "junk"), str(tmp_path / "x.lmdb"), "--quiet"],
                 "none of the", "could be packed")
    assert not (tmp_path / "x.lmdb").exists()


def test_bad_destinations(images, tmp_path, capsys):
    expect_error(capsys, ["pack", str(images), str(tmp_path / "no" / "such" / "x.lmdb")], "does not exist")
    (tmp_path / "taken.lmdb").write_bytes(b"old")
    expect_error(capsys, ["pack", str(images), str(tmp_path / "taken.lmdb")], "already exists", "--overwrite")
    assert (tmp_path / "taken.lmdb").read_bytes() == b"old"
    # --overwrite replaces only a pack: a file of someone else's is left alone
    expect_error(capsys, ["pack", str(images), str(tmp_path / "taken.lmdb"), "--overwrite"], "not a pack")
    assert (tmp_path / "taken.lmdb").read_bytes() == b"old"
    assert main(["pack", str(images), str(tmp_path / "packed.lmdb"), "--quiet"]) == 0
    assert main(["pack", str(images), str(tmp_path / "packed.lmdb"), "--overwrite", "--quiet"]) == 0
    assert run_json(capsys, ["info", str(tmp_path / "packed.lmdb")])["records"] == len(
        [p for p in images.rglob("*") if p.is_file()])
    expect_error(capsys, ["pack", str(images), str(images / "inside.lmdb")], "inside the source")


def test_read_only_destination(images, tmp_path, capsys):
    target = tmp_path / "ro"
    target.mkdir()
    if os.geteuid() == 0:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(target)],
                                 capture_output=True)
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount a read-only tmpfs: {mounted.stderr.decode().strip()}")
    else:
        target.chmod(0o500)
    try:
        line = expect_error(capsys, ["pack", str(images), str(target / "x.lmdb")])
        assert ("read-only" if os.geteuid() == 0 else "cannot write") in line, line
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(target)], check=False)
        else:
            target.chmod(0o700)


def test_bad_options(images, tmp_path, capsys):
    dst = str(tmp_path / "x.lmdb")
    expect_error(capsys, ["pack", str(images), dst, "--max-side", "64"], "--max-side", "--encoding")
    expect_error(capsys, ["pack", str(images), dst, "--size", "8x8"], "--size", "raw")
    expect_error(capsys, ["pack", str(images), dst, "--quality", "0", "--encoding", "jpeg"], "--quality")
    expect_error(capsys, ["pack", str(images), dst, "--workers", "0"], "--workers")
    with pytest.raises(SystemExit) as exc:
        main(["pack", str(images), dst, "--shard-size", "lots"])
    assert exc.value.code == 2
    assert "256M" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["pack", str(images), dst, "--encoding", "gif"])


def test_strict_stops_on_a_broken_file(images, tmp_path, capsys):
    write_broken_files(images / "cat")
    line = expect_error(capsys, ["pack", str(images), str(tmp_path / "s.lmdb"), "--strict", "--quiet"],
                        "--strict", code=1)
    assert "cat/" in line
    assert not (tmp_path / "s.lmdb").exists()


def test_leading_dash_and_unicode_names(tmp_path, capsys):
    src = tmp_path / "-src"
    (src / "ünï cls").mkdir(parents=True)
    Image.new("RGB", (7, 7), (5, 6, 7)).save(src / "ünï cls" / "-dash ü.png")
    dst = tmp_path / "-out.lmdb"
    summary = run_json(capsys, ["pack", str(src), str(dst)])
    assert summary["records"] == 1
    info = run_json(capsys, ["info", str(dst)])
    assert info["classes"] == ["ünï cls"]


def test_reading_commands_refuse_non_packs(tmp_path, capsys):
    expect_error(capsys, ["info", str(tmp_path / "missing.lmdb")], "no such pack")
    (tmp_path / "plain").mkdir()
    expect_error(capsys, ["verify", str(tmp_path / "plain")], "not a pack")
    (tmp_path / "text.lmdb").write_text("not lmdb")
    expect_error(capsys, ["info", str(tmp_path / "text.lmdb")], "text.lmdb")


def test_verify_reports_a_damaged_record(images, tmp_path, capsys):
    dst = tmp_path / "d.shards"
    assert main(["pack", str(images), str(dst), "--quiet"]) == 0
    from packload import PackReader

    with PackReader(dst) as reader:
        entry = reader.entries[3]
        name, path = reader.part_names[int(entry["part"])], reader.path_of(3)
        offset = int(entry["payload_offset"]) + int(entry["payload_len"]) // 2
    with open(dst / name, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x40]))
    report = run_json(capsys, ["verify", str(dst)], expect=1)
    assert not report["ok"]
    assert [bad["record"] for bad in report["bad_records"]] == [3]
    assert report["bad_records"][0]["path"] == path
    assert report["bad_files"][0]["file"] == name


def test_unpack_refuses_non_empty_output(images, tmp_path, capsys):
    dst = tmp_path / "u.lmdb"
    assert main(["pack", str(images), str(dst), "--quiet"]) == 0
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    expect_error(capsys, ["unpack", str(dst), str(tmp_path / "full")], "not empty", "--overwrite")
