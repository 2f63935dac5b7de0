"""The ``packload`` command line (and ``pack``, its short form for ``packload pack``).

Each subcommand registers itself on the parser and runs through ``main(argv)``, which tests
call directly. Reading-side subcommands import ``loaders`` only when they run, so ``pack``
starts fast and the writer side never depends on the reader side. Bad input ends in one line
on stderr and a non-zero exit, never a traceback.

Class names, record paths and skipped file names come from data packload did not write, so every
line printed goes through ``display.terminal_safe`` (an ESC sequence among them would drive the
user's terminal, a newline would forge a line), and ``--json`` output escapes the controls that
``json.dumps`` leaves raw.

A reader that closes stdout early (``packload info x | head -4``) ends the command quietly, as Unix
tools end: nothing on stderr and exit status 141 (128 + SIGPIPE, what a shell reports for a tool that
SIGPIPE stopped). Warnings go to stderr as they happen, and with ``--json`` into its ``warnings`` too.
"""

from __future__ import annotations

import argparse
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from packload.cli_parser import (
    OutputClosedError,
    Parser,
    check_output_file,
    in_flag_names,
    library_logs_quiet,
    pipe_closed,
    print_error,
    print_warning,
    silence,
    subcommand_parser,
    subcommand_parsers,
    write_stdout,
)
from packload.core.display import json_text, pack_phrase, plural, safe_lines
from packload.core.errors import PackloadError, UsageError
from packload.core.remote import is_url
from packload.core.urls import display_url
from packload.core.version import __version__

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_PIPE = 141  # stdout's reader went away: 128 + SIGPIPE, as a shell reports a Unix tool stopped by it
JSON_SCHEMA_VERSION = 1  # of the shape every --json output shares (docs/CLI.md)
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(text: str) -> int:
    """``256M``, ``1G``, ``65536`` → bytes."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)i?B?\s*", text, re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; write for example 256M or 1G")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).upper()]


def parse_hw(text: str) -> tuple[int, int]:
    """``32x32`` → (height, width)."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not match or min(int(match.group(1)), int(match.group(2))) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; write HEIGHTxWIDTH, for example 32x32")
    return int(match.group(1)), int(match.group(2))


def json_document(command: str, result: dict[str, Any], warnings_: Sequence[str] = ()) -> dict[str, Any]:
    """The shape of every ``--json`` output (docs/CLI.md): ``schema_version`` and ``command`` first,
    then the command's own keys, then ``warnings`` (each warning the command gave, as on stderr).
    ``schema_version`` rises when a key changes meaning or goes away."""
    return {"schema_version": JSON_SCHEMA_VERSION, "command": command,
            **{k: v for k, v in result.items() if k not in ("schema_version", "warnings")},
            "warnings": [*result.get("warnings", []), *warnings_]}


def _print_report(args: argparse.Namespace, result: Any, lines: Sequence[object]) -> None:
    command = getattr(args, "command", None) or "pack"
    write_stdout(json_text(json_document(command, result, getattr(args, "warned", ())))
                 if args.json else safe_lines(lines))


def _in_flags(args: argparse.Namespace, text: str) -> str:
    """``text`` (a verdict, a fix) with the library's parameter names written as this command's flags."""
    words = getattr(args, "cli_words", None)
    return words(text) if words is not None else text


def _emit(args: argparse.Namespace, result: dict[str, Any], lines: list[str]) -> None:
    if args.json or not getattr(args, "quiet", False) or not result.get("ok", True):
        _print_report(args, result, lines)


# -- pack ------------------------------------------------------------------------------------
def _add_pack(sub: Any) -> None:
    p = sub.add_parser("pack", help="pack an image folder into an .lmdb file or a shards folder",
                       description="Pack an ImageFolder tree (one sub-folder per class) into one LMDB file "
                                   "(DEST ending in .lmdb) or a folder of memory-mapped shards.")
    add_pack_arguments(p)
    p.set_defaults(run=run_pack)


def add_pack_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``pack`` (shared by ``packload pack`` and the ``pack`` command)."""
    p.add_argument("src", help="folder of images, one sub-folder per class; or, with --engine ray, a URL "
                               "(s3://bucket/images/)")
    p.add_argument("dst", help="DEST.lmdb for one LMDB file, any other name for a shards folder; or a URL "
                                "(s3://bucket/train.shards: shards uploaded as they are written)")
    p.add_argument("--format", choices=("lmdb", "shards"), help="override the backend the suffix picks")
    p.add_argument("--encoding", choices=("keep", "jpeg", "png", "raw"), default="keep",
                   help="keep: original bytes (default); jpeg/png: re-encode; raw: decoded pixels")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality for --encoding jpeg (default 90)")
    p.add_argument("--max-side", type=int, help="shrink images so the longer side is at most N (jpeg/png/raw)")
    p.add_argument("--size", type=parse_hw, help="resize every image to HxW (raw)")
    p.add_argument("--check", choices=("fast", "full"), default="fast",
                   help="fast: header and end marker (default); full: decode every image")
    p.add_argument("--workers", type=int, help="processes that read and encode (default: every CPU)")
    p.add_argument("--shard-size", type=parse_bytes, default="256M", help="target shard size (default 256M)")
    p.add_argument("--max-pixels", type=int, help="raise PIL's decompression-bomb limit on purpose")
    p.add_argument("--overwrite", action="store_true", help="replace DEST (and any unfinished pack of it)")
    p.add_argument("--resume", action="store_true", help="finish an interrupted pack of DEST")
    p.add_argument("--strict", action="store_true", help="stop at the first file that cannot be packed")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: worker processes on this machine (default); ray: Ray tasks, on a cluster with "
                        "--ray-address (source and destination on storage every node sees, or URLs)")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="Ray cluster to use with --engine ray ('auto': the running one; default: start a local one)")
    p.add_argument("--task-files", type=int, metavar="N",
                   help="files per Ray task with --engine ray (default: about two tasks per CPU of the cluster)")
    p.add_argument("--labels", metavar="TABLE", help="a table of one row per image (.csv, .tsv, .jsonl, .parquet): its "
                   "path column, its label column (the class) and other columns, packed as fields (docs/FIELDS.md)")
    p.add_argument("--path-column", metavar="NAME", help="the table's column of image paths, relative to SRC "
                   "(default: path)")
    p.add_argument("--label-column", metavar="NAME", help="the table's class column (default: label, if it has one)")
    p.add_argument("--field", action="append", metavar="NAME:TYPE", help="give a column's type instead of inferring "
                   "it: int, float, bool, string, list[int] or list[float] (repeat for more columns)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.add_argument("--json", action="store_true", help="print a machine-readable summary")


def _pack_with_ray(args: argparse.Namespace, options: Any) -> dict[str, Any]:
    from packload.packer.ray_engine import pack_ray

    if args.workers is not None:
        raise UsageError("--workers does not apply to --engine ray (Ray runs one task per CPU); drop it, "
                         "or pack with --engine local")
    return pack_ray(args.src, args.dst, backend=args.format, options=options, shard_size=args.shard_size,
                    overwrite=args.overwrite, resume=args.resume, strict=args.strict,
                    progress=not (args.quiet or args.json),
                    address=args.ray_address, task_files=args.task_files, labels=_table_options(args))


def _table_options(args: argparse.Namespace) -> Any:
    """``--labels`` and the options that go with it, as ``TableOptions`` (None without a table)."""
    from packload.packer.table_source import TableOptions, parse_field_spec

    if args.labels is None:
        given = [flag for flag, value in (("--path-column", args.path_column), ("--label-column", args.label_column),
                                          ("--field", args.field)) if value]
        if given:
            raise UsageError(f"{given[0]} describes a table of labels; give it with --labels labels.csv")
        return None
    try:
        types = dict(parse_field_spec(spec) for spec in args.field or [])
        return TableOptions(args.labels, path_column=args.path_column or "path", label_column=args.label_column,
                            types=types)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def pack_summary(result: dict[str, Any]) -> str:
    """The one-line summary of ``pack``: a resumed pack's rate is this run's, its size the whole pack's."""
    rate = (f"in {result['seconds']:.1f} s: {result['files_per_s']:.0f} files/s, {result['mb_per_s']:.0f} MB/s"
            if result["seconds"] > 0 else "")
    size = f"{result['pack_bytes'] / 1e6:.1f} MB from {result['source_bytes'] / 1e6:.1f} MB"
    where = f"into {result['destination']} [{result['backend']}, {result['encoding']}]"
    if result.get("resumed_at") is not None:
        ray = result.get("ray") or {}
        kept = f" ({ray['tasks_kept']} of {ray['tasks']} Ray tasks were done)" if ray.get("tasks_kept") else ""
        return (f"resumed at file {result['resumed_at']}{kept}: packed {plural(result['files_this_run'], 'more file')} "
                f"{rate}; the pack holds {plural(result['records'], 'image')} ({_classes(result['classes'])}) of "
                f"{plural(result['files_total'], 'file')} {where}, {size}")
    return f"packed {plural(result['records'], 'image')} ({_classes(result['classes'])}) {where} {rate}; {size}"


def _classes(count: int) -> str:
    """``3 classes``; ``unlabelled`` for a pack without class folders (labels -1)."""
    return plural(count, "class") if count else "unlabelled: no class folders"


def run_pack(args: argparse.Namespace) -> int:
    from packload.packer.encode import EncodeOptions
    from packload.packer.pipeline import pack

    try:
        options = EncodeOptions(encoding=args.encoding, check=args.check, quality=args.quality,
                                max_side=args.max_side, size=args.size, max_pixels=args.max_pixels)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.engine == "ray":
        result = _pack_with_ray(args, options)
    else:
        if args.ray_address or args.task_files is not None:
            raise UsageError("--ray-address and --task-files apply to --engine ray; add --engine ray")
        if is_url(args.src):
            raise UsageError(f"{args.src}: a source at a URL is packed with --engine ray (its tasks fetch the "
                             "objects); add --engine ray, or copy the images to a local folder first")
        result = pack(args.src, args.dst, backend=args.format, options=options, workers=args.workers,
                      shard_size=args.shard_size, overwrite=args.overwrite, resume=args.resume,
                      strict=args.strict, progress=not (args.quiet or args.json), labels=_table_options(args))
    lines = [pack_summary(result)]
    if result.get("fields") is not None:
        shown = ", ".join(f"{name} ({kind})" for name, kind in result["fields"].items()) or "none"
        lines.append(f"fields: {shown}; {plural(result['rows_left_out'], 'table row')} left out"
                     + (f" (`packload info {result['destination']}` lists them)" if result["rows_left_out"] else ""))
    if result["skipped"] or result["ignored"]:
        lines.append(f"skipped {plural(result['skipped'], 'broken file')}, left out {plural(result['ignored'], 'other file')}; "
                     f"`packload info {result['destination']}` lists them")
    _emit(args, result, lines)
    return EXIT_OK


# -- info / verify / unpack ------------------------------------------------------------------
def _add_info(sub: Any) -> None:
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
    _emit(args, result, lines)
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


def _add_verify(sub: Any) -> None:
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
    _emit(args, result, lines)
    return EXIT_OK if result["ok"] else EXIT_ERROR


def _add_unpack(sub: Any) -> None:
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
    _emit(args, result, lines)
    return EXIT_OK


# -- merge -----------------------------------------------------------------------------------
def _add_merge(sub: Any) -> None:
    p = sub.add_parser("merge", help="join packs made separately into one (classes united, no re-encoding)",
                       description="Join packs into OUT, records in the order given. Classes become the sorted "
                                   "union (labels remapped); shards are reused, LMDB records copied.")
    p.add_argument("out", help="OUT.lmdb for one LMDB file, any other name for a shards folder")
    p.add_argument("packs", nargs="+", help="the packs to join (.lmdb files or shards folders), in order")
    p.add_argument("--format", choices=("lmdb", "shards"), help="override the backend OUT's suffix picks")
    p.add_argument("--overwrite", action="store_true", help="replace OUT")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.add_argument("--json", action="store_true", help="print a machine-readable summary")
    p.set_defaults(run=run_merge)


def run_merge(args: argparse.Namespace) -> int:
    from packload.merger import merge

    result = merge(args.out, args.packs, backend=args.format, overwrite=args.overwrite,
                   progress=not (args.quiet or args.json))
    lines = [f"merged {plural(len(result['inputs']), 'pack')} into {result['destination']} [{result['backend']}, "
             f"{result['encoding']}]: {plural(result['records'], 'record')}, {plural(result['classes'], 'class')}"
             + (f", labels remapped in {result['remapped']}" if result["remapped"] else "")
             + f", {result['pack_bytes'] / 1e6:.1f} MB in {result['seconds']:.1f} s"]
    _emit(args, result, lines)
    return EXIT_OK


# -- demo ------------------------------------------------------------------------------------
def _add_demo(sub: Any) -> None:
    p = sub.add_parser("demo", help="generate a demo dataset, pack it, load it, and report the speed-up")
    p.add_argument("--dir", default="demo-data", help="working folder, about 200 MB (default ./demo-data)")
    p.add_argument("--count", type=int, default=2000, help="images to generate (default 2000)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="print a machine-readable report")
    p.set_defaults(run=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    from packload.demo import run_demo as demo

    result = demo(args.dir, count=args.count, progress=not (args.quiet or args.json))
    args.quiet = False  # --quiet hides the progress bars; the report is the point of the demo
    # its tune part speaks of `packload tune`'s flags (--budget, not budget_s), as that command's report does
    [tune] = [sub for sub in subcommand_parsers(build_parser()) if sub.prog.endswith(" tune")]
    result["report"] = [in_flag_names(line, tune) for line in result["report"]]
    result["tune"]["message"] = in_flag_names(result["tune"]["message"], tune)
    _emit(args, result, result["report"])
    return EXIT_OK


# -- tune ------------------------------------------------------------------------------------
def _add_tune(sub: Any) -> None:
    p = sub.add_parser("tune", help="find the fastest DataLoader settings against an emulated or real GPU step",
                       description="Benchmark num_workers, prefetch_factor and pin_memory for a pack or an image "
                                   "folder against a GPU step, pick the cheapest fast setting, and say whether "
                                   "training is input-bound.")
    p.add_argument("path", help="a pack (.lmdb file or shards folder) or an image folder")
    p.add_argument("--batch-size", type=int, default=256, help="your training batch size (default 256)")
    step = p.add_mutually_exclusive_group()
    step.add_argument("--step-ms", type=float, help="GPU time of one training step to emulate, in ms (default: 100, "
                      "said in the verdict; packload.watch(loader) measures yours)")
    step.add_argument("--model", choices=("small-cnn",), help="run a small CNN forward+backward on the GPU")
    loop = p.add_mutually_exclusive_group()
    loop.add_argument("--sync", dest="sync", action="store_true", default=True,
                      help="your loop waits for every step, e.g. loss.item() each step (the default, as for "
                           "doctor: a pick for it holds for a loop that does not wait as well)")
    loop.add_argument("--async", dest="sync", action="store_false",
                      help="your loop never waits for the step before loading the next batch")
    p.add_argument("--transform", metavar="MODULE:CALLABLE",
                   help="time your own transform (e.g. mytraining.data:train_transform) instead of the built-in "
                        "resize and centre crop; it must give equal-sized images")
    p.add_argument("--budget", type=float, default=60.0, help="seconds to spend searching (default 60)")
    p.add_argument("--max-workers", type=int, help="largest num_workers to try (default: the usable cores, and past "
                   "them, up to 64, while the workers wait on storage rather than compute)")
    p.add_argument("--save", metavar="FILE", help="write the winning DataLoader settings as JSON")
    p.add_argument("--plot", metavar="FILE", help="draw throughput against num_workers (needs matplotlib)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print a machine-readable result")
    p.set_defaults(run=run_tune)


def run_tune(args: argparse.Namespace) -> int:
    from packload.diagnose.tune import format_report
    from packload.diagnose.tune_inputs import tune_path
    from packload.diagnose.tune_plot import require_matplotlib

    check_output_file("--save", args.save)
    check_output_file("--plot", args.plot)  # the file first: a wrong path is said with or without matplotlib
    if args.plot:
        require_matplotlib()  # before the search, not after a minute of it
    result = tune_path(args.path, batch_size=args.batch_size, step_ms=args.step_ms, model=args.model,
                       budget_s=args.budget, max_workers=args.max_workers, progress=not (args.quiet or args.json),
                       sync=args.sync, transform=args.transform)
    if args.save:
        result.save(args.save)
    if args.plot:
        result.plot(args.plot)
    result.message = _in_flags(args, result.message)  # the verdict in the words the user typed
    _print_report(args, result.as_dict(), [] if args.json else format_report(result))
    return EXIT_OK


# -- doctor ----------------------------------------------------------------------------------
def _add_doctor(sub: Any) -> None:
    p = sub.add_parser("doctor", help="is slow training really the GPU's fault? check the machine and a dataset",
                       description="Check this machine (GPU, CPUs, memory, /dev/shm, storage) and, given an "
                                   "image folder or a pack, measure where the input pipeline stalls.")
    p.add_argument("path", nargs="?", help="an image folder or a pack (.lmdb file or shards folder) to analyse")
    p.add_argument("--batch-size", type=int, default=64, help="samples per batch (default 64)")
    p.add_argument("--step-ms", type=float, help="GPU time of one training step in ms (default: 100, said in the "
                   "verdict)")
    p.add_argument("--model", choices=("small-cnn",), help="run a real small CNN step instead of --step-ms (CUDA)")
    p.add_argument("--workers", type=int, help="DataLoader workers (default: the usable CPUs)")
    p.add_argument("--max-batches", type=int, default=20, help="timed batches per loader pass (default 20)")
    p.add_argument("--repeats", type=int, default=2, help="passes per loader figure, the best counts (default 2)")
    p.add_argument("--crop", type=int, default=224, help="resize + centre-crop size of the loader (default 224)")
    p.add_argument("--no-measure", action="store_true", help="machine and dataset checks only, no timing")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--json", action="store_true", help="print the report as JSON (packload.diagnose.doctor.REPORT_SCHEMA)")
    p.set_defaults(run=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    from packload.diagnose.doctor import doctor, format_report

    report = doctor(args.path, batch_size=args.batch_size, step_ms=args.step_ms, model=args.model,
                    workers=args.workers, max_batches=args.max_batches, repeats=args.repeats, crop=args.crop,
                    measure=not args.no_measure, progress=not (args.quiet or args.json))
    report["verdict"] = _in_flags(args, report["verdict"])  # in the words the user typed
    for item in report["checks"]:
        item["message"] = _in_flags(args, item["message"])
        item["fix"] = item["fix"] and _in_flags(args, item["fix"])
    _print_report(args, report, [] if args.json else format_report(report))
    return EXIT_OK  # a diagnosis: exit 0 whatever it finds


COMMANDS: tuple[Callable[[Any], None], ...] = (_add_pack, _add_merge, _add_info, _add_verify, _add_unpack,
                                               _add_tune, _add_doctor, _add_demo)


def build_parser() -> Parser:
    parser = Parser(prog="packload", description="Pack image folders and load them fast in PyTorch.")
    parser.add_argument("--version", action="version", version=f"packload {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in COMMANDS:
        register(sub)
    return parser


def _run(parser: Parser, argv: Sequence[str] | None) -> int:
    try:
        return _run_command(parser, argv)
    except OutputClosedError:  # the reader of stdout went away: end quietly, as Unix tools do
        silence(sys.stdout, *([sys.stderr] if pipe_closed(sys.stderr) else []))
        return EXIT_PIPE


def _run_command(parser: Parser, argv: Sequence[str] | None) -> int:
    parser.argv = list(sys.argv[1:] if argv is None else argv)
    for sub in subcommand_parsers(parser):  # each subcommand's parser sees the words too, for its errors
        sub.argv = parser.argv
    args, extra = parser.parse_known_args(parser.argv)
    used = subcommand_parser(parser, args)
    if extra:
        used.refuse_unknown(extra)
    args.cli_words = lambda text: in_flag_names(text, used)
    args.warned = []

    def show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                     file: Any = None, line: str | None = None) -> None:
        text = in_flag_names(str(message), used)
        args.warned.append(text)  # for --json's warnings
        print_warning(text, category, filename, lineno, file, line)

    try:
        with warnings.catch_warnings(), library_logs_quiet():
            warnings.showwarning = show_warning
            return args.run(args)
    except OutputClosedError:
        raise
    except BrokenPipeError as exc:
        if pipe_closed(sys.stdout) or pipe_closed(sys.stderr):  # our output's reader, not a network peer
            silence(sys.stdout, sys.stderr)
            return EXIT_PIPE
        print_error(parser.prog, str(exc))
        return EXIT_ERROR
    except UsageError as exc:
        print_error(parser.prog, in_flag_names(str(exc), used))
        return EXIT_USAGE
    except PackloadError as exc:
        print_error(parser.prog, in_flag_names(str(exc), used))
        return EXIT_ERROR
    except OSError as exc:  # a file we could not read or write: name it, no traceback
        print_error(parser.prog, str(exc))
        return EXIT_ERROR
    except ValueError as exc:  # a value the library refused, in its Python names
        print_error(parser.prog, in_flag_names(str(exc), used))
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{parser.prog}: {interrupted_message(args)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug: still one line, with what to report
        print_error(parser.prog, f"unexpected {type(exc).__name__}: {exc}; this is a bug in packload "
                                 f"{__version__}, please report it with the command you ran")
        return EXIT_ERROR


def interrupted_message(args: argparse.Namespace) -> str:
    """What Ctrl-C left, and the way on that will be accepted: ``--resume`` only where it applies (a
    pack to a local destination, or any of the Ray engine's); a pack to a URL by this machine
    publishes nothing and removes what it uploaded, so the same command starts again."""
    if args.run is not run_pack:
        return "interrupted"
    if getattr(args, "engine", "local") == "local" and is_url(args.dst):
        return (f"interrupted; nothing was published at {display_url(args.dst)} (what this run uploaded is removed); "
                "run the same command again to pack it")
    return "interrupted; the unfinished pack can be finished with the same command and --resume"


def main(argv: Sequence[str] | None = None) -> int:
    """``packload COMMAND ...``; returns the exit code."""
    return _run(build_parser(), argv)


def pack_main(argv: Sequence[str] | None = None) -> int:
    """``pack SRC DEST ...``, the short form of ``packload pack``."""
    parser = Parser(prog="pack", description="Pack an image folder into an .lmdb file "
                     "or a shards folder (short for `packload pack`).")
    add_pack_arguments(parser)
    parser.set_defaults(run=run_pack)
    return _run(parser, argv)


def module_main(argv: Sequence[str] | None = None) -> int:
    """``python -m packload``: ``packload`` when the first word is a subcommand, else ``pack``."""
    words = list(sys.argv[1:] if argv is None else argv)
    names = {"pack", "merge", "info", "verify", "unpack", "doctor", "tune", "demo", "-h", "--help", "--version"}
    return main(words) if words and words[0] in names else pack_main(words)
