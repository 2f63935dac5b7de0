"""Pack an image folder: scan, check and encode in parallel, write in order, publish atomically.

Data flows one way: ``scan`` lists the files, worker processes run ``encode`` on consecutive
runs of them, and this process writes the results in scan order through one backend writer into
``DEST.partial``. Only a finished pack is renamed to ``DEST``, so a killed ``pack`` never leaves
anything that looks complete; ``resume=True`` continues from the last intact record. All of it
happens under the destination's lock, after ``packer.destination`` has checked what may be
replaced; worker processes end if this process is killed (``packer.workers``).
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import lmdb

from packload.core.cpus import usable_cores
from packload.core.display import plural, terminal_safe
from packload.core.errors import PackFormatError, SkippedFileError, UsageError, WriteError
from packload.core.format import (
    INDEX_NAME,
    MANIFEST_NAME,
    PROGRESS_KEY,
    RAY_RUN_NAME,
    SHARD_HEADER,
    RecordMeta,
    pack_size,
    shard_number,
)
from packload.core.lmdb_pages import file_keys
from packload.core.manifest import Manifest, build_manifest
from packload.core.progress import progress_bar
from packload.core.remote import is_url
from packload.core.scan import ScanResult, printable
from packload.packer.destination import (
    creation_error,
    exists,
    is_task_folder_name,
    system_reason,
)
from packload.packer.encode import Encoded, EncodeOptions, Skipped, encode_chunk
from packload.packer.encode_stream import encoded_chunks
from packload.packer.pack_destination import PackDestination
from packload.packer.pack_url import pack_to_url
from packload.packer.resume_options import options_changed, options_from_record
from packload.packer.table_options import TableOptions
from packload.packer.table_source import fields_summary, scan_source, table_of
from packload.packer.url_destination import pack_name
from packload.packer.write_lmdb import LmdbWriter
from packload.packer.write_shards import ShardsWriter

DEFAULT_SHARD_SIZE = 256 << 20
CHECKPOINT_SECONDS = 5.0  # at most this long between checkpoints a resume starts from
# Address space LMDB reserves per file to pack (not disk: the file grows as it is written); doubled
# whenever it fills. Readers map what the writer reserved, so it is kept near the pack's size.
LMDB_MAP_PER_FILE = 256 << 10
def backend_for(dst: Path, backend: str | None) -> str:
    """The backend a destination asks for: ``--format`` if given, else ``.lmdb`` → lmdb, else shards."""
    if backend is None:
        return "lmdb" if dst.suffix.lower() == ".lmdb" else "shards"
    if backend not in ("lmdb", "shards"):
        raise UsageError(f"unknown --format {backend!r}; choose lmdb or shards")
    return backend


def _kept_source_bytes(scan: ScanResult, start: int, skipped: list[dict[str, Any]]) -> int:
    """Source bytes of the files packed before a resume (their records are already written)."""
    left_out = {item["pos"] for item in skipped}
    total = 0
    for pos in range(start):
        if pos not in left_out:
            try:
                total += os.path.getsize(os.path.join(str(scan.root), scan.samples[pos].path))
            except OSError:
                pass  # changed since: the record holds what was read then
    return total


def _resume_point(scan: ScanResult, kept: list[RecordMeta], progress: dict[str, Any],
                  options: dict[str, Any]) -> tuple[int, list[dict[str, str]]]:
    """Where to go on after ``kept`` records; refuses when the source or options have changed."""
    if progress.get("options") != options:
        raise UsageError(f"the unfinished pack was started with other options: "
                         f"{options_changed(progress.get('options') or {}, options)}; "
                         "resume with the same options, or start over with --overwrite")
    changed = f"{scan.root}: the source folder changed since the pack was interrupted"
    position = {sample.path: i for i, sample in enumerate(scan.samples)}
    last = -1
    packed = set()
    for meta in kept:
        pos = position.get(meta.path, -1)
        if pos <= last or scan.samples[pos].label != meta.label:
            raise UsageError(f"{changed} ({meta.path}); start over with --overwrite")
        packed.add(pos)
        last = pos
    skipped = [s for s in progress.get("skipped", []) if s["pos"] <= last]
    # A skip noted after the last checkpoint may be missing: check those files again.
    noted = packed | {s["pos"] for s in skipped}
    for pos in (p for p in range(last + 1) if p not in noted):
        [item] = encode_chunk(str(scan.root), [scan.samples[pos]], options_from_record(options))
        if not isinstance(item, Skipped):
            raise UsageError(f"{changed} ({item.path}); start over with --overwrite")
        skipped.append({"path": item.path, "reason": item.reason, "pos": pos})
    skipped.sort(key=lambda s: s["pos"])
    return last + 1, skipped


# A name of this module, called through it: tests wrap it to stop a pack just before publishing.
def pack(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, backend: str | None = None,
         options: EncodeOptions | None = None, workers: int | None = None,
         shard_size: int = DEFAULT_SHARD_SIZE, overwrite: bool = False, resume: bool = False,
         strict: bool = False, progress: bool = True, checkpoint_every: int | None = None,
         shard_sink: Callable[[Path], None] | None = None,
         storage_options: dict[str, Any] | None = None,
         labels: str | os.PathLike[str] | TableOptions | None = None) -> dict[str, Any]:
    """Pack the ImageFolder tree ``src`` into ``dst`` (an LMDB file or a shards folder).

    ``labels``: a table (``labels.csv``, ``.jsonl``, ``.parquet``; or ``TableOptions``) of one row per
    image, its ``path`` relative to ``src``: its ``label`` column is the class and its other columns
    become the pack's fields (``packer.table_source``, docs/FIELDS.md).

    ``dst`` may be a URL (``s3://bucket/train.shards``, ``gs://...``, any fsspec URL): the pack is
    then written through ``packer.pack_url`` (shards uploaded as they are finished, the manifest
    last; the destination's rules are ``packer.url_destination``'s), ``storage_options`` going to
    fsspec (an endpoint, credentials).

    Files that fail their check are skipped and listed in the manifest (``strict=True`` makes the
    first one an error). ``shard_sink`` takes each finished shard away (``packer.upload``; shards
    backend only, no ``resume``). Progress is made durable for ``resume`` every few seconds, and also every
    ``checkpoint_every`` files when given. ``overwrite`` replaces only a pack (``packer.destination``);
    another command writing ``dst`` at the same time is refused. Returns a summary: counts, sizes,
    time and rates.
    """
    if is_url(dst) and shard_sink is None:  # the one place a URL destination is dispatched
        url = str(dst)
        return pack_to_url(src, url, local_pack=pack, backend=backend_for(Path(pack_name(url)), backend),
                           options=options, workers=workers, shard_size=shard_size,
                           overwrite=overwrite, resume=resume, strict=strict, progress=progress,
                           checkpoint_every=checkpoint_every, storage_options=storage_options, labels=labels)
    started = time.perf_counter()
    src_path, dst_path = Path(src), Path(dst)
    options = options or EncodeOptions()
    backend = backend_for(dst_path, backend)
    workers = usable_cores() if workers is None else workers
    if workers < 1:
        raise UsageError(f"--workers {workers}: give at least 1")
    if shard_size < 1 << 16:
        raise UsageError(f"--shard-size {shard_size}: give at least 64 KiB (for example 256M)")
    with PackDestination(dst_path, [src_path], "the source folder", overwrite) as destination:
        scan = scan_source(src_path, labels, strict, storage_options)
        scan.check_layout(strict)
        if strict:
            scan.refuse_not_regular()
        options_record = {"backend": backend, **asdict(options)}
        if options.size is not None:
            options_record["size"] = list(options.size)
        if table_of(scan) is not None:
            options_record["labels"] = table_of(scan).options_record()
        writer, start, skipped = _open_writer(scan, destination, backend, shard_size, options_record, resume)
        if shard_sink is not None and isinstance(writer, ShardsWriter):
            writer.shard_sink = shard_sink
        manifest = _write_or_keep(scan, writer, start, skipped, options, options_record, workers, strict,
                                  progress, checkpoint_every, destination)
        destination.publish()
    seconds = time.perf_counter() - started
    source_bytes = manifest.source["bytes"]
    run_files = len(scan.samples) - start  # a resumed pack's rates count this run's files only
    run_bytes = source_bytes - (_kept_source_bytes(scan, start, skipped) if start else 0)
    return {
        "destination": str(dst_path),
        "backend": backend,
        "encoding": options.encoding,
        "records": manifest.records,
        "classes": len(manifest.classes),
        "skipped": manifest.skipped_count,
        "ignored": manifest.ignored_count,
        "source_bytes": source_bytes,
        "pack_bytes": pack_size(dst_path),
        "seconds": round(seconds, 3),
        "files_total": len(scan.samples),
        "files_this_run": run_files,
        "files_per_s": round(run_files / seconds, 1) if seconds > 0 else None,
        "mb_per_s": round(run_bytes / seconds / 1e6, 1) if seconds > 0 else None,
        "resumed_at": start if start else None,
        "engine": "local",
        "ray": None,  # the Ray engine's task figures; the same keys whichever engine packed
        **fields_summary(manifest),
    }


def _open_writer(scan: ScanResult, destination: PackDestination, backend: str, shard_size: int,
                 options_record: dict[str, Any], resume: bool) -> tuple[ShardsWriter | LmdbWriter, int,
                                                                       list[dict[str, Any]]]:
    """The writer of the unfinished pack: the one an earlier run left reopened (``resume``), or a new
    one (an unfinished one of ours removed first under ``overwrite``). Returns it, the scan position
    to go on from and the files skipped before it."""
    tmp = destination.partial
    map_size = max(1 << 30, len(scan.samples) * LMDB_MAP_PER_FILE)
    leftover = destination.leftover()
    if leftover and resume and (tmp / RAY_RUN_NAME).exists():
        raise UsageError(f"{tmp}: this unfinished pack was started with --engine ray; resume it with "
                         "--engine ray --resume, or start over with --overwrite")
    if leftover and resume and exists(tmp):
        try:
            resumed = (LmdbWriter.resume(tmp, map_size) if backend == "lmdb"
                       else ShardsWriter.resume(tmp, shard_size))
        except PackFormatError as exc:
            raise UsageError(str(exc)) from None
        except lmdb.Error as exc:
            raise UsageError(f"{tmp}: cannot be resumed ({system_reason(exc)}); start over with --overwrite") from None
        if resumed is not None:
            writer, kept, noted = resumed
            start, skipped = _resume_point(scan, kept, noted, options_record)
            return writer, start, skipped
        destination.discard()  # killed before its first checkpoint: nothing to keep
    elif leftover:
        if not destination.overwrite and not nothing_to_resume(tmp):
            raise UsageError(f"{tmp}: an unfinished pack is there; add --resume to finish it, "
                             "or --overwrite to start over")
        destination.discard()  # replaced (--overwrite), or it holds nothing a resume would keep
    return _new_writer(destination, backend, shard_size, map_size, options_record), 0, []


def _new_writer(destination: PackDestination, backend: str, shard_size: int, map_size: int,
                options_record: dict[str, Any]) -> ShardsWriter | LmdbWriter:
    """Create the unfinished pack and note its first checkpoint; one line if that fails."""
    tmp = destination.partial
    writer: ShardsWriter | LmdbWriter | None = None
    try:
        if backend == "lmdb":
            writer = LmdbWriter(tmp, map_size)
        else:
            tmp.mkdir()
            writer = ShardsWriter(tmp, shard_size)
        writer.checkpoint({"options": options_record, "skipped": []})
    except (OSError, lmdb.Error) as exc:
        if writer is not None:
            writer.close()
        destination.discard()
        if isinstance(exc, WriteError):
            raise
        raise creation_error(tmp, exc) from None
    return writer


def _write_or_keep(scan: ScanResult, writer: ShardsWriter | LmdbWriter, start: int, skipped: list[dict[str, Any]],
                   options: EncodeOptions, options_record: dict[str, Any], workers: int, strict: bool,
                   progress: bool, checkpoint_every: int | None, destination: PackDestination) -> Manifest:
    """``_write_all``, with write failures as one line; the unfinished pack is kept for ``--resume``
    when it holds a record, and removed when it holds none (nothing to resume: the same command,
    run again, simply starts again)."""
    dst, tmp = destination.path, destination.partial
    try:
        return _write_all(scan, writer, start, skipped, options, options_record, workers, strict, progress,
                          checkpoint_every)
    except WriteError:
        _close_keeping(writer, destination)
        raise
    except OSError as exc:
        kept = _close_keeping(writer, destination)
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            then = f"then rerun with --resume; the unfinished pack is at {tmp}" if kept else "then pack again"
            raise WriteError(f"{dst}: {exc.strerror} while writing; free space (or raise the file-size "
                             f"limit), {then}") from None
        where = f"; the unfinished pack is at {tmp}" if kept else ""
        raise WriteError(f"{dst}: write failed ({exc.strerror or exc}){where}") from None
    except BaseException:
        _close_keeping(writer, destination)
        raise


def _close_keeping(writer: ShardsWriter | LmdbWriter, destination: PackDestination) -> bool:
    """Close ``writer`` after a failure; keep the unfinished pack only when it holds a record
    (something ``--resume`` would keep). Whether it was kept."""
    writer.close()
    if writer.index.count:
        return True
    destination.discard()
    return False


def nothing_to_resume(tmp: Path) -> bool:
    """Whether the unfinished pack ``tmp`` (ours, checked) holds nothing ``--resume`` would keep: no
    shard with a record in it, no index, no manifest (a pack killed before its first record); an
    LMDB file with no key but its progress record. A Ray run's is never judged so."""
    if os.path.isdir(tmp) and not os.path.islink(tmp):
        names = set(os.listdir(tmp))
        if names & {RAY_RUN_NAME, INDEX_NAME, MANIFEST_NAME} or any(is_task_folder_name(name) for name in names):
            return False
        return all(os.path.getsize(tmp / name) <= SHARD_HEADER.itemsize for name in names if shard_number(name) is not None)
    try:
        if os.path.getsize(tmp) == 0:
            return True
        return set(file_keys(str(tmp))) <= {PROGRESS_KEY}
    except (OSError, PackFormatError):
        return False


def write_or_skip(item: Encoded | Skipped, pos: int, root: str | Path, writer: ShardsWriter | LmdbWriter,
                  skipped: list[dict[str, Any]], strict: bool) -> int:
    """Write an encoded record, or list a skipped file (an error under ``strict``); returns the source
    bytes written. ``root``: the source folder, or its URL."""
    if isinstance(item, Skipped):
        if strict:
            where = f"{str(root).rstrip('/')}/{item.path}" if is_url(root) else Path(root) / item.path
            raise SkippedFileError(f"{where}: {item.reason}; fix or remove the file, "
                                   "or pack without --strict to skip it and list it in the manifest")
        skipped.append({"path": item.path, "reason": item.reason, "pos": pos})
        return 0
    writer.write(item)
    return item.source_bytes


def _write_all(scan: ScanResult, writer: ShardsWriter | LmdbWriter, start: int, skipped: list[dict[str, Any]],
               options: EncodeOptions, options_record: dict[str, Any], workers: int, strict: bool,
               progress: bool, checkpoint_every: int | None) -> Manifest:
    """Feed every sample from ``start`` on through the encoder into ``writer``; finish the pack."""
    total = len(scan.samples)
    written_bytes = 0  # source bytes of the files packed in this run
    kept_bytes = _kept_source_bytes(scan, start, skipped)
    last_checkpoint = time.monotonic()
    bar = progress_bar(total=total, initial=start, unit="img", disable=not progress, dynamic_ncols=True,
               desc=f"pack {terminal_safe(scan.root.name)}", smoothing=0.1)
    tick = time.perf_counter()
    pos = start
    try:
        for items in encoded_chunks(scan.root, scan.samples, start, options, workers):
            if (not checkpoint_every and not any(type(item) is Skipped for item in items)
                    and not writer.index.has_long_path(items)):
                writer.write_many(items)  # the common case: every file of the run packed
                written_bytes += sum(item.source_bytes for item in items)
            else:
                for at, item in enumerate(items, pos):  # a skipped file, or checkpoints by count
                    written_bytes += write_or_skip(item, at, scan.root, writer, skipped, strict)
                    now = time.monotonic()
                    if now - last_checkpoint >= CHECKPOINT_SECONDS or (
                            checkpoint_every and (at + 1) % checkpoint_every == 0):
                        writer.checkpoint({"options": options_record, "skipped": skipped})
                        last_checkpoint = now
            pos += len(items)
            bar.update(len(items))
            now = time.monotonic()
            if now - last_checkpoint >= CHECKPOINT_SECONDS:
                writer.checkpoint({"options": options_record, "skipped": skipped})
                last_checkpoint = now
            if progress:
                elapsed = time.perf_counter() - tick
                bar.set_postfix_str(f"{written_bytes / max(elapsed, 1e-9) / 1e6:.0f} MB/s", refresh=False)
        bar.update(total - bar.n)
    finally:
        bar.close()
    if writer.index.count == 0:
        writer.close()
        raise UsageError(f"{scan.root}: none of the {plural(total, 'image file')} could be packed "
                         f"(first problem: {skipped[0]['path']}: {skipped[0]['reason']})")
    table = table_of(scan)  # a table's rows skip images too: listed in scan order with the others
    listed, files = table.with_skips(skipped, total) if table is not None else (skipped, total)
    manifest = build_manifest(
        backend=options_record["backend"], encoding=options.encoding,
        source={"name": printable(scan.root.resolve().name), "files": files, "bytes": kept_bytes + written_bytes},
        labelled=scan.labelled, classes=scan.classes, labels=writer.index.labels(),
        payload_bytes=writer.index.payload_bytes, skipped=listed, ignored=scan.ignored, options=options_record)
    if table is None:
        return writer.finish(manifest)
    return writer.finish(manifest, partial(table.part, skipped, total, options_record["backend"]))
