"""A flat folder of images and a table beside it, for the tests of packing from a table: a column of
every field type, and a row (or an image) of every kind the packer must leave out and say so."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

# Good rows: (path, label, age, height, smiling, caption, attrs, embedding, id)
GOOD = [
    ("a.png", "dog", "3", "0.5", "true", "a dog, running", "[0,1,1]", "[0.5,-1.25]", "007"),
    ("b.png", "cat", "12", "1e-3", "false", 'says "meow"', "[1,0,0]", "[2]", "017"),
    ("c.png", "emu", "-4", "2.0", "TRUE", "ñandú 犬\nsecond line", "[]", "[]", "100"),
    ("d.png", "cat", "0", "inf", "false", "", "[1,1,1]", "[1e10,0.1,3]", "042"),
    ("e.png", "dog", "9007199254740993", "-0.0", "true", "  spaced  ", "[5]", "[0.25]", "5"),
]
TYPES = {"age": "int", "height": "float", "smiling": "bool", "caption": "string", "attrs": "list[int]",
         "embedding": "list[float]", "id": "string"}
HEADER = ["path", "label", "age", "height", "smiling", "caption", "attrs", "embedding", "id"]
# Rows that cannot be used, each with what the manifest must say of it (a word of the reason).
BAD_ROWS = [
    (("ghost.png", "dog", "1", "1", "true", "no image", "[1]", "[1]", "1"), "no image"),
    (("dup.png", "dog", "1", "1", "true", "first", "[1]", "[1]", "1"), "row"),
    (("dup.png", "cat", "2", "2", "false", "second", "[2]", "[2]", "2"), "row"),
    (("old.png", "dog", "old", "1", "true", "bad age", "[1]", "[1]", "1"), "'old' is not an integer"),
    (("noage.png", "cat", "", "1", "true", "missing age", "[1]", "[1]", "1"), "is empty"),
    (("badlist.png", "cat", "1", "1", "true", "bad list", "[1,x]", "[1]", "1"), "list"),
    (("nolabel.png", "", "1", "1", "true", "no class", "[1]", "[1]", "1"), "class"),
    (("", "cat", "1", "1", "true", "no path", "[1]", "[1]", "1"), "path is empty"),
]
MALFORMED = "short.png,cat,1\n"  # 3 cells where the header names 9
NO_ROW = "norow.png"  # an image the table does not name
SKIPPED_IMAGES = {"dup.png", "old.png", "noage.png", "badlist.png", "nolabel.png"}  # a row that cannot be used
NO_ROW_IMAGES = [NO_ROW, "short.png"]  # short.png's row is malformed: no row gives its path


@dataclass
class Source:
    """The folder, its table and what packing them must give."""

    root: Path
    table: Path
    good: list[tuple[str, ...]] = field(default_factory=lambda: list(GOOD))

    @property
    def paths(self) -> list[str]:
        """The packed records' paths, in record order (the folder's, sorted)."""
        return sorted(row[0] for row in self.good)

    def row(self, path: str) -> dict[str, str]:
        return dict(zip(HEADER, next(r for r in self.good if r[0] == path), strict=True))


def write_images(root: Path, names: list[str]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for k, name in enumerate(names):
        pixels = np.full((6 + k % 3, 8, 3), 17 * k % 256, np.uint8)
        pixels[0, 0] = (k, 255 - k, 7)
        Image.fromarray(pixels).save(root / name)


def make_source(base: Path, bad: bool = True) -> Source:
    """``base/images`` (flat: every image at the top) and ``base/labels.csv`` beside it; with ``bad``,
    a row or an image of every kind that is left out."""
    root = base / "images"
    names = [row[0] for row in GOOD] + ([*NO_ROW_IMAGES, *sorted(SKIPPED_IMAGES)] if bad else [])
    write_images(root, names)
    table = base / "labels.csv"
    with open(table, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(HEADER)
        rows = list(GOOD) + ([row for row, _ in BAD_ROWS] if bad else [])
        for row in rows:
            writer.writerow(row)
        if bad:
            f.write(MALFORMED)
    return Source(root, table)


def write_jsonl(source: Source, path: Path) -> None:
    """The good rows as JSON lines, with JSON's own types."""
    with open(path, "w", encoding="utf-8") as f:
        for row in source.good:
            cells = dict(zip(HEADER, row, strict=True))
            f.write(json.dumps({"path": cells["path"], "label": cells["label"], "age": int(cells["age"]),
                                "height": float(cells["height"]), "smiling": cells["smiling"].lower() == "true",
                                "caption": cells["caption"], "attrs": json.loads(cells["attrs"]),
                                "embedding": json.loads(cells["embedding"]), "id": cells["id"]}) + "\n")


def typed(name: str, text: str) -> Any:
    """A cell of the table read as its column's type (how tables compare up to number formatting)."""
    kind = TYPES.get(name, "string")
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    if kind == "bool":
        return text.strip().lower() in ("true", "1")
    if kind.startswith("list"):
        return [float(v) for v in json.loads(text)]
    return text


def read_table(path: Path) -> dict[str, dict[str, Any]]:
    """A CSV table as {path: {column: typed value}}."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return {row["path"]: {k: typed(k, v) for k, v in row.items() if k != "path"} for row in rows}
