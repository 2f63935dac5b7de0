"""The command line's parser and its one-line errors (``packload.cli_parser``), on parsers the tests
build: a typo gets a "did you mean", library names are shown as the flags the user types, a file an
option names is checked before any work, and output to a reader that went away is noticed, not
raised at exit."""

from __future__ import annotations

import logging
import os
import sys

import pytest

from packload.cli_parser import (
    OutputClosedError,
    Parser,
    check_output_file,
    did_you_mean,
    flag_names,
    in_flag_names,
    library_logs_quiet,
    pipe_closed,
    print_warning,
    silence,
    subcommand_parser,
    subcommand_parsers,
    write_stdout,
)
from packload.core.errors import UsageError


def _parser() -> Parser:
    parser = Parser(prog="tool")
    commands = parser.add_subparsers(dest="command", parser_class=Parser)
    tune = commands.add_parser("tune", prog="tool tune")
    tune.add_argument("pack")
    tune.add_argument("--step-ms", type=float, dest="step_ms")
    tune.add_argument("--budget", type=float, dest="budget_s")
    tune.add_argument("--no-measure", action="store_false", dest="measure")
    commands.add_parser("pack", prog="tool pack").add_argument("src")
    return parser


def test_did_you_mean_names_the_closest_choice_or_nothing():
    assert did_you_mean("pakc", ["pack", "merge", "verify"]) == " (did you mean 'pack'?)"
    assert did_you_mean("zzzz", ["pack", "merge"]) == ""


def test_library_names_are_written_as_the_flags_the_user_types():
    parser = _parser()
    tune = subcommand_parser(parser, parser.parse_args(["tune", "p"]))
    assert flag_names(tune)["step_ms"] == "--step-ms" and flag_names(tune)["budget_s"] == "--budget"
    message = "step_ms must be positive; budget_s too; measure=False needs a GPU; see ./my_step_ms/x"
    assert in_flag_names(message, tune) == ("--step-ms must be positive; --budget too; --no-measure needs a GPU; "
                                            "see ./my_step_ms/x")  # a path keeps its words
    assert in_flag_names("measure the step", tune) == "measure the step"  # a plain word stays
    assert subcommand_parser(parser, parser.parse_args(["pack", "s"])).prog == "tool pack"
    assert [sub.prog for sub in subcommand_parsers(parser)] == ["tool tune", "tool pack"]


@pytest.mark.parametrize(("argv", "expected"), [
    (["tnue", "p"], "tool: error: argument command: invalid choice: 'tnue' (did you mean 'tune'?); "
                    "see `tool --help`"),
    (["tune", "p", "--step-sm", "3"], "tool tune: error: unknown option --step-sm (did you mean '--step-ms'?); "
                                      "see `tool tune --help`"),
    (["tune", "p", "extra"], "tool tune: error: unexpected argument 'extra' (too many paths?); see `tool tune --help`"),
])
def test_errors_are_one_line_with_the_fix(argv, expected, capsys):
    parser = _parser()
    with pytest.raises(SystemExit) as stopped:
        args, extra = parser.parse_known_args(argv)
        if extra:
            subcommand_parser(parser, args).refuse_unknown(extra)  # type: ignore[attr-defined]
    assert stopped.value.code == 2
    assert capsys.readouterr().err == expected + "\n"


def test_output_files_are_checked_before_any_work(tmp_path):
    check_output_file("--save", None)
    check_output_file("--save", str(tmp_path / "ok.json"))
    with pytest.raises(UsageError, match=r"--save .*/missing/x.json: the folder .*/missing does not exist; create it"):
        check_output_file("--save", str(tmp_path / "missing" / "x.json"))
    with pytest.raises(UsageError, match=r"is a folder; give a file name"):
        check_output_file("--save", str(tmp_path))
    with pytest.raises(UsageError, match=r"--save /proc/x.json: cannot be written there: .*give a file on a disk"):
        check_output_file("--save", "/proc/x.json")


def test_a_reader_gone_away_is_noticed_and_the_rest_goes_nowhere():
    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "w")
    assert not pipe_closed(stream)
    os.close(read_end)
    assert pipe_closed(stream)
    saved = sys.stdout
    sys.stdout = stream
    try:
        with pytest.raises(OutputClosedError):
            write_stdout("x" * 100_000)  # more than a pipe holds: the write meets the closed end
    finally:
        sys.stdout = saved
    silence(stream)  # now /dev/null: flushing what is left raises nothing
    stream.write("more")
    stream.flush()
    assert not pipe_closed(stream) and not pipe_closed(object())
    stream.close()


def test_warnings_are_one_line(capsys):
    print_warning(UserWarning("two\nlines"), UserWarning, "f.py", 3)
    err = capsys.readouterr().err
    assert err.startswith("packload: warning: two") and err.count("\n") == 1


def test_library_logs_stay_off_stderr_unless_logging_is_configured(capsys):
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = []
    try:
        with library_logs_quiet():
            logging.getLogger("gcsfs").error("a retried request")
        assert capsys.readouterr().err == ""
        logging.getLogger("gcsfs").error("shown")  # outside: Python's last-resort printer again
        assert "shown" in capsys.readouterr().err
        mine = logging.StreamHandler(sys.stderr)
        root.addHandler(mine)
        with library_logs_quiet():
            logging.getLogger("gcsfs").error("the program's own handler")
        assert "the program's own handler" in capsys.readouterr().err
    finally:
        root.handlers = saved
