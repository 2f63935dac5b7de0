"""A table of labels and fields beside a folder of images: ``pack ./images DEST --labels labels.csv``.

The table (CSV, TSV, JSON lines, or Parquet where pyarrow is installed) has one row per image: a
``path`` column (``--path-column``) relative to the source folder, and any other columns. A
``label`` column (``--label-column``) is the class: strings become indices into the sorted class
names (as ImageFolder's folder names do), integers (0 or more) are kept, the classes then being
``"0"`` to the largest. Every other column becomes a typed field of the pack (``core.fields``):
int, float, bool, string, list[int] or list[float], inferred from every row or given
(``--field age:int``).

The table is read twice, row by row, whatever its size: the first pass takes the paths (into one
bytes blob and a hash each, no object per row) and infers each column's type, the second converts
every cell into typed arrays. Nothing is guessed or dropped without a word: an image with no row is
left out (listed in ``ignored``), an image with a row that cannot be used (a cell that does not parse
as its column's type, a missing value, its path in two rows) is skipped (listed in ``skipped``, with
the row and the cell), and a row with no image, a duplicate path or a malformed row is listed in the
manifest's ``fields.rows_left_out``; ``strict`` makes the first of any of them an error.

This module is the scan that feeds the packer, and the names ``pack`` and the command line import;
the work is done by ``table_options`` (what to read), ``table_read`` (rows from CSV, TSV, JSON lines
or Parquet), ``table_types`` (inferring and converting cell types), ``table_columns`` (the typed
columns in bounded memory), ``table`` (the two passes), ``table_match`` (rows matched with images,
what is left out) and ``table_fields`` (what the pack is handed: the fields part, the skipped list).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packload.core.manifest import Manifest
from packload.core.remote import RemoteStore, is_url
from packload.core.scan import ScanResult, TopListing, list_class, list_top, merge_listings, scan_folder
from packload.packer.remote_source import NO_IMAGES_HINT, list_class_keys, scan_url, source_name, url_errors
from packload.packer.table import Table
from packload.packer.table_fields import TableFields, TableScan
from packload.packer.table_match import join
from packload.packer.table_options import TableOptions, table_options

__all__ = ["fields_summary", "ray_scan", "scan_for", "scan_source", "table_of",
           "table_or_none"]


def scan_for(src: str | os.PathLike[str], table: Table, storage_options: dict[str, Any] | None = None) -> ScanResult:
    """The scan a table is joined with: with a class column, every image anywhere below ``src``
    (the class comes from the table); without, ``scan_folder``'s (classes from folders, if any).
    ``src`` may be a URL (``scan_url``'s rules)."""
    if is_url(src):
        url = str(src).rstrip("/")
        if table.label_column is None:
            return scan_url(url, storage_options)
        store = RemoteStore(url, storage_options)
        store.check_bucket()
        keys = sorted(store.listing_all())
        with url_errors(url):
            return merge_listings(TopListing(Path(source_name(url)), [], [], []), [list_class_keys(keys)],
                                  NO_IMAGES_HINT)
    if table.label_column is None:
        return scan_folder(src)
    top = list_top(src)
    return merge_listings(top._replace(classes=[], outside=[]), [list_class(top.root, "")])


def table_or_none(labels: str | os.PathLike[str] | TableOptions | None,
                  storage_options: dict[str, Any] | None = None) -> Table | None:
    """The table ``labels`` names, its paths read and its types decided; None without one."""
    return None if labels is None else Table(table_options(labels), storage_options)


def ray_scan(in_tasks: Callable[[], tuple[ScanResult, dict[str, Any]]], src: str | os.PathLike[str],
             table: Table | None, strict: bool, storage_options: dict[str, Any] | None = None
             ) -> tuple[ScanResult, dict[str, Any]]:
    """The Ray engine's scan, with where it ran: ``in_tasks()`` (classes listed in Ray tasks), or, for
    a table with a class column, every image below ``src`` listed by the driver; joined with the
    table when there is one."""
    if table is None or table.label_column is None:
        scan, where = in_tasks()
    else:
        started = time.perf_counter()
        scan = scan_for(src, table, storage_options)
        where = {"scan_tasks": 0, "scan_tasks_per_node": {}, "scan_s": round(time.perf_counter() - started, 3)}
    return (scan if table is None else join(scan, table, strict)), where


def scan_source(src: str | os.PathLike[str], labels: str | os.PathLike[str] | TableOptions | None, strict: bool,
                storage_options: dict[str, Any] | None = None) -> ScanResult:
    """What ``pack`` packs from ``src``: ``scan_folder``'s images, or with a table (``labels``), the
    images it gives a usable row (``TableScan``)."""
    if labels is None:
        return scan_folder(src)
    table = Table(table_options(labels), storage_options)
    return join(scan_for(src, table, storage_options), table, strict)


def table_of(scan: ScanResult) -> TableFields | None:
    """The table a scan was joined with (None for a plain scan)."""
    return scan.table if isinstance(scan, TableScan) else None


def fields_summary(manifest: Manifest) -> dict[str, Any]:
    """What ``pack``'s summary says of a pack's fields: their names and types, and the table rows
    left out (None for a pack without a table)."""
    fields = manifest.fields
    if not fields:
        return {"fields": None, "rows_left_out": None}
    return {"fields": {c["name"]: c["type"] for c in fields["columns"]}, "rows_left_out": fields["rows_left_out_count"]}
