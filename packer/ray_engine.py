"""``pack --engine ray``: pack one folder with Ray tasks, on one machine or a cluster.

The driver scans the folder once and splits the file list into contiguous ranges. Each Ray task
checks and encodes its range and writes it as a small shards pack of its own in a task folder
under ``DEST.partial`` (storage every node sees). When all have finished, the driver joins them:
shards are renamed into place and renumbered in place by Ray tasks (``packer.combine``), and the
driver writes one index and one manifest over all of them, then publishes ``DEST.partial`` by
rename, as ``pack`` does. For an ``.lmdb`` destination the driver copies the tasks' records into
the LMDB file instead. The result holds the same records, in the same order, with the same labels
and skipped list, as a single-machine pack of the same folder; only shard boundaries differ (each
range starts a new shard). A task that fails is retried by Ray; one that keeps failing fails the
pack, and the unfinished pack is removed: nothing that looks complete is published.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from packload.core.display import terminal_safe
from packload.core.errors import PackloadError, UsageError
from packload.core.format import INDEX_NAME, MANIFEST_NAME, pack_size
from packload.core.manifest import build_manifest, encode_manifest, ignored_count, skipped_count
from packload.core.progress import progress_bar
from packload.core.scan import Sample, ScanResult, printable, scan_folder
from packload.packer.combine import ShardPayloads, ShardSource, copy_records, joined_index
from packload.packer.destination import (
    check_apart,
    check_destination,
    check_name,
    check_parent,
    check_partial,
    creation_error,
    exists,
    partial_path,
    publish,
    remove_ours,
)
from packload.packer.destination_lock import DestinationLock
from packload.packer.encode import EncodeOptions
from packload.packer.pipeline import (
    DEFAULT_SHARD_SIZE,
    LMDB_MAP_PER_FILE,
    backend_for,
)
from packload.packer.ray_tasks import pack_range, place_task, task_name, task_source
from packload.packer.write_lmdb import LmdbWriter
from packload.packer.write_shards import fsync_dir, write_file_atomic

INSTALL_HINT = '--engine ray needs Ray, which is not installed; pip install "packload[ray]"'
MIN_TASK_FILES = 5000  # files per task at least: each task has a fixed cost (scheduling, start-up)
TASKS_PER_CPU = 2  # ranges per CPU of the cluster by default: balance without many small shards


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError(INSTALL_HINT) from None
    return ray


def split_ranges(count: int, task_files: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, stop)`` ranges of at most ``task_files`` files covering ``count``."""
    return [(start, min(start + task_files, count)) for start in range(0, count, task_files)]


def _failure(exc: BaseException, dst: Path, ranges: list[tuple[int, int]], task: int, samples: list[Sample],
             retries: int) -> PackloadError:
    """The one-line error for a task that kept failing."""
    cause = getattr(exc, "cause", None) or exc
    if isinstance(cause, PackloadError) and not isinstance(cause, OSError):
        return type(cause)(str(cause))
    start, stop = ranges[task]
    text = str(cause).strip().splitlines()[-1] if str(cause).strip() else type(cause).__name__
    return PackloadError(f"{dst}: Ray task {task} (files {start}..{stop - 1}, from {samples[start].path}) failed "
                         f"after {retries} retries ({type(cause).__name__}: {text}); nothing was published; fix "
                         "the cause (every node must see the source and destination folders) and pack again")


def pack_ray(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, backend: str | None = None,
             options: EncodeOptions | None = None, shard_size: int = DEFAULT_SHARD_SIZE,
             overwrite: bool = False, strict: bool = False, progress: bool = True, address: str | None = None,
             task_files: int | None = None, max_retries: int = 3) -> dict[str, Any]:
    """Pack the ImageFolder tree ``src`` into ``dst`` with Ray tasks; the same pack as ``pack``.

    Uses the Ray instance this process is connected to, else connects to ``address`` (``"auto"``:
    the running cluster), else starts a local one. ``task_files`` sets how many files each task
    packs (default: about two ranges per CPU of the cluster, at least 5000 files each). The
    driver holds the destination's lock, and ``overwrite`` replaces only a pack, as for ``pack``.
    Returns ``pack``'s summary plus the tasks' timings.
    """
    ray = _import_ray()
    started = time.perf_counter()
    src_path, dst_path = Path(src), Path(dst)
    options = options or EncodeOptions()
    backend = backend_for(dst_path, backend)
    if shard_size < 1 << 16:
        raise UsageError(f"--shard-size {shard_size}: give at least 64 KiB (for example 256M)")
    if task_files is not None and task_files < 1:
        raise UsageError(f"--task-files {task_files}: give at least 1")
    check_name(dst_path)
    check_parent(dst_path)
    check_apart(dst_path, [src_path], "the source folder")
    with DestinationLock(dst_path):
        check_destination(dst_path, overwrite)
        scan = scan_folder(src_path)
        scan.check_splits(strict)
        if strict:
            scan.refuse_not_regular()
        tmp = partial_path(dst_path)
        staging = tmp if backend == "shards" else staging_path(dst_path)
        for leftover in dict.fromkeys((tmp, staging)):
            if check_partial(leftover):
                if not overwrite:
                    raise UsageError(f"{leftover}: an unfinished pack is there; add --overwrite to start over "
                                     "(--engine ray cannot resume)")
                remove_ours(leftover)
        options_record = {"backend": backend, **asdict(options)}
        if options.size is not None:
            options_record["size"] = list(options.size)
        started_ray = _start_ray(ray, address)
        try:
            return _pack_on_ray(ray, started, scan, dst_path, tmp, staging, backend, options, options_record,
                                shard_size, strict, progress, task_files, max_retries)
        finally:
            if started_ray:
                ray.shutdown()


def staging_path(dst: Path) -> Path:
    """Where the tasks of an LMDB pack write their ranges: ``DEST.partial-tasks``."""
    return dst.with_name(dst.name + ".partial-tasks")


def _start_ray(ray: Any, address: str | None) -> bool:
    """Connect to Ray unless this process already is; True if it connected here (and so shuts down)."""
    if ray.is_initialized():
        return False
    try:
        ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    except Exception as exc:  # noqa: BLE001 - Ray raises several kinds here; all mean "no cluster"
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"--ray-address {address}: cannot start or reach Ray ({reason}); start the cluster "
                         "(`ray start --head` on one node) or leave out --ray-address for a local one") from None
    return True


def _pack_on_ray(ray: Any, started: float, scan: ScanResult, dst_path: Path, tmp: Path, staging: Path,
                 backend: str, options: EncodeOptions, options_record: dict[str, Any], shard_size: int,
                 strict: bool, progress: bool, task_files: int | None, max_retries: int) -> dict[str, Any]:
    """Run the tasks, join their output into ``tmp`` and publish it as ``dst_path``; the summary."""
    ray_ready = time.perf_counter()
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    per_task = task_files or max(MIN_TASK_FILES, math.ceil(len(scan.samples) / (TASKS_PER_CPU * cpus)))
    ranges = split_ranges(len(scan.samples), per_task)
    try:
        staging.mkdir()
    except OSError as exc:
        raise creation_error(staging, exc) from None
    try:
        tasks = _Tasks(ray, scan, ranges, staging, max_retries, dst_path, tmp if backend == "shards" else None)
        tasks.run(options, shard_size, strict, progress)
        results = [tasks.results[k] for k in range(len(ranges))]
        tasks_done = time.perf_counter()
        records = sum(r["records"] for r in results)
        skipped = [s for r in results for s in r["skipped"]]
        if records == 0:
            raise UsageError(f"{scan.root}: none of the {len(scan.samples)} image files could be packed "
                             f"(first problem: {skipped[0]['path']}: {skipped[0]['reason']})")
        sources = [task_source(staging / task_name(r["task"])) for r in results]
        part_bases = np.cumsum([0] + [len(s.parts) for s in sources])[:-1].tolist()
        index, labels = joined_index(sources, part_bases)
        manifest = build_manifest(
            backend=backend, encoding=options.encoding,
            source={"name": printable(scan.root.resolve().name), "files": len(scan.samples),
                    "bytes": sum(r["source_bytes"] for r in results)},
            labelled=scan.labelled, classes=scan.classes, labels=labels,
            payload_bytes=sum(r["payload_bytes"] for r in results), skipped=skipped, ignored=scan.ignored,
            options=options_record)
        if backend == "shards":
            parts = [part for k in range(len(ranges)) for part in tasks.placed[k]["parts"]]
            _finish_shards(sources, parts, tmp, index, manifest)
        else:
            _join_lmdb(sources, tmp, len(scan.samples), manifest)
            shutil.rmtree(staging)
    except BaseException:
        for leftover in (tmp, staging):
            if exists(leftover):
                remove_ours(leftover)
        raise
    publish(tmp, dst_path)
    seconds = time.perf_counter() - started
    source_bytes = manifest["source"]["bytes"]
    task_seconds = [r["seconds"] for r in results]
    return {
        "destination": str(dst_path),
        "backend": backend,
        "encoding": options.encoding,
        "records": records,
        "classes": len(scan.classes),
        "skipped": skipped_count(manifest),
        "ignored": ignored_count(manifest),
        "source_bytes": source_bytes,
        "pack_bytes": pack_size(dst_path),
        "seconds": round(seconds, 3),
        "files_total": len(scan.samples),
        "files_this_run": len(scan.samples),
        "files_per_s": round(len(scan.samples) / seconds, 1) if seconds > 0 else None,
        "mb_per_s": round(source_bytes / seconds / 1e6, 1) if seconds > 0 else None,
        "resumed_at": None,
        "engine": "ray",
        "ray": {
            "tasks": len(ranges),
            "cluster_cpus": cpus,
            "ray_start_s": round(ray_ready - started, 3),
            "tasks_s": round(tasks_done - ray_ready, 3),
            "join_s": round(time.perf_counter() - tasks_done, 3),
            "task_s": {"min": round(min(task_seconds), 3), "max": round(max(task_seconds), 3),
                       "sum": round(sum(task_seconds), 3)},
            "task_cpu_s": round(sum(r["cpu_seconds"] for r in results)
                                + sum(p["cpu_seconds"] for p in tasks.placed.values()), 3),
        },
    }


class _Tasks:
    """Runs one ``pack_range`` task per range and, for a shards pack, one ``place_task`` per range
    as soon as every range before it has finished (its first part and record numbers are known
    then), so most renumbering overlaps the packing. A failure that outlived Ray's retries cancels
    the rest and raises one clear error."""

    def __init__(self, ray: Any, scan: Any, ranges: list[tuple[int, int]], staging: Path, max_retries: int,
                 dst: Path, place_into: Path | None) -> None:
        self.ray, self.scan, self.ranges, self.staging = ray, scan, ranges, staging.resolve()
        self.max_retries, self.dst = max_retries, dst
        self.place_into = place_into.resolve() if place_into is not None else None
        self.results: dict[int, dict[str, Any]] = {}
        self.placed: dict[int, dict[str, Any]] = {}
        self._pending: dict[Any, tuple[str, int]] = {}
        self._next_place = self._part_base = self._record_base = 0

    def run(self, options: EncodeOptions, shard_size: int, strict: bool, progress: bool) -> None:
        ray = self.ray
        packer_task = ray.remote(num_cpus=1, max_retries=self.max_retries, retry_exceptions=[OSError])(pack_range)
        root = str(self.scan.root.resolve())  # tasks run in other folders, on other nodes
        for k, (a, b) in enumerate(self.ranges):
            # Only the first range keeps its numbers (and so its hashes) in a shards pack.
            hashed = k == 0 and self.place_into is not None
            ref = packer_task.remote(k, root, self.scan.samples[a:b], a, self.scan.classes, options,
                                     str(self.staging / task_name(k)), shard_size, strict, hashed)
            self._pending[ref] = ("pack", k)
        bar = progress_bar(total=len(self.scan.samples), unit="img", disable=not progress, dynamic_ncols=True,
                   desc=f"pack {terminal_safe(self.scan.root.name)} ({len(self.ranges)} Ray tasks)")
        try:
            while self._pending:
                [ref], _ = ray.wait(list(self._pending), num_returns=1)
                kind, k = self._pending.pop(ref)
                try:
                    value = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - Ray wraps the task's error; reported in one line
                    self._cancel()
                    raise _failure(exc, self.dst, self.ranges, k, self.scan.samples, self.max_retries) from None
                if kind == "pack":
                    self.results[k] = value
                    bar.update(self.ranges[k][1] - self.ranges[k][0])
                    self._place_ready()
                else:
                    self.placed[k] = value
        finally:
            bar.close()

    def _place_ready(self) -> None:
        if self.place_into is None:
            return
        placer = self.ray.remote(num_cpus=1, max_retries=self.max_retries, retry_exceptions=[OSError])(place_task)
        while self._next_place in self.results:
            k, result = self._next_place, self.results[self._next_place]
            ref = placer.remote(str(self.staging / task_name(k)), str(self.place_into), self._part_base,
                                self._record_base)
            self._pending[ref] = ("place", k)
            self._part_base += len(result["parts"])
            self._record_base += result["records"]
            self._next_place += 1

    def _cancel(self) -> None:
        for ref in self._pending:
            self.ray.cancel(ref, force=True)
        if self._pending:
            self.ray.wait(list(self._pending), num_returns=len(self._pending), timeout=30)


def _finish_shards(sources: list[ShardSource], parts: list[dict[str, Any]], tmp: Path, index: bytes,
                   manifest: dict[str, Any]) -> None:
    """With every shard in place: drop the task folders, write the index and, last, the manifest."""
    import hashlib

    for source in sources:
        shutil.rmtree(source.folder)
    write_file_atomic(tmp / INDEX_NAME, index)
    manifest.update(parts=parts, index={"name": INDEX_NAME, "size": len(index),
                                        "sha256": hashlib.sha256(index).hexdigest()})
    write_file_atomic(tmp / MANIFEST_NAME, encode_manifest(manifest))
    fsync_dir(tmp)


def _join_lmdb(sources: list[ShardSource], tmp: Path, files: int, manifest: dict[str, Any]) -> None:
    """Copy every task's records, in order, into the LMDB file ``tmp`` (chunks as ``pack`` makes)."""
    try:
        writer = LmdbWriter(tmp, max(1 << 30, files * LMDB_MAP_PER_FILE))
    except lmdb.Error as exc:
        raise creation_error(tmp, exc) from None
    try:
        for source in sources:
            payloads = ShardPayloads(source)
            try:
                copy_records(source.entries, source.paths, payloads, writer.write)
            finally:
                payloads.close()
        manifest.update(writer.finish(manifest))
    finally:
        writer.close()
