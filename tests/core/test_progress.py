"""Progress on a terminal is a tqdm bar; in a log (stderr not a terminal) it is a few plain lines."""

from __future__ import annotations

import io

from PIL import Image
from tqdm import tqdm

from packload.core.progress import LINE_STEPS, LineProgress, progress_bar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_plain_lines_a_terminal_a_bar() -> None:
    log = io.StringIO()
    bar = progress_bar(total=1000, desc="pack x", unit="img", file=log)
    assert isinstance(bar, LineProgress)
    for _ in range(1000):
        bar.update(1)
    bar.close()
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert LINE_STEPS - 1 <= len(lines) <= LINE_STEPS + 1  # one a tenth, not one per update
    assert lines[-1].startswith("pack x: done 1,000/1,000 img (100%)")
    assert isinstance(progress_bar(total=3, file=_Terminal()), tqdm)


def test_disabled_prints_nothing_and_iterates() -> None:
    log = io.StringIO()
    assert list(progress_bar(range(5), disable=True, file=log)) == [0, 1, 2, 3, 4]
    assert list(progress_bar(range(5), file=log)) == [0, 1, 2, 3, 4]
    assert log.getvalue().splitlines()[-1].startswith("done 5/5 it")


def test_pack_into_a_log_has_no_carriage_returns(tmp_path, capsys) -> None:
    from packload.cli import main

    for cls in ("a", "b"):
        (tmp_path / "src" / cls).mkdir(parents=True)
        for i in range(30):
            Image.new("RGB", (8, 8), (i, 0, 0)).save(tmp_path / "src" / cls / f"{i}.png")
    assert main(["pack", str(tmp_path / "src"), str(tmp_path / "p.lmdb")]) == 0
    assert main(["verify", str(tmp_path / "p.lmdb")]) == 0
    err = capsys.readouterr().err  # pytest's capture is no terminal, as a CI log is not
    assert "\r" not in err
    assert "pack src: done 60/60 img" in err and "verify p.lmdb: done 60/60 rec" in err


def test_a_bar_of_seconds_shows_no_rate_and_lines_of_their_own() -> None:
    """The tuner counts its budget in seconds: "1 s/s" is no rate to show; a measurement gets a line
    of its own, above a bar or among the plain lines, on the bar's file and nowhere when disabled."""
    from packload.core.progress import progress_line

    log = io.StringIO()
    bar = progress_bar(total=10, desc="tune", unit="s", file=log)
    progress_line(bar, "tune: #1 workers=0 prefetch=- pin=no: 120 img/s")
    bar.n = 5
    bar.set_postfix_str("#1 workers=0 prefetch=- pin=no: 120 img/s")
    bar.close()
    lines = log.getvalue().splitlines()
    assert lines[0] == "tune: #1 workers=0 prefetch=- pin=no: 120 img/s"
    assert lines[-1] == "tune: done 5/10 s (50%), #1 workers=0 prefetch=- pin=no: 120 img/s"
    assert not any("s/s" in line for line in lines)
    terminal = _Terminal()
    progress_line(progress_bar(total=3, file=terminal, unit="s"), "one line")
    assert "one line" in terminal.getvalue()
    quiet = io.StringIO()
    progress_line(progress_bar(total=3, file=quiet, disable=True), "nothing")
    assert quiet.getvalue() == ""
    counted = io.StringIO()
    bar = progress_bar(total=4, unit="img", file=counted)
    bar.update(4)
    bar.close()
    assert "img/s" in counted.getvalue()  # a count of things keeps its rate
