"""The subcommands that write a pack: ``pack`` (an image folder, or a source at a URL with Ray, into
a pack) and ``merge`` (packs made separately into one). The writer side is imported only when the
command runs, so the command line starts fast.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from packload.cli_report import EXIT_OK, emit
from packload.core.display import plural
from packload.core.errors import UsageError
from packload.core.remote import is_url

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


# -- pack ------------------------------------------------------------------------------------
def add_pack(sub: Any) -> None:
    """Register ``packload pack``."""
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
    from packload.packer.table_options import TableOptions, parse_field_spec

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
    emit(args, result, lines)
    return EXIT_OK

# -- merge -----------------------------------------------------------------------------------
def add_merge(sub: Any) -> None:
    """Register ``packload merge``."""
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
    emit(args, result, lines)
    return EXIT_OK
