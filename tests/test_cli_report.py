"""How a command's result is printed (``packload.cli_report``): the ``--json`` document's shape and
its warnings, lines made safe for a terminal, ``--quiet`` that hides a success but never a failure,
and the library's parameter names written as the command's flags."""

from __future__ import annotations

import argparse
import json

import pytest

from packload.cli_report import JSON_SCHEMA_VERSION, emit, in_flags, json_document, print_report


def args(**given: object) -> argparse.Namespace:
    return argparse.Namespace(**{"json": False, "quiet": False, **given})


def test_the_json_document_puts_the_shared_keys_around_the_commands_own() -> None:
    document = json_document("info", {"records": 3, "schema_version": 99, "warnings": ["from the result"]},
                             ["from stderr"])
    assert list(document) == ["schema_version", "command", "records", "warnings"]
    assert document == {"schema_version": JSON_SCHEMA_VERSION, "command": "info", "records": 3,
                        "warnings": ["from the result", "from stderr"]}
    assert json_document("verify", {})["warnings"] == []


def test_a_report_is_its_lines_or_one_json_document(capsys: pytest.CaptureFixture[str]) -> None:
    print_report(args(command="info"), {"name": "a\x1b[31mb"}, ["class a\x1b[31mb", "second\nforged line"])
    out = capsys.readouterr().out
    assert "\x1b" not in out and out.count("\n") == 2, "a control character neither colours nor forges a line"
    print_report(args(json=True, warned=["careful"]), {"name": "a\x1b[31mb"}, ["ignored"])
    document = json.loads(capsys.readouterr().out)
    assert document["command"] == "pack", "the short `pack` command has no subcommand name"
    assert document["name"] == "a\x1b[31mb" and document["warnings"] == ["careful"]


def test_quiet_hides_a_success_but_never_a_failure_nor_json(capsys: pytest.CaptureFixture[str]) -> None:
    emit(args(quiet=True), {"ok": True}, ["all intact"])
    assert capsys.readouterr().out == ""
    emit(args(quiet=True), {"ok": False}, ["1 damaged record"])
    assert capsys.readouterr().out == "1 damaged record\n"
    emit(args(quiet=True, json=True, command="verify"), {"ok": True}, [])
    assert json.loads(capsys.readouterr().out)["ok"] is True


def test_parameter_names_become_the_flags_the_user_typed() -> None:
    text = "give a larger budget_s"
    assert in_flags(args(), text) == text, "outside a command (no words of its own): as the library said it"
    assert in_flags(args(cli_words=lambda said: said.replace("budget_s", "--budget")), text) == "give a larger --budget"
