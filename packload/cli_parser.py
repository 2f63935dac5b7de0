"""The command line's parser and its one-line errors.

argparse prints its usage block and then the error; a new user needs one line that names what was
wrong and how to fix it. This module gives that: a typo'd subcommand or option gets a "did you
mean", and an error raised by the library in its Python names (``step_ms``) is shown in the flag
names the user typed (``--step-ms``).
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import re
import select
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

from packload.core.display import safe_lines
from packload.core.errors import UsageError
from packload.core.storage import unwritable_reason

# Library parameter names whose flag is not the parameter's own name.
PARAMETER_FLAGS = {"budget_s": "--budget", "tune_budget_s": "--budget", "measure": "--no-measure"}


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'pack'?)"`` for the closest of ``choices``, or ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string (``--step-ms``, ``-h``...) that ``parser`` accepts."""
    return [flag for action in parser._actions for flag in action.option_strings]


def flag_names(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Python name → the long flag that sets it, for every option of ``parser`` (and the names of
    ``PARAMETER_FLAGS`` whose flag it has)."""
    flags = set(option_strings(parser))
    names = {name: flag for name, flag in PARAMETER_FLAGS.items() if flag in flags}
    for action in parser._actions:
        longs = [flag for flag in action.option_strings if flag.startswith("--")]
        if longs and action.dest not in ("help", "version"):
            names[action.dest] = longs[0]
    return names


def in_flag_names(message: str, parser: argparse.ArgumentParser) -> str:
    """``message`` with each Python parameter name (``step_ms``) written as its flag (``--step-ms``).

    Only names with an underscore are replaced, and only as whole words outside paths and flags, so
    a file name or plain word is left as it is; a name without one (``measure``, a plain word too)
    only where it is written as a parameter is, ``measure=False``, and the whole setting becomes the flag."""
    for name, flag in sorted(flag_names(parser).items(), key=lambda item: -len(item[0])):
        if "_" in name:
            message = re.sub(rf"(?<![\w\-/.]){re.escape(name)}(?![\w\-/.])", flag, message)
        elif name in PARAMETER_FLAGS:
            message = re.sub(rf"(?<![\w\-/.]){re.escape(name)}=\w+", flag, message)
    return message


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (with a "did you mean" for a typo), and whose messages
    (usage errors quote what was typed: a file name, say) are printed safely."""

    def _print_message(self, message: str, file: Any = None) -> None:
        if not message:
            return
        out = file or sys.stderr
        try:
            out.write(safe_lines(message.split("\n")))
            out.flush()
        except BrokenPipeError:  # `packload --help | head -3`: the reader went away
            raise OutputClosedError from None

    argv: list[str] | None = None  # the words being parsed, set by the caller for a better error

    def error(self, message: str) -> NoReturn:
        """Print ``prog: error: MESSAGE; see `prog --help``` on one line and exit with status 2."""
        if "arguments are required" in message and self.argv:
            known = option_strings(self)
            unknown = [w for w in self.argv if w.startswith("-") and w.split("=", 1)[0] not in known]
            if unknown and not any(w in ("-h", "--help") for w in self.argv):
                self.refuse_unknown(unknown)  # `packload --versoin`: the typo, not the missing COMMAND
        choice = re.search(r"invalid choice: '(.*?)' \(choose from (.*)\)", message)
        if choice:
            hint = did_you_mean(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)))
            if hint:
                message = message.split(" (choose from", 1)[0] + hint
        self.exit(2, safe_lines([f"{self.prog}: error: {message}; see `{self.prog} --help`"]) + "\n")

    def refuse_unknown(self, extra: list[str]) -> NoReturn:
        """The error for words this (sub)parser does not know, with the nearest option for a typo."""
        word = extra[0]
        if word.startswith("-"):
            flag = word.split("=", 1)[0]
            self.error(f"unknown option {flag}" + did_you_mean(flag, option_strings(self)))
        self.error(f"unexpected argument {word!r} (too many paths?)")


def subcommand_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the subcommand ``args`` ran (``parser`` itself when it has none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(getattr(args, "command", None), parser)
    return parser


def check_output_file(flag: str, path: str | None) -> None:
    """``UsageError`` before any work when the file an option names (``--save FILE``) cannot be
    written: its folder missing, or on a virtual or read-only file system."""
    if path is None:
        return
    parent = os.path.dirname(os.path.abspath(path))
    why = unwritable_reason(parent)
    if why:
        raise UsageError(f"{flag} {path}: cannot be written there: {why}; give a file on a disk you can write to")
    if not os.path.isdir(parent):
        raise UsageError(f"{flag} {path}: the folder {parent} does not exist; create it first")
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path}: is a folder; give a file name")


def subcommand_parsers(parser: argparse.ArgumentParser) -> list[Parser]:
    """The parsers of ``parser``'s subcommands (none for the ``pack`` command)."""
    return [sub for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for sub in action.choices.values() if isinstance(sub, Parser)]


def print_error(prog: str, message: str) -> None:
    """``prog: error: message`` on one line of stderr (nowhere, if stderr's reader has gone away)."""
    _write_stderr(safe_lines([f"{prog}: error: {message}"]), sys.stderr)


def print_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    """A ``warnings.showwarning`` for the command line: ``packload: warning: ...`` on one line."""
    _write_stderr(safe_lines([f"packload: warning: {message}"]), file or sys.stderr)


def _write_stderr(text: str, stream: Any) -> None:
    try:
        print(text, file=stream, flush=True)
    except BrokenPipeError:  # `packload ... 2>&1 | head -1`: no one reads it any more
        silence(stream)


@contextmanager
def library_logs_quiet() -> Iterator[None]:
    """While a command runs, the log records of the libraries it calls stay off stderr (gcsfs logs
    each request it gave up on, with its traceback); the command reports a failure in one line of
    its own. Where the program has configured logging (a handler on the root logger), nothing changes."""
    root = logging.getLogger()
    if root.handlers:
        yield
        return
    quiet = logging.NullHandler()  # a handler found: Python's last-resort printer to stderr is not used
    root.addHandler(quiet)
    try:
        yield
    finally:
        root.removeHandler(quiet)


# -- output to a reader that may go away -----------------------------------------------------------
class OutputClosedError(Exception):
    """stdout's reader went away before the output was written (``packload info x | head -4``)."""


def write_stdout(text: str) -> None:
    """``text`` and a newline on stdout, flushed at once, so that a reader gone away shows here as
    ``OutputClosedError`` (and not as an error when the interpreter flushes at exit)."""
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        raise OutputClosedError from None


def pipe_closed(stream: Any) -> bool:
    """Whether ``stream`` writes into a pipe whose reader has closed it (``poll`` reports an error
    on such a pipe's write end): what tells a closed stdout or stderr from a failed network write."""
    try:
        fd = stream.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def silence(*streams: Any) -> None:
    """Point ``streams`` at /dev/null, so that nothing more (the interpreter's flush at exit
    included) is written into a pipe nobody reads; streams without a file descriptor are left."""
    for stream in streams:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, stream.fileno())
            finally:
                os.close(devnull)
        except (OSError, ValueError, AttributeError):
            continue
        try:
            stream.flush()  # what was left in its buffer goes to /dev/null now
        except (OSError, ValueError):
            pass
