"""Text from packs and folders made safe to print (``packload.core.display``): control characters,
DEL, C1 controls and bidirectional overrides escaped, everything else left as it is."""

from __future__ import annotations

import json

from packload.core.display import json_text, safe_lines, terminal_safe

HOSTILE = "a\x1b[2Jb\nc\td\x7fe\x9bf\u202eg\u2066h"  # clear screen, new line, tab, DEL, CSI, RLO, LRI


def test_terminal_safe_escapes_what_drives_a_terminal() -> None:
    assert terminal_safe(HOSTILE) == "a\\x1b[2Jb\\x0ac\\x09d\\x7fe\\x9bf\\u202eg\\u2066h"
    assert terminal_safe("café/中文 ünï.png") == "café/中文 ünï.png"  # printable text is kept as is
    assert terminal_safe(42) == "42"


def test_json_text_is_one_safe_line_that_parses_back() -> None:
    value = {"path": HOSTILE, "classes": ["ünï", "\u200f"], "n": 3, "lone": "x\udcffy"}
    text = json_text(value)
    assert json.loads(text) == value
    assert "\n" not in text and not any(c in text for c in "\x1b\x7f\x9b\u202e\u2066\u200f\udcff")
    assert "ünï" in text  # not ASCII-escaped: only what a terminal acts on is


def test_safe_lines_joins_printable_lines_and_writes_lone_surrogates_out() -> None:
    out = safe_lines(["one\x1b]0;title\x07", "two \udcff", 3])
    assert out.split("\n") == ["one\\x1b]0;title\\x07", "two \\udcff", "3"]
    out.encode("utf-8")  # encodable: a lone surrogate would raise here


def test_counts_read_right_for_one_and_for_many() -> None:
    from packload.core.display import pack_phrase, plural

    assert [plural(n, "image") for n in (0, 1, 2, 1234)] == ["0 images", "1 image", "2 images", "1,234 images"]
    assert plural(1, "class") == "1 class" and plural(3, "class") == "3 classes"
    assert plural(1, "batch") == "1 batch" and plural(2, "entry") == "2 entries" and plural(2, "key") == "2 keys"
    assert plural(1, "retry") == "1 retry" and plural(4, "retry") == "4 retries"
    assert plural(2.5, "core") == "2.5 cores" and plural(1.0, "thread") == "1 thread"
    assert plural(1, "more class", "more classes") == "1 more class"
    import numpy as np

    assert plural(np.int64(1), "record") == "1 record" and plural(np.int64(10**6), "record") == "1,000,000 records"
    assert pack_phrase("lmdb") == "an LMDB pack" and pack_phrase("shards") == "a shards pack"
