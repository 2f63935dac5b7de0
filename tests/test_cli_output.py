"""What every command writes, for a user at a terminal or a script at a pipe: a reader that closes
stdout early ends the command quietly (exit 141, nothing on stderr), ``--json`` writes no progress
(stderr empty) and carries the warnings, counts read right for one ("1 image", "an LMDB pack"), and
the one-class-folder mistake is said."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from packload.cli import EXIT_PIPE, main
from tests.image_factory import make_image_folder, write_odd_images

ROOT = Path(__file__).resolve().parents[1]
ONE_MANY = re.compile(r"\b1 (images|records|files|classes|packs|workers|threads|samples|trials|batches)\b")


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli-output")
    make_image_folder(root / "images", classes=("ant", "bee"), per_class=3, seed=2)
    write_odd_images(root / "images" / "bee")
    assert main(["pack", str(root / "images"), str(root / "p.lmdb"), "--quiet"]) == 0
    assert main(["pack", str(root / "images"), str(root / "p.shards"), "--quiet"]) == 0
    return root


def commands(place: Path, out: Path) -> dict[str, list[str]]:
    """One run of each command (each writing somewhere new under ``out``)."""
    return {
        "pack": ["pack", str(place / "images"), str(out / "n.shards"), "--overwrite"],
        "info": ["info", str(place / "p.lmdb")],
        "verify": ["verify", str(place / "p.shards"), "--decode"],
        "unpack": ["unpack", str(place / "p.lmdb"), str(out / "unpacked")],
        "merge": ["merge", str(out / "m.lmdb"), str(place / "p.lmdb"), str(place / "p.shards")],
        "tune": ["tune", str(place / "p.shards"), "--batch-size", "4", "--step-ms", "1", "--budget", "1",
                 "--max-workers", "0"],
        "doctor": ["doctor", str(place / "p.lmdb"), "--batch-size", "4", "--max-batches", "1", "--repeats", "1",
                   "--crop", "16", "--workers", "0"],
    }


def run_with_stdout_closed(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
    """``python -m packload ARGV`` writing into a pipe whose reader closed it before a byte was
    written (``| head -0``), as ``packload info x | head -4`` after its fourth line."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "packload", *argv], stdout=write_end, stderr=subprocess.PIPE,
                              cwd=ROOT, timeout=300, check=False)
    finally:
        os.close(write_end)


# Runs each command of argv lists in one process (one start-up, not one per command), its fd 1 a pipe
# whose reader has gone and its fd 2 a file; prints [argv, exit status, stderr] for each as JSON.
IN_ONE_PROCESS = r"""
import json, os, sys, tempfile
from packload.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    read_end, write_end = os.pipe()
    os.close(read_end)
    keep_out, keep_err = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as err:
        sys.stdout.flush(); sys.stderr.flush()
        os.dup2(write_end, 1); os.dup2(err.fileno(), 2); os.close(write_end)
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
        sys.stderr.flush()
        os.dup2(keep_out, 1); os.dup2(keep_err, 2); os.close(keep_out); os.close(keep_err)
        err.seek(0)
        results.append([argv, code, err.read().decode()])
sys.stdout.write(json.dumps(results) + "\n")
"""


def test_a_closed_stdout_ends_every_command_quietly(place: Path, tmp_path: Path) -> None:
    """Unix tools stopped by SIGPIPE say nothing and a shell reports 141: every command does the
    same when its reader goes away, whatever it had to say (a report, JSON, --help, --version); and
    so does a whole process, whose interpreter flushes stdout once more as it exits."""
    runs = [[*argv, "--json"] for argv in commands(place, tmp_path).values()]
    runs += [commands(place, tmp_path)["info"], [*commands(place, tmp_path)["tune"], "--quiet"],
             [*commands(place, tmp_path)["doctor"], "--quiet"], ["--help"], ["demo", "--help"], ["--version"],
             ["pack", str(place / "images"), str(tmp_path / "q.lmdb")]]  # a summary line (progress on stderr)
    done = subprocess.run([sys.executable, "-c", IN_ONE_PROCESS, json.dumps(runs)], capture_output=True, cwd=ROOT,
                          timeout=600, check=True)
    for argv, code, err in json.loads(done.stdout):
        if argv[0] == "pack" and "--json" not in argv:  # its progress goes to stderr, a file here: lines of its own
            err = "\n".join(line for line in err.splitlines() if not line.startswith("pack images:"))
        assert err == "" and code == EXIT_PIPE, (argv, code, err)
    assert (tmp_path / "n.shards").is_dir() and (tmp_path / "m.lmdb").is_file(), "the work itself was done"
    for argv in (commands(place, tmp_path)["info"], ["--help"]):  # whole processes, to their exit
        whole = run_with_stdout_closed(argv)
        assert whole.stderr.decode() == "" and whole.returncode == EXIT_PIPE, (argv, whole.returncode, whole.stderr)


def test_a_closed_stdout_is_not_taken_for_a_failed_network_write(monkeypatch, capsys) -> None:
    """A broken pipe that is not ours (a peer that hung up) is still an error, in one line."""
    from packload import cli, cli_read

    def hung_up(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli_read, "run_info", hung_up)  # the parser built below runs it for `info`
    assert cli.main(["info", "x.lmdb"]) == cli.EXIT_ERROR
    assert "Broken pipe" in capsys.readouterr().err


def test_json_writes_no_progress(place: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With --json, stderr stays empty (pytest's capture is no terminal: progress would be plain lines)."""
    for name, argv in commands(place, tmp_path).items():
        assert main([*argv, "--json"]) == 0, name
        captured = capsys.readouterr()
        assert captured.err == "", (name, captured.err)
        document = json.loads(captured.out)
        assert document["command"] == name and document["warnings"] == []


def test_counts_read_right_for_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A pack of one image, said by every command: "1 image", "1 record", "an LMDB pack", never
    "1 images"."""
    Image.new("RGB", (20, 10), (1, 2, 3)).save(tmp_path / "only.png")
    source = tmp_path / "one"
    source.mkdir()
    (tmp_path / "only.png").rename(source / "only.png")
    for argv in (["pack", str(source), str(tmp_path / "one.lmdb")], ["info", str(tmp_path / "one.lmdb")],
                 ["verify", str(tmp_path / "one.lmdb")], ["unpack", str(tmp_path / "one.lmdb"), str(tmp_path / "u")],
                 ["merge", str(tmp_path / "m.lmdb"), str(tmp_path / "one.lmdb")],
                 ["doctor", str(tmp_path / "one.lmdb"), "--no-measure", "--workers", "1"]):
        assert main([*argv, "--quiet"] if argv[0] != "info" else argv) == 0
        out = capsys.readouterr().out
        assert not ONE_MANY.search(out), out
        assert " a lmdb" not in out.lower()
    assert main(["info", str(tmp_path / "one.lmdb")]) == 0
    assert "an LMDB pack" in capsys.readouterr().out
    assert main(["pack", str(source), str(tmp_path / "two.lmdb")]) == 0
    assert "packed 1 image (unlabelled: no class folders)" in capsys.readouterr().out


def _class_folders(root: Path) -> Path:
    """``root/photos`` holding three class folders of images: food, cars, trees."""
    for name in ("food", "cars", "trees"):
        (root / "photos" / name).mkdir(parents=True)
        for k in range(3):
            Image.new("RGB", (12 + k, 9), (40 * k, 80, 120)).save(root / "photos" / name / f"{name}{k}.jpg")
    return root / "photos"


def test_one_class_folder_given_alone_is_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`pack ./photos/food DEST`: packed unlabelled, with a warning (on stderr and in --json) that
    names the folder above; an error under --strict; a folder of images with no folders of images
    beside it is packed unlabelled without a word."""
    photos = _class_folders(tmp_path)
    assert main(["pack", str(photos / "food"), str(tmp_path / "food.lmdb"), "--quiet"]) == 0
    err = capsys.readouterr().err
    [warning] = [line for line in err.splitlines() if "warning" in line]
    assert "no class folders: packed unlabelled" in warning and f"did you mean {photos}" in warning
    assert "cars" in warning and "trees" in warning
    assert main(["pack", str(photos / "food"), str(tmp_path / "food2.lmdb"), "--json"]) == 0
    captured = capsys.readouterr()
    [said] = json.loads(captured.out)["warnings"]
    assert "no class folders" in said and str(photos) in said and "no class folders" in captured.err
    assert main(["pack", str(photos / "food"), str(tmp_path / "food3.lmdb"), "--strict", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no class folders" in err and "without --strict" in err
    assert not (tmp_path / "food3.lmdb").exists()
    alone = tmp_path / "elsewhere" / "unlabelled"
    alone.mkdir(parents=True)
    for k in range(3):
        Image.new("L", (8, 8 + k)).save(alone / f"{k}.png")
    (tmp_path / "elsewhere" / "notes").mkdir()  # a folder beside it, but of no images
    assert main(["pack", str(alone), str(tmp_path / "u.lmdb"), "--quiet", "--strict"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["pack", str(photos), str(tmp_path / "classes.lmdb"), "--quiet", "--strict"]) == 0
    assert capsys.readouterr().err == ""
