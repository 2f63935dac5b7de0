"""What a table to pack is and how its columns are to be read (``pack --labels``, ``--path-column``,
``--label-column``, ``--field NAME:TYPE``): the options every later step of packing from a table
takes."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from packload.core.fields import parse_type
from packload.core.format import FIELD_TYPES


@dataclass(frozen=True)
class TableOptions:
    """A table to pack beside the images (``pack --labels``): its file (or URL), the column of image
    paths, the class column (None: ``label`` when the table has one), and types given for columns
    (``{"age": "int"}``; the others are inferred)."""

    path: str
    path_column: str = "path"
    label_column: str | None = None
    types: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", os.fspath(self.path))
        object.__setattr__(self, "types", {name: parse_type(kind) for name, kind in dict(self.types).items()})

    @property
    def name(self) -> str:
        """The table's file name."""
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    def record(self) -> dict[str, Any]:
        """The options as the manifest and ``--resume`` note them (the table's digest added by the caller)."""
        return {"table": self.name, "path_column": self.path_column, "label_column": self.label_column,
                "types": dict(sorted(self.types.items()))}


def table_options(labels: str | os.PathLike[str] | TableOptions) -> TableOptions:
    """``labels`` as ``TableOptions`` (a path or URL: the defaults)."""
    return labels if isinstance(labels, TableOptions) else TableOptions(os.fspath(labels))


def parse_field_spec(text: str) -> tuple[str, str]:
    """``age:int`` → ``("age", "int")`` (``--field``); ``ValueError`` naming the form otherwise."""
    name, sep, kind = text.rpartition(":")
    if not sep or not name:
        raise ValueError(f"--field {text!r}: write NAME:TYPE, for example age:int (types: {', '.join(FIELD_TYPES)})")
    try:
        return name, parse_type(kind)
    except ValueError as exc:
        raise ValueError(f"--field {text!r}: {exc}") from None
