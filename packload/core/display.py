"""Text from packs and folders made safe to print on a terminal.

Class names, record paths and skipped file names come from data packload did not write; printed
as they are, an ESC sequence among them would drive the user's terminal (move the cursor, rewrite
earlier lines, change the window title), and a newline would forge a line of output. Every such
character is shown escaped instead (``\\x1b``), as Python's ``repr`` would show it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

# C0 controls (newline and tab included: output lines are one line each), DEL, C1 controls, and the
# bidirectional overrides that reorder what the terminal shows.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: object) -> str:
    """``str(text)`` with every control character escaped: one printable line."""
    return _UNSAFE.sub(_escaped, str(text))


# What ``json.dumps(..., ensure_ascii=False)`` leaves raw but a terminal acts on (DEL, C1 controls,
# bidirectional overrides), and lone surrogates, which cannot be printed: all written as \uXXXX.
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def json_text(result: Any) -> str:
    """``result`` as one line of JSON that is safe on a terminal and parses back to the same value."""
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(result, ensure_ascii=False, default=str))


def safe_lines(lines: Sequence[object]) -> str:
    """Lines for a terminal: each made one printable line (``terminal_safe``; lone surrogates, which
    no terminal encoding takes, written as ``\\udXXX``), then joined."""
    return "\n".join(terminal_safe(line).encode("utf-8", "backslashreplace").decode("utf-8") for line in lines)


# -- counts and names in messages --------------------------------------------------------------------
_IRREGULAR = {"class": "classes", "batch": "batches", "process": "processes", "index": "indices",
              "entry": "entries", "directory": "directories", "bus": "buses"}


def plural(count: float, word: str, many: str | None = None) -> str:
    """``count`` and ``word`` as a message says them: ``1 image``, ``2 images``, ``1,024 records``,
    ``1 class``, ``0 classes`` (``many``: the plural when it is not the usual one). Every count shown
    to a user goes through here, so that no message says "1 images"."""
    number = f"{int(count):,}" if float(count).is_integer() else f"{count:,.1f}"
    if count == 1:
        return f"{number} {word}"
    if many is None:
        many = _IRREGULAR.get(word) or (word[:-1] + "ies" if word.endswith("y") and word[-2:-1] not in "aeiou"
                                        else word + ("es" if word.endswith(("s", "sh", "ch", "x")) else "s"))
    return f"{number} {many}"


_BACKEND_NAMES = {"lmdb": "LMDB", "shards": "shards"}


def backend_name(backend: str) -> str:
    """How a backend is written in a message: ``LMDB``, ``shards``."""
    return _BACKEND_NAMES.get(backend, backend)


def pack_phrase(backend: str) -> str:
    """``an LMDB pack`` / ``a shards pack``: the article follows the sound of the name."""
    name = backend_name(backend)
    article = "an" if name[:1].lower() in "aeiou" or name == "LMDB" else "a"
    return f"{article} {name} pack"
