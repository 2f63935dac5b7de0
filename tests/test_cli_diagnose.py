"""The subcommands that measure (``packload.cli_diagnose``), run by their handlers: their verdicts
and fixes pass through the command's own words, ``tune`` refuses a file it could not write before
any search and saves the pick it found, and the demo speaks of ``tune``'s flags."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from packload.cli_diagnose import add_doctor, add_tune, tune_parser
from packload.cli_parser import in_flag_names
from packload.cli_report import EXIT_OK
from packload.core.errors import UsageError
from packload.diagnose import tune_inputs
from tests.diagnose.test_tune_result import result as hand_built


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="packload")
    sub = parser.add_subparsers(dest="command")
    add_tune(sub)
    add_doctor(sub)
    args = parser.parse_args(argv)
    args.cli_words = lambda text: f"<{text}>"  # what the command line sets: its flags for the library's names
    return args


def test_the_demo_speaks_of_tunes_flags() -> None:
    parser = tune_parser()
    assert parser.prog == "packload tune"
    assert in_flag_names("give a larger budget_s, or max_workers 8", parser) == "give a larger --budget, or --max-workers 8"


def test_tune_refuses_a_file_it_could_not_write_before_searching(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tune_inputs, "tune_path", lambda *a, **k: pytest.fail("the search ran"))
    args = parsed("tune", str(tmp_path), "--save", str(tmp_path / "missing" / "loader.json"))
    with pytest.raises(UsageError, match="--save .*the folder .*missing does not exist"):
        args.run(args)


def test_tune_saves_its_pick_and_says_its_verdict_in_the_commands_words(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    tuned = hand_built()
    tuned.message = "give a larger budget_s"
    monkeypatch.setattr(tune_inputs, "tune_path", lambda *a, **k: tuned)
    args = parsed("tune", str(tmp_path), "--save", str(tmp_path / "loader.json"), "--json")
    assert args.run(args) == EXIT_OK
    document = json.loads(capsys.readouterr().out)
    assert document["command"] == "tune" and document["message"] == "<give a larger budget_s>"
    assert json.loads((tmp_path / "loader.json").read_text())["loader"] == tuned.loader_kwargs()


def test_doctors_verdict_checks_and_fixes_pass_through_the_commands_words(
        capsys: pytest.CaptureFixture[str]) -> None:
    args = parsed("doctor", "--no-measure", "--json", "--quiet")
    assert args.run(args) == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["command"] == "doctor" and report["verdict"].startswith("<") and report["verdict"].endswith(">")
    assert report["checks"] and all(item["message"].startswith("<") for item in report["checks"])
    assert all(not item["fix"] or item["fix"].startswith("<") for item in report["checks"])
