"""The on-disk format is written down once, in ``packload.core.format``: no other module spells out a
``struct`` layout, a magic number, a pack file's name or an LMDB key of the format.

A grep over the sources, so that a second, drifting copy of the layout cannot come back unnoticed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from packload.core import format as fmt

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for folder in ("packload", "packer", "loaders") for p in (ROOT / folder).rglob("*.py"))
HOME = ROOT / "packload" / "core" / "format.py"
# Modules that parse other formats than ours, with struct layouts of their own: image headers
# (probe) and LMDB's pages (lmdb_meta, lmdb_pages).
OTHER_FORMATS = {ROOT / "packload" / "core" / name for name in ("probe.py", "lmdb_meta.py", "lmdb_pages.py")}

STRUCT_LAYOUT = re.compile(r"""struct\.(Struct|pack|unpack|pack_into|unpack_from|calcsize)\(\s*[rb]?["']""")
_WORDS = [*(value.decode() for value in (fmt.RECORD_MAGIC, fmt.INDEX_MAGIC, fmt.SHARD_MAGIC)),  # PLR1, ...
          fmt.MANIFEST_NAME, fmt.INDEX_NAME, fmt.PROGRESS_NAME,
          *(key.decode() for key in (fmt.LMDB_MANIFEST_KEY, fmt.LMDB_INDEX_KEY, fmt.PROGRESS_KEY))]
# Each as a string or bytes literal, in either quotes, and the start of a shard file's name.
FORMAT_LITERALS = [f"{quote}{word}{quote}" for word in _WORDS for quote in "\"'"] + ['"shard-', "'shard-"]


def code_lines(path: Path) -> list[tuple[int, str]]:
    """The lines of ``path`` with comments cut off and docstrings left out (prose may name the format)."""
    lines, in_docstring = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        quotes = stripped.count('"""')
        if in_docstring or stripped.startswith('"""'):
            in_docstring = in_docstring != (quotes % 2 == 1)
            continue
        lines.append((number, line.split("  #")[0]))
    return lines


def test_the_home_of_the_format_defines_what_is_looked_for() -> None:
    text = HOME.read_text()
    assert all(f'"{word}"' in text for word in _WORDS) and '"shard-' in text, "format.py must spell each one"
    assert STRUCT_LAYOUT.search(text)


@pytest.mark.parametrize("path", [p for p in SOURCES if p != HOME], ids=lambda p: str(p.relative_to(ROOT)))
def test_no_second_copy_of_the_format(path: Path) -> None:
    found = []
    for number, line in code_lines(path):
        if path not in OTHER_FORMATS and STRUCT_LAYOUT.search(line):
            found.append(f"{number}: a struct layout: {line.strip()}")
        found += [f"{number}: {literal}: {line.strip()}" for literal in FORMAT_LITERALS if literal in line]
    assert not found, f"{path.relative_to(ROOT)} spells out the format; import it from packload.core.format:\n" \
        + "\n".join(found)


def test_the_grep_finds_a_copy(tmp_path: Path) -> None:
    """The check itself: a hand-written header layout and a shard name are both reported."""
    copy = tmp_path / "copy.py"
    copy.write_text('import struct\nHEAD = struct.Struct("<4sIII")\nNAME = "shard-00001.bin"\n')
    lines = [line for _, line in code_lines(copy)]
    assert any(STRUCT_LAYOUT.search(line) for line in lines)
    assert any('"shard-' in line for line in lines)
