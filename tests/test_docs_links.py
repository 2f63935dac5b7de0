"""The README and the pages under docs/ hold together: every relative link leads to a file that
exists, every ``#anchor`` to a heading of its page, and the README keeps the commands that CI and
people copy from it, in a page short enough to read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_COMMANDS = [  # copied word for word by people and by CI's set-up: they must not drift
    'pip install torch==2.13.0 && pip install -e ".[fast]" && packload demo',
    'pip install torch==2.13.0 && pip install -e ".[dev]" && python -m pytest',
    'pip install torch==2.13.0 && pip install -e ".[test]" && python -m pytest -m "not slow and not long"',
]

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"`[^`]*`")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of ``text`` outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: markup and punctuation dropped, lower case, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link: its text
    text = "".join(ch for ch in text.lower() if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor on ``page``; a repeated heading gets -1, -2... as GitHub numbers them."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(page.read_text()):
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every Markdown link on ``page`` outside code."""
    found = []
    for number, line in prose_lines(page.read_text()):
        found += [(number, target) for target in LINK.findall(CODE_SPAN.sub("", line))]
    return found


def broken(page: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with the relative links of ``page``, one line each (paths shown from ``root``)."""
    wrong = []
    for number, target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not checked here
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(root)}:{number}: {target}"
        if not linked.exists():
            wrong.append(f"{where}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            wrong.append(f"{where}: no heading with that anchor in {linked.name}")
        elif anchor and linked.suffix != ".md":
            wrong.append(f"{where}: an anchor into a file that is not Markdown")
    return wrong


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_leads_somewhere(page: Path) -> None:
    wrong = broken(page)
    assert not wrong, "\n".join(wrong)


def test_the_link_check_finds_what_is_wrong(tmp_path: Path) -> None:
    """The check itself, on pages written here: a missing file, a missing anchor and a link inside
    code are told apart from good links, and headings in code blocks are no anchors."""
    (tmp_path / "other.md").write_text("# Other\n\n## Two `words`, here\n\n## Two words here\n\n```\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n"
        "[ok](other.md) [ok](other.md#two-words-here) [ok](other.md#two-words-here-1) [ok](#page)\n"
        "[ok](https://example.com/x#y) `[in code](nowhere.md)`\n"
        "[gone](missing.md) [no anchor](other.md#not-a-heading)\n"
        "```\n[in a block](nowhere.md)\n```\n")
    assert len(links(page)) == 7  # the five good ones, the two wrong ones; none from code
    assert broken(page, root=tmp_path) == ["page.md:4: missing.md: no such file",
                     "page.md:4: other.md#not-a-heading: no heading with that anchor in other.md"]


def test_the_readme_keeps_its_commands_and_stays_short() -> None:
    text = (ROOT / "README.md").read_text()
    for command in README_COMMANDS:
        assert f"\n{command}\n" in text, f"the README lost its command, word for word: {command}"
    assert len(text.splitlines()) <= 200, "the README is a front page; the details belong in docs/"


def test_the_layout_names_files_that_exist() -> None:
    """Each file the layout table of CONTRIBUTING.md names is in its row's folder (or at the top of
    the repository, as setup.py is): a module renamed or removed shows up here."""
    missing = []
    for line in (ROOT / "docs" / "CONTRIBUTING.md").read_text().splitlines():
        row = re.match(r"\| `([\w/]+/)`", line)
        if not row:
            continue
        for name in re.findall(r"`(\w+\.(?:py|c|sh))`", line):
            if not (ROOT / row.group(1) / name).exists() and not (ROOT / name).exists():
                missing.append(f"{row.group(1)}{name}")
    assert not missing, f"CONTRIBUTING.md's layout names files that are not there: {missing}"
