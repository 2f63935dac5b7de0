"""``pack --engine ray``: pack one folder with Ray tasks, on one machine or a cluster.

The driver lists the folder's top level; Ray tasks list its classes' files (``packer.ray_scan``),
and the driver merges them into the scan ``pack`` makes and splits the file list into contiguous
ranges. Each Ray task
checks and encodes its range and writes it as a small shards pack of its own in a task folder
under ``DEST.partial`` (storage every node sees). When all have finished, the driver joins them:
shards are renamed into place and renumbered in place by Ray tasks (``packer.combine``), and the
driver writes one index and one manifest over all of them, then publishes ``DEST.partial`` by
rename, as ``pack`` does. For an ``.lmdb`` destination the driver copies the tasks' records into
the LMDB file instead. The result holds the same records, in the same order, with the same labels
and skipped list, as a single-machine pack of the same folder; only shard boundaries differ (each
range starts a new shard). A task that fails, or whose worker or node is lost, is retried by Ray;
one that keeps failing fails the pack, and the unfinished pack is removed: nothing that looks
complete is published. A driver that was killed (or interrupted) leaves the unfinished pack: with
``resume=True`` the tasks that had finished are kept and only the others run (``packer.ray_resume``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from packload.core.display import plural, terminal_safe
from packload.core.errors import PackloadError, SkippedFileError, UsageError
from packload.core.manifest import build_manifest
from packload.core.progress import progress_bar
from packload.core.remote import is_url
from packload.core.scan import Sample, ScanResult, printable
from packload.packer.combine import joined_index
from packload.packer.encode import EncodeOptions
from packload.packer.pack_destination import PackDestination
from packload.packer.pipeline import (
    DEFAULT_SHARD_SIZE,
    backend_for,
)
from packload.packer.ray_folder import LocalTarget
from packload.packer.ray_resume import run_record
from packload.packer.ray_scan import list_source_top, scan_in_tasks
from packload.packer.ray_tasks import pack_range, place_task, settle_after_failure
from packload.packer.ray_url import UrlLmdbTarget, UrlTarget, url_target
from packload.packer.table_options import TableOptions
from packload.packer.table_source import fields_summary, ray_scan, table_of, table_or_none

INSTALL_HINT = '--engine ray needs Ray, which is not installed; pip install "packload[ray]"'
MIN_TASK_FILES = 5000  # files per task at least: each task has a fixed cost (scheduling, start-up)
TASKS_PER_CPU = 2  # ranges per CPU of the cluster by default: balance without many small shards
Target = LocalTarget | UrlTarget | UrlLmdbTarget  # where the tasks' output goes, and how it is joined


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError(INSTALL_HINT) from None
    return ray


def split_ranges(count: int, task_files: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, stop)`` ranges of at most ``task_files`` files covering ``count``."""
    return [(start, min(start + task_files, count)) for start in range(0, count, task_files)]


def _failure(exc: BaseException, dst: str, ranges: list[tuple[int, int]], task: int, samples: list[Sample],
             retries: int, after: str) -> PackloadError:
    """The one-line error for a task that kept failing."""
    cause = getattr(exc, "cause", None) or exc
    if isinstance(cause, PackloadError) and not isinstance(cause, OSError):
        return type(cause)(str(cause))
    start, stop = ranges[task]
    text = str(cause).strip().splitlines()[-1] if str(cause).strip() else type(cause).__name__
    return PackloadError(f"{dst}: Ray task {task} (files {start}..{stop - 1}, from {samples[start].path}) failed "
                         f"after {plural(retries, 'retry')} ({type(cause).__name__}: {text}); {after}")


def pack_ray(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, backend: str | None = None,
             options: EncodeOptions | None = None, shard_size: int = DEFAULT_SHARD_SIZE,
             overwrite: bool = False, resume: bool = False, strict: bool = False, progress: bool = True,
             address: str | None = None, task_files: int | None = None, max_retries: int = 3,
             storage_options: dict[str, Any] | None = None,
             labels: str | os.PathLike[str] | TableOptions | None = None) -> dict[str, Any]:
    """Pack the ImageFolder tree ``src`` into ``dst`` with Ray tasks; the same pack as ``pack``.

    Uses the Ray instance this process is connected to, else connects to ``address`` (``"auto"``:
    the running cluster), else starts a local one. ``task_files`` sets how many files each task
    packs (default: about two ranges per CPU of the cluster, at least 5000 files each). The
    driver holds the destination's lock, and ``overwrite`` replaces only a pack, as for ``pack``.
    ``resume`` finishes a pack whose driver was killed: the tasks that had finished are not run
    again (the same options and source are needed). ``src`` and ``dst`` may be object-store URLs
    (``s3://bucket/images/``, ``s3://bucket/train.shards``, ``s3://bucket/train.lmdb``; see ``packer.remote_source`` and
    ``packer.ray_url``), opened with ``storage_options``, which the tasks get in their arguments.
    Returns ``pack``'s summary plus the tasks' timings and the number of tasks each Ray node ran.
    ``labels``: a table beside the images, as for ``pack`` (read by the driver, a file or a URL).
    """
    ray = _import_ray()
    started = time.perf_counter()
    options = options or EncodeOptions()
    if shard_size < 1 << 16:
        raise UsageError(f"--shard-size {shard_size}: give at least 64 KiB (for example 256M)")
    if task_files is not None and task_files < 1:
        raise UsageError(f"--task-files {task_files}: give at least 1")
    target: Target
    if is_url(dst):
        target = url_target(str(dst), backend, storage_options)
        lock: Any = contextlib.nullcontext()
    else:
        dst_path = Path(dst)
        destination = PackDestination(dst_path, [] if is_url(src) else [Path(src)], "the source folder", overwrite)
        target = LocalTarget(destination, backend_for(dst_path, backend))
        lock = destination  # entered: the lock held, what is at dst_path checked
    with lock:
        target.check(overwrite)
        top = list_source_top(src, storage_options)  # a missing or unreadable source fails before Ray starts
        table = table_or_none(labels, storage_options)  # so does a table that cannot be read
        # tasks run in other folders, on other nodes: they get the folder's absolute path
        root = str(src).rstrip("/") if is_url(src) else str(top.root.resolve())
        started_ray = _start_ray(ray, address)
        try:
            ray_ready = time.perf_counter()
            scan, where = ray_scan(lambda: scan_in_tasks(ray, src, top, root, max_retries, storage_options),
                                   src, table, strict, storage_options)
            scan.check_layout(strict)
            if strict:
                scan.refuse_not_regular()
            options_record = {"backend": target.backend, **asdict(options)}
            if options.size is not None:
                options_record["size"] = list(options.size)
            if table_of(scan) is not None:
                options_record["labels"] = table_of(scan).options_record()
            record = run_record(options_record, shard_size, scan.samples)
            before = target.previous(record, task_files, resume, overwrite, root)
            run = _Run(ray, scan, root, target, max_retries, storage_options)
            summary = run.pack(started, options, record, before, strict, progress, task_files)
            summary["ray"].update(ray_start_s=round(ray_ready - started, 3), **where)
            return summary
        finally:
            if started_ray:
                ray.shutdown()


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


class _Run:
    """One run of the Ray engine over a scanned source (``root``: its folder or URL) into a target."""

    def __init__(self, ray: Any, scan: ScanResult, root: str, target: Target, max_retries: int,
                 storage_options: dict[str, Any] | None) -> None:
        self.ray, self.scan, self.root, self.target = ray, scan, root, target
        self.max_retries, self.storage_options = max_retries, storage_options

    def pack(self, started: float, options: EncodeOptions, record: dict[str, Any], before: dict[str, Any] | None,
             strict: bool, progress: bool, task_files: int | None) -> dict[str, Any]:
        """Run the tasks (those not finished ``before``), join their output and publish it; the summary."""
        ray, scan, target = self.ray, self.scan, self.target
        tasks_start = time.perf_counter()
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        shard_size, options_record = record["shard_size"], record["options"]
        if before is None:
            per_task = task_files or max(MIN_TASK_FILES, math.ceil(len(scan.samples) / (TASKS_PER_CPU * cpus)))
            ranges = split_ranges(len(scan.samples), per_task)
            target.begin({**record, "task_files": per_task, "ranges": ranges})
            kept: dict[int, dict[str, Any]] = {}
            kept_placed: dict[int, dict[str, Any]] = {}
        else:
            ranges = [tuple(span) for span in before["ranges"]]
            kept, kept_placed = target.resume(ranges)
            _refuse_kept_skips(self.root, kept, strict)
        try:
            tasks = _Tasks(ray, scan, self.root, ranges, target, self.max_retries, kept, kept_placed,
                           self.storage_options)
            tasks.run(options, shard_size, strict, progress)
            results = [tasks.results[k] for k in range(len(ranges))]
            tasks_done = time.perf_counter()
            records = sum(r["records"] for r in results)
            skipped = [s for r in results for s in r["skipped"]]
            if records == 0:
                raise UsageError(f"{self.root}: none of the {plural(len(scan.samples), 'image file')} could be packed "
                                 f"(first problem: {skipped[0]['path']}: {skipped[0]['reason']})")
            sources = target.sources(results)
            part_bases = np.cumsum([0] + [len(s.parts) for s in sources])[:-1].tolist()
            index, labels = joined_index(sources, part_bases)
            table = table_of(scan)  # a table's rows skip images too: listed in scan order with the others
            listed, files = table.with_skips(skipped, len(scan.samples)) if table else (skipped, len(scan.samples))
            manifest = build_manifest(
                backend=target.backend, encoding=options.encoding,
                source={"name": printable(scan.root.resolve().name), "files": files,
                        "bytes": sum(r["source_bytes"] for r in results)},
                labelled=scan.labelled, classes=scan.classes, labels=labels,
                payload_bytes=sum(r["payload_bytes"] for r in results), skipped=listed, ignored=scan.ignored,
                options=options_record)
            if table is not None:  # made by the target when it finishes, after the index
                target.fields = partial(table.part, skipped, len(scan.samples), target.backend)
            parts = ([part for k in range(len(ranges)) for part in tasks.placed[k]["parts"]]
                     if target.place_into is not None else [])
            target.finish(sources, parts, index, manifest, len(scan.samples))
        except (KeyboardInterrupt, SystemExit):
            raise  # interrupted, not failed: the finished tasks stay for --resume
        except BaseException:
            target.discard()
            raise
        pack_bytes = target.publish()
        seconds = time.perf_counter() - started
        source_bytes = manifest.source["bytes"]
        ran = [r for k, r in tasks.results.items() if k not in kept]  # the tasks of this run
        task_seconds = [r["seconds"] for r in ran] or [0.0]
        run_files = sum(b - a for k, (a, b) in enumerate(ranges) if k not in kept)
        nodes: dict[str, int] = {}
        for r in ran:
            nodes[r["node"] or "unknown"] = nodes.get(r["node"] or "unknown", 0) + 1
        return {
            "destination": target.destination,
            "backend": target.backend,
            "encoding": options.encoding,
            "records": records,
            "classes": len(scan.classes),
            "skipped": manifest.skipped_count,
            "ignored": manifest.ignored_count,
            "source_bytes": source_bytes,
            "pack_bytes": pack_bytes,
            "seconds": round(seconds, 3),
            "files_total": len(scan.samples),
            "files_this_run": run_files,
            "files_per_s": round(run_files / seconds, 1) if seconds > 0 else None,
            "mb_per_s": round(sum(r["source_bytes"] for r in ran) / seconds / 1e6, 1) if seconds > 0 else None,
            "resumed_at": _resumed_at(ranges, kept),
            "engine": "ray",
            "ray": {
                "tasks": len(ranges),
                "tasks_kept": len(kept),
                "tasks_per_node": dict(sorted(nodes.items())),
                "cluster_cpus": cpus,
                "tasks_s": round(tasks_done - tasks_start, 3),
                "join_s": round(time.perf_counter() - tasks_done, 3),
                "task_s": {"min": round(min(task_seconds), 3), "max": round(max(task_seconds), 3),
                           "sum": round(sum(task_seconds), 3)},
                "task_cpu_s": round(sum(r["cpu_seconds"] for r in ran)
                                    + sum(p["cpu_seconds"] for k, p in tasks.placed.items() if k not in kept_placed), 3),
            },
            **fields_summary(manifest),
        }


def _resumed_at(ranges: list[tuple[int, int]], kept: dict[int, dict[str, Any]]) -> int | None:
    """The first file of the first range this resumed run packed (the file count when it packed none);
    None for a run that kept nothing."""
    if not kept:
        return None
    return next((a for k, (a, _) in enumerate(ranges) if k not in kept), ranges[-1][1])


def _refuse_kept_skips(root: str, kept: dict[int, dict[str, Any]], strict: bool) -> None:
    """Under ``strict``, a kept task that skipped a file fails the resumed pack as packing it would."""
    skipped = [s for k in sorted(kept) for s in kept[k]["skipped"]]
    if strict and skipped:
        raise SkippedFileError(f"{root}/{skipped[0]['path']}: {skipped[0]['reason']}; fix or remove the "
                               "file, or pack without --strict to skip it and list it in the manifest")


class _Tasks:
    """Runs one ``pack_range`` task per range not ``kept`` from an interrupted run (spread over the
    nodes) and, for a shards pack, one ``place_task`` per range not placed yet, as soon as every
    range before it has finished (its first part and record numbers are known then), so most
    renumbering overlaps the packing. A failure that outlived Ray's retries stops the rest
    (``settle_after_failure``) and raises one clear error."""

    def __init__(self, ray: Any, scan: ScanResult, root: str, ranges: list[tuple[int, int]],
                 target: Target, max_retries: int, kept: dict[int, dict[str, Any]],
                 kept_placed: dict[int, dict[str, Any]], storage_options: dict[str, Any] | None) -> None:
        self.ray, self.scan, self.root, self.ranges, self.target = ray, scan, root, ranges, target
        self.max_retries, self.storage_options = max_retries, storage_options
        self.place_into = target.place_into
        self.results: dict[int, dict[str, Any]] = dict(kept)
        self.placed: dict[int, dict[str, Any]] = dict(kept_placed)
        self._pending: dict[Any, tuple[str, int]] = {}
        self._next_place = self._part_base = self._record_base = 0

    def run(self, options: EncodeOptions, shard_size: int, strict: bool, progress: bool) -> None:
        ray = self.ray
        # SPREAD: the ranges go to every node, so that each node's disks and network share the work.
        packer_task = ray.remote(num_cpus=1, max_retries=self.max_retries, retry_exceptions=[OSError],
                                 scheduling_strategy="SPREAD")(pack_range)
        for k, (a, b) in enumerate(self.ranges):
            if k in self.results:
                continue
            # Only the first range keeps its numbers (and so its hashes) in a shards pack.
            hashed = k == 0 and self.place_into is not None
            ref = packer_task.remote(k, self.root, self.scan.samples[a:b], a, self.scan.classes, options,
                                     self.target.task_out(k), shard_size, strict, hashed, self.storage_options)
            self._pending[ref] = ("pack", k)
        kept_files = sum(self.ranges[k][1] - self.ranges[k][0] for k in self.results)
        bar = progress_bar(total=len(self.scan.samples), initial=kept_files, unit="img", disable=not progress,
                           dynamic_ncols=True,
                           desc=f"pack {terminal_safe(self.scan.root.name)} ({len(self.ranges)} Ray tasks)")
        try:
            self._place_ready()
            while self._pending:
                [ref], _ = ray.wait(list(self._pending), num_returns=1)
                kind, k = self._pending.pop(ref)
                try:
                    value = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - Ray wraps the task's error; reported in one line
                    settle_after_failure(ray, list(self._pending), stop=True)
                    raise _failure(exc, self.target.destination, self.ranges, k, self.scan.samples, self.max_retries,
                                   self.target.after_failure) from None
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
            if k not in self.placed:
                ref = placer.remote(self.target.task_out(k), self.place_into, self._part_base, self._record_base,
                                    self.storage_options)
                self._pending[ref] = ("place", k)
            self._part_base += len(result["parts"])
            self._record_base += result["records"]
            self._next_place += 1
