"""A table's cells and their types: what type a column's cells fit (inferred from every cell
seen), and each cell converted to its column's type, or refused with the reason (``BadCell``).
Text cells are read as a CSV gives them ("3", "1e-3", "true", "[1,2]"); a JSON or Parquet table's
numbers, booleans and lists are taken as they are."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from packload.core.scan import printable

_INT64 = (-(1 << 63), (1 << 63) - 1)
_INT_TEXT = re.compile(r"[+-]?\d+")
_FLOAT_TEXT = re.compile(r"[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|inf|infinity|nan)", re.IGNORECASE)
_LEADING_ZERO = re.compile(r"[+-]?0\d")
_BOOL_TEXT = {"true": True, "false": False, "1": True, "0": False}


# -- inferring a column's type --------------------------------------------------------------------
def _kind(cell: Any) -> str | None:
    """What a cell looks like, for inferring its column's type: bool, int, float, list[int],
    list[float], list (another list), or text; None for an empty cell (not counted)."""
    if cell is None:
        return None
    if isinstance(cell, str):
        text = cell.strip()
        if not text:
            return None if not cell else "text"
        low = text.lower()
        if low in ("true", "false"):
            return "bool"
        if _INT_TEXT.fullmatch(text):  # a leading zero ("007": an id, a code) is kept as text
            return "int" if _INT64[0] <= int(text) <= _INT64[1] and not _LEADING_ZERO.match(text) else "text"
        if _FLOAT_TEXT.fullmatch(text):
            return "float" if not _LEADING_ZERO.match(text) else "text"
        if text.startswith("["):
            try:
                value = json.loads(text)
            except (ValueError, RecursionError):
                return "text"
            return _kind(value) if isinstance(value, list) else "text"
        return "text"
    if isinstance(cell, bool):
        return "bool"
    if isinstance(cell, int):
        return "int" if _INT64[0] <= cell <= _INT64[1] else "text"
    if isinstance(cell, float):
        return "float"
    if isinstance(cell, list):
        kinds = {_scalar_kind(v) for v in cell}
        if kinds <= {"int"}:
            return "list[int]"
        return "list[float]" if kinds <= {"int", "float"} else "list"
    return "text"


def _scalar_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "other"
    if isinstance(value, int):
        return "int" if _INT64[0] <= value <= _INT64[1] else "other"
    return "float" if isinstance(value, float) else "other"


def inferred(kinds: set[str]) -> str:
    """The narrowest type every kind of cell seen fits."""
    for kind, fits in (("bool", {"bool"}), ("int", {"int"}), ("float", {"int", "float"}),
                       ("list[int]", {"list[int]"}), ("list[float]", {"list[int]", "list[float]"})):
        if kinds and kinds <= fits:
            return kind
    return "string"


@dataclass
class Inference:
    """What the cells of one column looked like (pass 1): the kinds seen, how many were numbers
    and how many not, and the first that was not (for the warning that a column is stored as text)."""

    kinds: set[str] = field(default_factory=set)
    numbers: int = 0
    others: int = 0
    example: tuple[int, Any] | None = None

    def see(self, number: int, cell: Any) -> None:
        """Count ``cell``, of row ``number`` (an empty cell counts as nothing)."""
        kind = _kind(cell)
        if kind is None:
            return
        self.kinds.add(kind)
        if kind in ("int", "float"):
            self.numbers += 1
        else:
            self.others += 1
            if self.example is None:
                self.example = (number, cell)


# -- converting a cell to its column's type -------------------------------------------------------
class BadCell(Exception):
    """A row or a cell that cannot be used, and why."""


def shown_cell(cell: Any) -> str:
    """``cell`` as a reason quotes it: printable, and cut short past 60 characters."""
    text = cell if isinstance(cell, str) else json.dumps(cell)
    return repr(printable(text[:60] + ("..." if len(text) > 60 else "")))


def to_int(cell: Any) -> int:
    """An integer cell (text or number) as a 64-bit integer; ``BadCell`` otherwise."""
    if isinstance(cell, str) and _INT_TEXT.fullmatch(cell.strip()):
        value = int(cell.strip())
    elif isinstance(cell, int) and not isinstance(cell, bool):
        value = cell
    else:
        raise BadCell(f"{shown_cell(cell)} is not an integer")
    if not _INT64[0] <= value <= _INT64[1]:
        raise BadCell(f"{shown_cell(cell)} does not fit a 64-bit integer")
    return value


def to_float(cell: Any) -> float:
    """A number cell (text or number) as a float; ``BadCell`` otherwise."""
    if isinstance(cell, str) and _FLOAT_TEXT.fullmatch(cell.strip()):
        return float(cell.strip())
    if isinstance(cell, (int, float)) and not isinstance(cell, bool):
        return float(cell)
    raise BadCell(f"{shown_cell(cell)} is not a number")


def to_bool(cell: Any) -> bool:
    """true, false, 1 or 0 (text in any case, or a JSON boolean) as a bool; ``BadCell`` otherwise."""
    if isinstance(cell, bool):
        return cell
    if isinstance(cell, str) and cell.strip().lower() in _BOOL_TEXT:
        return _BOOL_TEXT[cell.strip().lower()]
    if isinstance(cell, int) and cell in (0, 1):
        return bool(cell)
    raise BadCell(f"{shown_cell(cell)} is not true, false, 1 or 0")


def to_string(cell: Any) -> str:
    """Text as it is, a number as JSON writes it; ``BadCell`` for anything else."""
    if isinstance(cell, str):
        return cell
    if isinstance(cell, (int, float)) and not isinstance(cell, bool):
        return json.dumps(cell)
    raise BadCell(f"{shown_cell(cell)} is not text")


def to_list(cell: Any, kind: str) -> list[Any]:
    """A list cell (JSON text or a list) as the numbers of ``kind`` (list[int] or list[float]);
    ``BadCell`` otherwise, a number written as text included."""
    value = cell
    if isinstance(cell, str):
        try:
            value = json.loads(cell)
        except (ValueError, RecursionError):
            raise BadCell(f"{shown_cell(cell)} is not a JSON list") from None
    if not isinstance(value, list):
        raise BadCell(f"{shown_cell(cell)} is not a list")
    scalar = to_int if kind == "list[int]" else to_float
    try:
        return [scalar(v) if not isinstance(v, str) else _no_text(v) for v in value]
    except BadCell:
        raise BadCell(f"{shown_cell(cell)} is not a list of {'integers' if kind == 'list[int]' else 'numbers'}") from None


def _no_text(value: str) -> Any:
    raise BadCell(value)


# the converter of each scalar type (lists: ``to_list``)
CONVERT = {"int": to_int, "float": to_float, "bool": to_bool, "string": to_string}


def missing(cell: Any, kind: str) -> bool:
    """An empty cell: a missing value, except in a string column of a CSV (an empty string)."""
    return cell is None or (isinstance(cell, str) and not cell and kind != "string")
