"""The ``packload`` command line (and ``pack``, its short form for ``packload pack``).

Each subcommand registers itself on the parser and runs through ``main(argv)``, which tests
call directly; the subcommands live beside this module: ``cli_pack`` (pack, merge), ``cli_read``
(info, verify, unpack) and ``cli_diagnose`` (tune, doctor, demo), and print through ``cli_report``.
Reading-side subcommands import ``loaders`` only when they run, so ``pack``
starts fast and the writer side never depends on the reader side. Bad input ends in one line
on stderr and a non-zero exit, never a traceback.

A reader that closes stdout early (``packload info x | head -4``) ends the command quietly, as Unix
tools end: nothing on stderr and exit status 141 (128 + SIGPIPE, what a shell reports for a tool that
SIGPIPE stopped). Warnings go to stderr as they happen, and with ``--json`` into its ``warnings`` too.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from packload.cli_diagnose import add_demo, add_doctor, add_tune
from packload.cli_pack import add_merge, add_pack, add_pack_arguments, pack_summary, run_pack
from packload.cli_parser import (
    OutputClosedError,
    Parser,
    in_flag_names,
    library_logs_quiet,
    pipe_closed,
    print_error,
    print_warning,
    silence,
    subcommand_parser,
    subcommand_parsers,
)
from packload.cli_read import add_info, add_unpack, add_verify
from packload.cli_report import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PIPE,
    EXIT_USAGE,
    JSON_SCHEMA_VERSION,
    json_document,
)
from packload.core.errors import PackloadError, UsageError
from packload.core.remote import is_url
from packload.core.urls import display_url
from packload.core.version import __version__

__all__ = ["COMMANDS", "EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_PIPE", "EXIT_USAGE", "JSON_SCHEMA_VERSION",
           "build_parser", "interrupted_message", "json_document", "main", "module_main", "pack_main", "pack_summary"]

COMMANDS: tuple[Callable[[Any], None], ...] = (add_pack, add_merge, add_info, add_verify, add_unpack,
                                               add_tune, add_doctor, add_demo)


def build_parser() -> Parser:
    parser = Parser(prog="packload", description="Pack image folders and load them fast in PyTorch.")
    parser.add_argument("--version", action="version", version=f"packload {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in COMMANDS:
        register(sub)
    return parser


def _run(parser: Parser, argv: Sequence[str] | None) -> int:
    try:
        return _run_command(parser, argv)
    except OutputClosedError:  # the reader of stdout went away: end quietly, as Unix tools do
        silence(sys.stdout, *([sys.stderr] if pipe_closed(sys.stderr) else []))
        return EXIT_PIPE


def _run_command(parser: Parser, argv: Sequence[str] | None) -> int:
    parser.argv = list(sys.argv[1:] if argv is None else argv)
    for sub in subcommand_parsers(parser):  # each subcommand's parser sees the words too, for its errors
        sub.argv = parser.argv
    args, extra = parser.parse_known_args(parser.argv)
    used = subcommand_parser(parser, args)
    if extra:
        used.refuse_unknown(extra)
    args.cli_words = lambda text: in_flag_names(text, used)
    args.warned = []

    def show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                     file: Any = None, line: str | None = None) -> None:
        text = in_flag_names(str(message), used)
        args.warned.append(text)  # for --json's warnings
        print_warning(text, category, filename, lineno, file, line)

    try:
        with warnings.catch_warnings(), library_logs_quiet():
            warnings.showwarning = show_warning
            return args.run(args)
    except OutputClosedError:
        raise
    except BrokenPipeError as exc:
        if pipe_closed(sys.stdout) or pipe_closed(sys.stderr):  # our output's reader, not a network peer
            silence(sys.stdout, sys.stderr)
            return EXIT_PIPE
        print_error(parser.prog, str(exc))
        return EXIT_ERROR
    except UsageError as exc:
        print_error(parser.prog, in_flag_names(str(exc), used))
        return EXIT_USAGE
    except PackloadError as exc:
        print_error(parser.prog, in_flag_names(str(exc), used))
        return EXIT_ERROR
    except OSError as exc:  # a file we could not read or write: name it, no traceback
        print_error(parser.prog, str(exc))
        return EXIT_ERROR
    except ValueError as exc:  # a value the library refused, in its Python names
        print_error(parser.prog, in_flag_names(str(exc), used))
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{parser.prog}: {interrupted_message(args)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug: still one line, with what to report
        print_error(parser.prog, f"unexpected {type(exc).__name__}: {exc}; this is a bug in packload "
                                 f"{__version__}, please report it with the command you ran")
        return EXIT_ERROR


def interrupted_message(args: argparse.Namespace) -> str:
    """What Ctrl-C left, and the way on that will be accepted: ``--resume`` only where it applies (a
    pack to a local destination, or any of the Ray engine's); a pack to a URL by this machine
    publishes nothing and removes what it uploaded, so the same command starts again."""
    if args.run is not run_pack:
        return "interrupted"
    if getattr(args, "engine", "local") == "local" and is_url(args.dst):
        return (f"interrupted; nothing was published at {display_url(args.dst)} (what this run uploaded is removed); "
                "run the same command again to pack it")
    return "interrupted; the unfinished pack can be finished with the same command and --resume"


def main(argv: Sequence[str] | None = None) -> int:
    """``packload COMMAND ...``; returns the exit code."""
    return _run(build_parser(), argv)


def pack_main(argv: Sequence[str] | None = None) -> int:
    """``pack SRC DEST ...``, the short form of ``packload pack``."""
    parser = Parser(prog="pack", description="Pack an image folder into an .lmdb file "
                     "or a shards folder (short for `packload pack`).")
    add_pack_arguments(parser)
    parser.set_defaults(run=run_pack)
    return _run(parser, argv)


def module_main(argv: Sequence[str] | None = None) -> int:
    """``python -m packload``: ``packload`` when the first word is a subcommand, else ``pack``."""
    words = list(sys.argv[1:] if argv is None else argv)
    names = {"pack", "merge", "info", "verify", "unpack", "doctor", "tune", "demo", "-h", "--help", "--version"}
    return main(words) if words and words[0] in names else pack_main(words)
