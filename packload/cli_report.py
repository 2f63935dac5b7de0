"""How a command's result is printed: its lines for a person, or with ``--json`` one document of
the shape every command shares; and the exit statuses the commands return.

Class names, record paths and skipped file names come from data packload did not write, so every
line printed goes through ``display.terminal_safe`` (an ESC sequence among them would drive the
user's terminal, a newline would forge a line), and ``--json`` output escapes the controls that
``json.dumps`` leaves raw.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from packload.cli_parser import write_stdout
from packload.core.display import json_text, safe_lines

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_PIPE = 141  # stdout's reader went away: 128 + SIGPIPE, as a shell reports a Unix tool stopped by it
JSON_SCHEMA_VERSION = 1  # of the shape every --json output shares (docs/CLI.md)


def json_document(command: str, result: dict[str, Any], warnings_: Sequence[str] = ()) -> dict[str, Any]:
    """The shape of every ``--json`` output (docs/CLI.md): ``schema_version`` and ``command`` first,
    then the command's own keys, then ``warnings`` (each warning the command gave, as on stderr).
    ``schema_version`` rises when a key changes meaning or goes away."""
    return {"schema_version": JSON_SCHEMA_VERSION, "command": command,
            **{k: v for k, v in result.items() if k not in ("schema_version", "warnings")},
            "warnings": [*result.get("warnings", []), *warnings_]}


def print_report(args: argparse.Namespace, result: Any, lines: Sequence[object]) -> None:
    """``lines`` on stdout, or with ``--json`` the result as the shared document (its warnings included)."""
    command = getattr(args, "command", None) or "pack"
    write_stdout(json_text(json_document(command, result, getattr(args, "warned", ())))
                 if args.json else safe_lines(lines))


def in_flags(args: argparse.Namespace, text: str) -> str:
    """``text`` (a verdict, a fix) with the library's parameter names written as this command's flags."""
    words = getattr(args, "cli_words", None)
    return words(text) if words is not None else text


def emit(args: argparse.Namespace, result: dict[str, Any], lines: list[str]) -> None:
    """``print_report``, unless ``--quiet`` asked for nothing and the command did not fail."""
    if args.json or not getattr(args, "quiet", False) or not result.get("ok", True):
        print_report(args, result, lines)
