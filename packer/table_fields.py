"""What a table adds to a scan once joined with its images (``TableFields``): each packed sample's
row, the typed columns, the images skipped for their row and the rows left out; and from them the
manifest's ``skipped`` list and the pack's fields part, written one column at a time."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packload.core.fields import fields_pieces, part_name
from packload.core.manifest import SKIPPED_LISTED
from packload.core.scan import ScanResult
from packload.packer.table_columns import SpilledColumn
from packload.packer.table_options import TableOptions


# -- joining the table with the images -------------------------------------------------------------
@dataclass
class TableFields:
    """What a table adds to a scan: each sample's row, the fields by row, and what was left out.

    ``skips`` are the images skipped for their row: ``(insert, path, reason)``, ``insert`` being the
    number of packed samples before them in scan order (so they interleave with the files skipped
    while packing)."""

    options: TableOptions
    sha256: str
    rows: int
    row_of: np.ndarray
    columns: list[SpilledColumn]
    label_column: str | None
    label_type: str | None
    skips: list[tuple[int, str, str]]
    rows_left_out: list[dict[str, Any]]
    rows_left_out_count: int

    def options_record(self) -> dict[str, Any]:
        """The table's entry in the pack's ``options`` (compared by ``--resume``)."""
        return {**self.options.record(), "label_column": self.label_column, "sha256": self.sha256}

    def with_skips(self, skipped: list[dict[str, Any]], files: int) -> tuple[list[dict[str, Any]], int]:
        """The manifest's ``skipped`` (the files skipped while packing, ``pos`` in scan order, and the
        images skipped for their row, in one scan order) and the count of image files found."""
        if not self.skips:
            return skipped, files
        merged = [((s["pos"], 1), s) for s in skipped]
        merged += [((at, 0), {"path": path, "reason": reason}) for at, path, reason in self.skips]
        merged.sort(key=lambda pair: pair[0])
        return [item for _, item in merged], files + len(self.skips)

    def part(self, skipped: list[dict[str, Any]], packed: int, backend: str,
             write: Callable[[Any], Any]) -> dict[str, Any]:
        """Hand ``write`` the fields part of the records written (every sample but the ``skipped``
        ones, ``pos`` in scan order, of ``packed`` samples), piece by piece, and return the manifest's
        ``fields`` entry for it. One column is in memory at a time, and only while it is written."""
        keep = np.ones(packed, bool)
        keep[[s["pos"] for s in skipped if "pos" in s]] = False
        rows = self.row_of[keep]
        columns, self.columns = self.columns, []
        spills = {id(c.spill): c.spill for c in columns if isinstance(c, SpilledColumn)}
        digest, size = hashlib.sha256(), 0
        try:
            for piece in fields_pieces(columns, rows, release=True):  # type: ignore[arg-type]
                digest.update(piece)
                size += len(piece)
                write(piece)
        finally:
            for spill in spills.values():
                spill.close()
        return {
            "name": part_name(backend), "size": size, "sha256": digest.hexdigest(),
            "columns": [{"name": c["name"], "type": c["type"]} for c in self.listed],
            "table": {"name": self.options.name, "rows": self.rows, "sha256": self.sha256},
            "path_column": self.options.path_column, "label_column": self.label_column,
            "label_type": self.label_type,
            "rows_left_out": self.rows_left_out[:SKIPPED_LISTED], "rows_left_out_count": self.rows_left_out_count,
        }

    listed: list[dict[str, str]] = field(default_factory=list)


class TableScan(ScanResult):
    """A scan of the images a table names: the samples that have a usable row (labelled by the
    table's class column when it has one), and the table's fields (``table``)."""

    table: TableFields

    def check_layout(self, strict: bool) -> None:
        """A table names its own layout: only classes taken from folders are looked at (splits)."""
        if self.table.label_column is None:
            self.check_splits(strict)
