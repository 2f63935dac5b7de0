"""Joining a table with the images a scan found: each image matched with its row (on hashes of the
paths, every match confirmed on the bytes), the class of each packed image taken from the table,
and every image or row left out listed with the reason (``--strict``: the first is an error)."""

from __future__ import annotations

from typing import Any

import numpy as np

from packload.core.errors import SkippedFileError, UsageError
from packload.core.manifest import SKIPPED_LISTED
from packload.core.samples import SampleList
from packload.core.scan import ScanResult, printable
from packload.packer.table import Table
from packload.packer.table_fields import TableFields, TableScan

_MATCH_RUN = 65536  # samples matched with the table's rows at a time


def join(scan: ScanResult, table: Table, strict: bool) -> TableScan:
    """``scan`` narrowed to the images with a usable row of ``table`` (pass 2 runs here), with the
    table's classes when it has a class column. ``strict``: the first problem is an error."""
    samples = scan.samples if isinstance(scan.samples, SampleList) else SampleList.of(scan.samples)
    table.read_paths()
    row_of, duplicates = match_rows(samples, table)
    columns, codes, names = table.convert()
    problems, shown, name = table.problems, table.shown, table.options.name
    bad = np.zeros(table.rows, bool)  # rows that cannot be used
    bad[list(problems)] = True
    bad[list(duplicates)] = True
    has_row = row_of >= 0
    keep = has_row.copy()
    keep[has_row] = ~bad[row_of[has_row]]
    skips: list[tuple[int, str, str]] = []
    kept_before = np.cumsum(keep, dtype=np.int32 if len(keep) < 1 << 31 else np.int64)  # packed up to each
    for pos in np.flatnonzero(has_row & ~keep).tolist():
        row = int(row_of[pos])
        reason = (f"{name}: rows {', '.join(str(r + 1) for r in duplicates[row][:5])} all give this path; keep one"
                  if row in duplicates else problems[row])
        skips.append((int(kept_before[pos]), samples.path(pos), reason))  # kept_before: not itself kept
    del kept_before
    no_row = [{"path": samples.path(pos), "reason": f"image with no row in {table.options.name}"}
              for pos in np.flatnonzero(~has_row).tolist()]
    used = np.zeros(table.rows, bool)
    used[row_of[has_row]] = True
    left_rows = np.flatnonzero(bad | ~used)
    reasons = {item["path"]: item["reason"] for item in scan.ignored} if len(left_rows) else {}
    left_out: list[dict[str, Any]] = []
    for row in left_rows[:SKIPPED_LISTED].tolist():
        path = table.path(row)
        if row in duplicates:
            reason = f"its path is in row {', '.join(str(r + 1) for r in duplicates[row] if r != row)} too"
        elif row in problems:
            reason = problems[row].removeprefix(f"{name} row {row + 1}: ")
        else:
            why = reasons.get(path)
            reason = "no image at this path in the source" + (f" (left out: {why})" if why else "")
        left_out.append({"row": row + 1, "path": printable(path), "reason": reason})
    if strict:
        _refuse(table, left_out, skips, no_row)
    positions = np.flatnonzero(keep)
    rows = row_of[positions]
    classes, labels = list(scan.classes), None
    if table.label_column is not None and codes is not None:
        classes, labels = _classes(table, codes, rows, names)
    if not len(positions):
        first = (left_out[:1] or [{"row": "-", "path": "", "reason": "no rows"}])[0]
        raise UsageError(f"{scan.root}: no image has a usable row in {shown} (first problem: row {first['row']}, "
                         f"{first['path']}: {first['reason']})")
    result = TableScan(root=scan.root, classes=classes, samples=samples.take(positions, labels),
                       ignored=sorted(scan.ignored + no_row, key=lambda item: item["path"]))
    result.table = TableFields(table.options, table.sha256, table.rows, rows.astype(np.int32 if table.rows < 1 << 31 else np.int64), columns,
                               table.label_column, table.label_type, skips, left_out, len(left_rows),
                               listed=[{"name": c.name, "type": c.type} for c in columns])
    table.release()
    return result


def match_rows(samples: SampleList, table: Table) -> tuple[np.ndarray, dict[int, list[int]]]:
    """Each sample's row in ``table`` (-1: none), and the rows whose path is in other rows too
    (row → every row of that path). Joined on 64-bit hashes of the paths, every match confirmed
    on the bytes: no dictionary of a million strings."""
    hashes = _row_hashes(table)
    usable = np.flatnonzero(hashes != 0)
    order = usable[np.argsort(hashes[usable], kind="stable")]
    sorted_hashes = hashes[order]
    del hashes, usable
    duplicates: dict[int, list[int]] = {}
    same = np.flatnonzero(sorted_hashes[1:] == sorted_hashes[:-1])
    for k in same.tolist():  # rows with one hash: group those whose paths are equal
        a, b = int(order[k]), int(order[k + 1])
        if table.path_bytes(a) == table.path_bytes(b):
            group = duplicates.setdefault(a, [a])
            if b not in group:
                group.append(b)
            duplicates[b] = group
    for group in {id(g): g for g in duplicates.values()}.values():
        group.sort()
    row_of = np.full(len(samples), -1, np.int64)
    blob, ends = samples.blob, samples.ends
    for first in range(0, len(samples), _MATCH_RUN):  # a run of samples at a time: no list of them all
        last = min(first + _MATCH_RUN, len(samples))
        bounds = ends[max(first - 1, 0) : last].tolist()
        if not first:
            bounds.insert(0, 0)
        paths = [blob[bounds[k] : bounds[k + 1]] for k in range(last - first)]
        hashes = np.fromiter(map(hash, paths), np.int64, len(paths))
        at = np.minimum(np.searchsorted(sorted_hashes, hashes), max(len(sorted_hashes) - 1, 0))
        hit = sorted_hashes[at] == hashes if len(sorted_hashes) else np.zeros(len(paths), bool)
        for k in np.flatnonzero(hit).tolist():
            j = int(at[k])
            while j < len(sorted_hashes) and sorted_hashes[j] == hashes[k]:
                if table.path_bytes(int(order[j])) == paths[k]:
                    row_of[first + k] = int(order[j])
                    break
                j += 1
    return row_of, duplicates


def _row_hashes(table: Table) -> np.ndarray:
    """A 64-bit hash of each row's path (0 for a row without one), a run of rows at a time."""
    out = np.zeros(table.rows, np.int64)
    blob, ends = table.paths, table.path_ends
    for first in range(0, table.rows, _MATCH_RUN):
        last = min(first + _MATCH_RUN, table.rows)
        bounds = ends[max(first - 1, 0) : last].tolist()
        if not first:
            bounds.insert(0, 0)
        out[first:last] = np.fromiter((hash(blob[bounds[k] : bounds[k + 1]]) if bounds[k + 1] > bounds[k] else 0
                                       for k in range(last - first)), np.int64, last - first)
    return out


def _classes(table: Table, codes: np.ndarray, rows: np.ndarray, names: list[str]) -> tuple[list[str], np.ndarray]:
    """The class names and each packed sample's class index, from the rows' class cells: integers
    kept (classes ``"0"`` to the largest), names mapped to their place among the sorted names that
    the packed rows give (as ImageFolder sorts its folders)."""
    used = codes[rows]
    if table.label_type == "int":
        top = int(used.max()) if len(used) else -1
        return [str(i) for i in range(top + 1)], used.astype(np.int32)
    present = np.unique(used)
    ordered = sorted(present.tolist(), key=lambda code: names[code])
    remap = np.full(len(names), -1, np.int32)
    remap[ordered] = np.arange(len(ordered), dtype=np.int32)
    return [names[code] for code in ordered], remap[used]


def _refuse(table: Table, left_out: list[dict[str, Any]], skips: list[tuple[int, str, str]],
            no_row: list[dict[str, str]]) -> None:
    """Under ``--strict``: the first row or image the table leaves out is an error."""
    if left_out:
        first = left_out[0]
        raise SkippedFileError(f"{table.shown} row {first['row']} ({first['path']}): {first['reason']}; fix the "
                               "table, or pack without --strict to leave such rows out and list them in the manifest")
    if skips:
        raise SkippedFileError(f"{skips[0][1]}: {skips[0][2]}; fix the table, or pack without --strict to skip the "
                               "image and list it in the manifest")
    if no_row:
        raise SkippedFileError(f"{no_row[0]['path']}: {no_row[0]['reason']}; add a row for it, or pack without "
                               "--strict to leave such images out and list them in the manifest")
