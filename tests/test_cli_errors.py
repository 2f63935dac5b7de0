"""Every bad input to every command: one line on stderr naming the file or option and the fix, a
non-zero exit, never a traceback; typos get a "did you mean"; messages use the flags the user typed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from PIL import Image

from packload.cli import main, pack_main
from packload.cli_parser import did_you_mean, in_flag_names
from packload.packer.resume_options import options_changed


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of images (two classes), a pack of it, a plain file and a broken-only folder."""
    root = tmp_path_factory.mktemp("errors")
    for cls in ("cat", "dog"):
        (root / "images" / cls).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (12, 10), (40 * i, 80, 120)).save(root / "images" / cls / f"{i}.jpg")
    assert main(["pack", str(root / "images"), str(root / "p.lmdb"), "--quiet"]) == 0
    (root / "file.txt").write_text("not an image")
    (root / "junk" / "a").mkdir(parents=True)
    (root / "junk" / "a" / "x.jpg").write_bytes(b"not a jpeg")
    return root


def run(argv: list[str], capsys: pytest.CaptureFixture[str], command: object = main) -> tuple[int, str]:
    try:
        code = command(argv)  # type: ignore[operator]
    except SystemExit as exc:  # argparse's errors exit
        code = exc.code
    return int(code or 0), capsys.readouterr().err


# (argv with {d} for the fixture's folder, words the line must hold)
BAD = [
    # pack: sources, destinations, options
    ("pack {d}/nope {d}/x.lmdb", ["nope", "not found"]),
    ("pack {d}/file.txt {d}/x.lmdb", ["not a folder"]),
    ("pack {d}/junk {d}/x.lmdb --quiet", ["none of the", "could be packed"]),
    ("pack {d}/images /proc/x.lmdb", ["/proc/x.lmdb", "virtual file system"]),
    ("pack {d}/images /proc/x.shards", ["/proc/x.shards", "virtual file system"]),
    ("pack {d}/images .", ["name of its own"]),
    ("pack {d}/images ..", ["name of its own"]),
    ("pack {d}/images /", ["name of its own"]),
    ("pack {d}/images {d}/images/in.lmdb", ["inside the source"]),
    ("pack {d}/images {d}/p.lmdb", ["--overwrite"]),
    ("pack {d}/images {d}/no/such/x.lmdb", ["does not exist"]),
    ("pack {d}/images {d}/x.lmdb --quality 500 --encoding jpeg", ["--quality 500"]),
    ("pack {d}/images {d}/x.lmdb --quality abc", ["--quality", "abc"]),
    ("pack {d}/images {d}/x.lmdb --workers 0", ["--workers 0"]),
    ("pack {d}/images {d}/x.shards --shard-size 0", ["--shard-size"]),
    ("pack {d}/images {d}/x.shards --shard-size lots", ["--shard-size", "lots"]),
    ("pack {d}/images {d}/x.lmdb --size 0x5 --encoding raw", ["--size", "0x5"]),
    ("pack {d}/images {d}/x.lmdb --size 8x8", ["--size", "raw"]),
    ("pack {d}/images {d}/x.lmdb --max-side 8", ["--max-side"]),
    ("pack {d}/images {d}/x.lmdb --max-pixels -5", ["--max-pixels -5"]),
    ("pack {d}/images {d}/x.lmdb --encoding jpg", ["--encoding", "did you mean 'jpeg'"]),
    ("pack {d}/images {d}/x.lmdb --encodng jpeg", ["--encodng", "did you mean '--encoding'"]),
    ("pack {d}/images {d}/x.lmdb --task-files 4", ["--engine ray"]),
    ("pack {d}/images", ["dst"]),
    ("pack {d}/images {d}/x.lmdb extra", ["extra"]),
    # the other commands
    ("pakc {d}/images {d}/x.lmdb", ["did you mean 'pack'"]),
    ("--versoin", ["did you mean '--version'"]),
    ("info {d}/nope", ["nope", "no such pack"]),
    ("info {d}/images", ["not a pack"]),
    ("info {d}/file.txt", ["file.txt"]),
    ("info {d}/p.lmdb --jsn", ["did you mean '--json'"]),
    ("verify {d}/nope", ["no such pack"]),
    ("verify {d}/images --decode", ["not a pack"]),
    ("unpack {d}/p.lmdb /proc/out", ["/proc/out", "virtual file system"]),
    ("unpack {d}/p.lmdb {d}/file.txt", ["not a folder"]),
    ("unpack {d}/p.lmdb {d}/images", ["not empty", "--overwrite"]),
    ("unpack {d}/nope {d}/out", ["no such pack"]),
    ("merge {d}/m.lmdb {d}/nope", ["no such pack"]),
    ("merge /proc/m.lmdb {d}/p.lmdb", ["virtual file system"]),
    ("merge {d}/m.lmdb {d}/p.lmdb {d}/p.lmdb", ["given twice"]),
    ("tune {d}/p.lmdb --step-ms -5", ["--step-ms -5"]),
    ("tune {d}/p.lmdb --step-ms 5 --batch-size 0", ["--batch-size 0"]),
    ("tune {d}/p.lmdb --step-ms 5 --budget -1", ["--budget -1"]),
    ("tune {d}/p.lmdb --step-ms 5 --max-workers -1", ["--max-workers -1"]),
    ("tune {d}/p.lmdb --budget 0", ["--budget 0"]),
    ("tune {d}/nope --step-ms 5", ["nope"]),
    ("tune {d}/p.lmdb --step-ms 5 --save /proc/x.json", ["--save", "virtual file system"]),
    ("tune {d}/p.lmdb --step-ms 5 --plot {d}/no/such/x.png", ["--plot", "does not exist"]),
    ("doctor {d}/nope", ["nope", "not found"]),
    ("doctor {d}/images --step-ms -5", ["--step-ms"]),
    ("doctor {d}/images --batch-size 0", ["--batch-size 0"]),
    ("doctor {d}/images --workers -1", ["--workers -1"]),
    ("doctor {d}/images --no-mesure", ["did you mean '--no-measure'"]),
    ("demo --count 5", ["--count 5"]),
    ("demo --dir /proc/demo", ["--dir", "virtual file system"]),
]


@pytest.mark.parametrize(("argv", "words"), BAD, ids=[argv.split(" {d}")[0] + f"-{i}" for i, (argv, _) in enumerate(BAD)])
def test_bad_input_ends_in_one_line(place: Path, capsys: pytest.CaptureFixture[str], argv: str,
                                    words: list[str]) -> None:
    if "/proc/" in argv and not os.path.isdir("/proc/self"):
        pytest.skip("needs /proc")
    code, err = run(argv.format(d=place).split(), capsys)
    lines = err.strip().splitlines()
    assert code != 0, err
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for word in words:
        assert word in lines[0], lines[0]


def test_the_pack_command_speaks_the_same(place: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run([str(place / "images"), str(place / "x.lmdb"), "--overwirte"], capsys, pack_main)
    assert code == 2 and err.count("\n") == 1 and "did you mean '--overwrite'" in err


def test_resume_names_the_option_that_differs(place: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupted pack resumed with another --encoding: the line names it, not a Python dict."""
    import packload.packer.pipeline as pipeline

    dst = place / "r.lmdb"

    real, calls = pipeline.write_or_skip, []

    def killed(*args: object) -> int:  # interrupted after 4 files, past two checkpoints
        calls.append(1)
        if len(calls) > 4:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(pipeline, "write_or_skip", killed)
    with pytest.raises(KeyboardInterrupt):
        pipeline.pack(place / "images", dst, progress=False, checkpoint_every=2)
    monkeypatch.undo()
    code, err = run(["pack", str(place / "images"), str(dst), "--resume", "--encoding", "jpeg", "--quiet"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--encoding was keep, now jpeg" in err and "{" not in err


def test_options_changed_lists_each_flag() -> None:
    before = {"backend": "lmdb", "encoding": "keep", "quality": 90, "size": None}
    now = {"backend": "shards", "encoding": "raw", "quality": 90, "size": [8, 8]}
    assert options_changed(before, now) == ("--format was lmdb, now shards; --encoding was keep, now raw; "
                                            "--size was unset, now 8x8")


def test_python_names_become_flags() -> None:
    from packload.cli import build_parser
    from packload.cli_parser import subcommand_parser

    parser = build_parser()
    tune = subcommand_parser(parser, parser.parse_args(["tune", "x", "--step-ms", "1"]))
    assert in_flag_names("step_ms -5.0 must be positive", tune) == "--step-ms -5.0 must be positive"
    assert in_flag_names("budget_s -1.0 and max_workers -1", tune) == "--budget -1.0 and --max-workers -1"
    assert in_flag_names("/data/step_ms/x.jpg is fine", tune) == "/data/step_ms/x.jpg is fine"  # paths kept
    assert did_you_mean("verfy", ["verify", "info"]) == " (did you mean 'verify'?)"
    assert did_you_mean("zzz", ["verify", "info"]) == ""


def test_library_log_records_stay_off_stderr_unless_logging_is_configured(capsys):
    """A library's error record with its traceback (as gcsfs logs a request it gave up on) is not
    printed while a command runs; a program that configured logging still gets its records."""
    import logging  # noqa: PLC0415

    from packload.cli_parser import library_logs_quiet  # noqa: PLC0415

    library = logging.getLogger("some_store_client")
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers.clear()  # as in a fresh `packload` process: nothing configured
    try:
        with library_logs_quiet():
            try:
                raise ConnectionRefusedError("connect failed")
            except ConnectionRefusedError:
                library.exception("request out of retries")
        assert capsys.readouterr().err == ""
        library.error("after the command")  # Python's last resort prints it again
        assert "after the command" in capsys.readouterr().err
        records: list[logging.LogRecord] = []
        handler = logging.Handler()
        handler.emit = records.append  # type: ignore[method-assign]
        root.addHandler(handler)
        with library_logs_quiet():
            library.error("configured")
        assert [r.getMessage() for r in records] == ["configured"]
    finally:
        root.handlers[:] = saved
