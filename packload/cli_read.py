"""The subcommands that read a pack: ``info`` (what it holds), ``verify`` (every record's checksum)
and ``unpack`` (the images written back out as a folder). The reader side is imported only when the
command runs, so ``pack`` never depends on it.
"""

from __future__ import annotations

import argparse
from typing import Any

from packload.cli_report import EXIT_ERROR, EXIT_OK, emit
from packload.core.display import pack_phrase, plural


def add_info(sub: Any) -> None:
    """Register ``packload info``."""
    p = sub.add_parser("info", help="what a pack holds: count, classes, bytes, encoding, skipped files")
    p.add_argument("pack", help="an .lmdb file or shards folder")
    p.add_argument("--json", action="store_true", help="print a machine-readable result")
    p.set_defaults(run=run_info)


def run_info(args: argparse.Namespace) -> int:
    from packload.loaders.verify import info

    result = info(args.pack)
    counts = result["class_counts"]
    lines = [
        f"{result['path']}: {pack_phrase(result['backend'])}, format version {result['format_version']}, "
        f"encoding {result['encoding']}",
        f"  records   {result['records']:,}",
        f"  classes   {len(result['classes']):,}" + ("" if result["labelled"] else " (unlabelled)"),
        f"  bytes     {result['pack_bytes']:,} on disk, {result['payload_bytes'] or 0:,} of images",
    ]
    lines += [f"    {name}: {counts.get(name, 0)}" for name in result["classes"][:20]]
    if len(result["classes"]) > 20:
        lines.append(f"    ... and {plural(len(result['classes']) - 20, 'more class', 'more classes')}")
    lines.append(f"  skipped   {plural(result['skipped_count'], 'broken file')}, {result['ignored_count']:,} left out")
    for word, listed, count in (("skipped", result["skipped"], result["skipped_count"]),
                                ("left out", result["ignored"], result["ignored_count"])):
        lines += [f"  {word} {item['path']}: {item['reason']}" for item in listed[:20]]
        if count > 20:
            lines.append(f"    ... and {count - 20} more {word} (`packload info --json` lists {min(count, len(listed))})")
    lines += _fields_lines(result.get("fields"))
    emit(args, result, lines)
    return EXIT_OK


def _fields_lines(fields: dict[str, Any] | None) -> list[str]:
    """``info``'s lines on a pack's fields: their types, the table, and the rows it left out."""
    if fields is None:
        return []
    label = f", class column {fields['label_column']} ({fields['label_type']})" if fields["label_column"] else ""
    table = fields["table"]
    lines = [f"  fields    {', '.join(f'{n} {t}' for n, t in fields['columns'].items()) or 'none'}",
             f"  table     {table.get('name')}: {plural(table.get('rows', 0), 'row')}, path column "
             f"{fields['path_column']}{label}; {plural(fields['rows_left_out_count'], 'row')} left out"]
    lines += [f"  row {row.get('row')} ({row.get('path')}): {row.get('reason')}" for row in fields["rows_left_out"][:20]]
    if fields["rows_left_out_count"] > 20:
        lines.append(f"    ... and {fields['rows_left_out_count'] - 20} more rows left out (`packload info --json` lists "
                     f"{len(fields['rows_left_out'])})")
    return lines


def add_verify(sub: Any) -> None:
    """Register ``packload verify``."""
    p = sub.add_parser("verify", help="check every record's checksum (and decode each with --decode)")
    p.add_argument("pack", help="an .lmdb file or shards folder")
    p.add_argument("--decode", action="store_true", help="also decode every image completely")
    p.add_argument("--quiet", action="store_true", help="no progress bar; print only problems")
    p.add_argument("--json", action="store_true", help="print a machine-readable report")
    p.set_defaults(run=run_verify)


def run_verify(args: argparse.Namespace) -> int:
    from packload.loaders.verify import verify

    result = verify(args.pack, decode=args.decode, progress=not (args.quiet or args.json))
    lines = [f"{result['path']}: {plural(result['records'], 'record')}, "
             + ("all intact" if result["ok"] else
                f"{plural(len(result['bad_records']), 'damaged record')}, {plural(len(result['bad_files']), 'damaged file')}")]
    lines += [f"  {bad['file']}: {bad['problem']}" for bad in result["bad_files"]]
    lines += [f"  record {bad['record']} ({bad['path']}, {bad['part']}): {bad['problem']}"
              for bad in result["bad_records"]]
    emit(args, result, lines)
    return EXIT_OK if result["ok"] else EXIT_ERROR


def add_unpack(sub: Any) -> None:
    """Register ``packload unpack``."""
    p = sub.add_parser("unpack", help="write the images back out as a folder")
    p.add_argument("pack", help="an .lmdb file or shards folder")
    p.add_argument("out", help="folder to write (must be new or empty; never a symbolic link)")
    p.add_argument("--overwrite", action="store_true",
                   help="write into a non-empty folder, replacing same-named files (never into the pack)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.add_argument("--json", action="store_true", help="print a machine-readable summary")
    p.set_defaults(run=run_unpack)


def run_unpack(args: argparse.Namespace) -> int:
    from packload.loaders.unpack import unpack

    result = unpack(args.pack, args.out, overwrite=args.overwrite, progress=not (args.quiet or args.json))
    lines = [f"unpacked {plural(result['files'], 'file')} ({result['bytes'] / 1e6:.1f} MB) into {result['out']}"
             + (f", and the table as {result['table']}" if result.get("table") else "")]
    if result["renamed"]:
        first = result["renamed"][0]
        lines.append(f"{plural(len(result['renamed']), 'file')} kept their whole name plus the new suffix, as their new "
                     f"name was taken (e.g. {first['path']} -> {first['written_as']}); --json lists them")
    emit(args, result, lines)
    return EXIT_OK
