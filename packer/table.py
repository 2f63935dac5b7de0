"""A table read and typed, in two passes over its rows whatever its size: the first takes every
row's path (into one bytes blob, no object per row) and infers each column's type, the second
converts every cell into typed columns held in bounded memory (``table_columns``). The class column
is settled here, and every row that cannot be used is noted with the reason."""

from __future__ import annotations

import warnings
from array import array
from typing import Any

import numpy as np

from packload.core.errors import UsageError
from packload.packer.table_columns import ColumnBuilder, Spill, SpilledColumn, steady_heap
from packload.packer.table_options import TableOptions
from packload.packer.table_read import TableReader
from packload.packer.table_types import BadCell, Inference, inferred, missing, shown_cell, to_int, to_string

MAX_INT_LABEL = 999_999  # integer labels above this are refused: the classes would be "0" to it


class Table:
    """A table read and typed: its rows' paths (one blob), its columns as arrays by row, and every
    row that cannot be used with the reason."""

    def __init__(self, options: TableOptions, storage_options: dict[str, Any] | None = None) -> None:
        steady_heap()
        self.options = options
        self.reader = TableReader(options, storage_options)
        self.problems: dict[int, str] = {}  # row index (from 0) -> why it cannot be used
        self.label_column: str | None = None
        self.label_type: str | None = None
        self.types: dict[str, str] = {}
        self.rows = -1  # until the paths are read
        if self.reader.kind == "jsonl":  # its columns are every key of every row
            self.read_paths()
        else:  # the columns are in the header: the paths are read once the images are listed (less memory)
            self._decide_columns(self.reader.header())

    def read_paths(self) -> None:
        """Pass 1 (once): every row's path, and every column's type."""
        if self.rows < 0:
            self._read_paths()

    @property
    def shown(self) -> str:
        """The table as messages name it (its path or URL)."""
        return self.reader.shown

    def _read_paths(self) -> None:
        """Pass 1: every row's path (normalised) and every column's inferred type."""
        blob, ends = bytearray(), array("q")
        inference: dict[str, Inference] = {}
        path_column = self.options.path_column
        for number, row in self.reader.rows():
            index = number - 1
            path = ""
            if isinstance(row, str):
                self.problems[index] = row
            elif path_column not in row and self.reader.kind != "jsonl":
                break  # the header has no path column: said below, once
            else:
                try:
                    path = _path_of(row.get(path_column))
                except BadCell as exc:
                    self.problems[index] = f"path {exc}"
                for name, cell in row.items():
                    if name != path_column:
                        (inference.get(name) or inference.setdefault(name, Inference())).see(number, cell)
            blob += path.encode("utf-8", "surrogatepass")
            ends.append(len(blob))
        columns = self.reader.columns
        self.rows = len(ends)
        self.sha256 = self.reader.sha256
        self.paths = bytes(blob)
        del blob
        self.path_ends = np.frombuffer(ends, np.int64) if len(ends) else np.zeros(0, np.int64)
        self._decide_columns(columns)
        self._decide_types(columns, inference)

    def _decide_columns(self, columns: list[str]) -> None:
        """Check the columns the options name, and settle the class column."""
        given, path_column = dict(self.options.types), self.options.path_column
        if path_column not in columns:
            raise UsageError(f"{self.shown}: no column {path_column!r} (its columns: {', '.join(columns[:12])}); name "
                             "the column of image paths with --path-column")
        unknown = [name for name in given if name not in columns]
        if unknown:
            raise UsageError(f"--field {unknown[0]}:{given[unknown[0]]}: {self.shown} has no column {unknown[0]!r} "
                             f"(its columns: {', '.join(columns[:12])})")
        if path_column in given:
            raise UsageError(f"--field {path_column}:{given[path_column]}: {path_column!r} is the column of image paths, "
                             "not a field")
        label = self.options.label_column
        if label is not None and label not in columns:
            raise UsageError(f"--label-column {label}: {self.shown} has no column {label!r} (its columns: "
                             f"{', '.join(columns[:12])})")
        if label is None and "label" in columns:
            label = "label"
        if label is not None and label != "label" and "label" in columns:
            raise UsageError(f"{self.shown}: a column is named 'label' but --label-column is {label!r}; 'label' "
                             "names the class when reading a pack: rename that column")
        if label == path_column:
            raise UsageError(f"--label-column {label}: that is the column of image paths; name the class column")
        if label is not None and label in given and given[label] not in ("int", "string"):
            raise UsageError(f"--field {label}:{given[label]}: the class column {label!r} holds integers or names "
                             "(int or string)")
        self.label_column = label

    def _decide_types(self, columns: list[str], inference: dict[str, Inference]) -> None:
        """Each column's type: given, or inferred from every cell seen (``inference``)."""
        given, path_column, label = dict(self.options.types), self.options.path_column, self.label_column
        for name in columns:
            if name == path_column:
                continue
            seen = inference.get(name, Inference())
            kind = given.get(name) or inferred(seen.kinds)
            if name == label:
                self.label_type = kind if name in given else ("int" if seen.kinds <= {"int"} and seen.kinds
                                                              else "string")
                continue
            if (name not in given and kind == "string" and seen.example and seen.numbers > seen.others
                    and seen.others <= max(1, seen.numbers // 100)):
                number, cell = seen.example  # a column of numbers but for a few cells: said, not guessed
                some = f"{seen.others:,} of its cells is not a number" if seen.others == 1 else \
                    f"{seen.others:,} of its cells are not numbers"
                warnings.warn(f"{self.shown}: column {name!r} is stored as text: {some} (row {number}: {shown_cell(cell)}); "
                              f"give --field {name}:int (or float) to store numbers and leave those rows out",
                              UserWarning, stacklevel=4)
            self.types[name] = kind

    def release(self) -> None:
        """Let go of the paths once the table is joined (the fields hold what the pack needs)."""
        self.paths, self.path_ends = b"", np.zeros(0, np.int64)

    def path(self, row: int) -> str:
        """The path in row ``row`` (from 0), as the table gives it."""
        start = int(self.path_ends[row - 1]) if row else 0
        return self.paths[start : int(self.path_ends[row])].decode("utf-8", "surrogatepass")

    def path_bytes(self, row: int) -> bytes:
        """The path in row ``row`` (from 0) as UTF-8 bytes, what a sample's path is matched on."""
        start = int(self.path_ends[row - 1]) if row else 0
        return self.paths[start : int(self.path_ends[row])]

    def convert(self) -> tuple[list[SpilledColumn], np.ndarray | None, list[str]]:
        """Pass 2: every column as typed arrays by row, and the class of every row (codes: for a
        string label, indices into the names returned, in the order first seen). A row with a cell
        that does not parse, or a missing value, is noted in ``problems``."""
        self.spill = Spill()
        builders = [ColumnBuilder(name, kind, self.spill) for name, kind in self.types.items()]
        label_codes = array("i")
        names: dict[str, int] = {}
        label = self.label_column
        before = self.sha256
        for number, row in self.reader.rows():
            index = number - 1
            if index >= self.rows:
                raise UsageError(f"{self.shown}: changed while it was being read; pack again once it is written")
            if index in self.problems or isinstance(row, str):
                for builder in builders:
                    builder.blank()
                    builder.row_done()
                label_codes.append(-1)
                continue
            done = 0
            try:
                code = -1
                if label is not None:
                    code = self._label_code(row.get(label), names)
                for builder in builders:
                    try:
                        builder.add(row.get(builder.name))
                    except BadCell as exc:
                        raise BadCell(f"column {builder.name!r} ({builder.kind}): {exc}") from None
                    done += 1
                label_codes.append(code)
            except BadCell as exc:
                self.problems[index] = f"{self.options.name} row {number}: {exc}"  # no folder: a manifest says it
                for builder in builders[done:]:
                    builder.blank()
                for builder in builders[:done]:
                    builder.undo()
                label_codes.append(-1)
            for builder in builders:
                builder.row_done()
        if self.reader.sha256 != before:
            raise UsageError(f"{self.shown}: changed while it was being read; pack again once it is written")
        codes = np.frombuffer(label_codes, np.int32).copy() if label is not None and len(label_codes) else None
        return [builder.column() for builder in builders], codes, sorted(names, key=names.__getitem__)

    def _label_code(self, cell: Any, names: dict[str, int]) -> int:
        label = self.label_column
        if missing(cell, "int") or (isinstance(cell, str) and not cell.strip()):
            raise BadCell(f"column {label!r} (the class): {'is empty' if cell is not None else 'is missing'}")
        if self.label_type == "int":
            try:
                value = to_int(cell)
            except BadCell as exc:
                raise BadCell(f"column {label!r} (the class, int): {exc}") from None
            if not 0 <= value <= MAX_INT_LABEL:
                raise BadCell(f"column {label!r} (the class, int): {value} is not in 0..{MAX_INT_LABEL}; give "
                           f"--field {label}:string to keep it as a class name")
            return value
        try:
            name = to_string(cell)
        except BadCell as exc:
            raise BadCell(f"column {label!r} (the class): {exc}") from None
        return names.setdefault(name, len(names))


def _path_of(cell: Any) -> str:
    """The path a row gives, relative to the source folder (a leading ``./`` dropped)."""
    if not isinstance(cell, str):
        raise BadCell("is missing" if cell is None else f"{shown_cell(cell)} is not text")
    path = cell
    while path.startswith("./"):
        path = path[2:]
    if not path:
        raise BadCell("is empty")
    return path
