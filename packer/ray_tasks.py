"""The Ray tasks of ``pack --engine ray``, run on any node of the cluster: ``pack_range`` packs one
range of the folder into a task folder (a small shards pack of its own), ``place_task`` moves a
finished task's shards into the pack, renumbered.

Each writes a marker last, so that ``pack --engine ray --resume`` can tell a finished task from a
torn one: ``task-done.json`` once the task folder is complete (the task's result, the sizes of its
files and the SHA-256 of its index and manifest), ``task-placed.json`` once its shards are in the
pack. A task reads its source files in ``read_range`` only and writes its outputs in
``write_range`` only. The source may be a URL (objects fetched, ``packer.remote_source``), and so
may the task folder: the task then packs into a local temporary folder and stages it on the store
(``packer.ray_url_tasks``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from packload.core.errors import UsageError
from packload.core.format import (
    INDEX_NAME,
    MANIFEST_NAME,
    TASK_DONE_NAME,
    TASK_PLACED_NAME,
    shard_name,
)
from packload.core.manifest import build_manifest
from packload.core.remote import RemoteStore, is_url
from packload.core.scan import Sample
from packload.packer.combine import place_shards
from packload.packer.encode import Encoded, EncodeOptions, Skipped
from packload.packer.encode_stream import encoded_stream, io_bound
from packload.packer.pipeline import write_or_skip
from packload.packer.ray_task_folder import task_source
from packload.packer.ray_url_tasks import place_task_remote, stage_task
from packload.packer.remote_source import fetched_stream
from packload.packer.write_shards import ShardsWriter, fsync_dir, write_file_atomic

IO_THREADS = 2  # threads per task when encoding is reading and checking only
SETTLE_S = 30  # how long a failed run waits for its other tasks to end


def task_name(k: int) -> str:
    return f"task-{k:05d}"


class _NoDigest:
    """Stands in for SHA-256 while writing shards that are hashed again once renumbered."""

    def update(self, data: bytes) -> None:
        pass

    def hexdigest(self) -> str:
        return ""  # place_shards hashes a shard whose digest is unknown


class _UnhashedShardsWriter(ShardsWriter):
    """A ``ShardsWriter`` that skips hashing: the shards of every range but the first get new part
    and record numbers, so their final SHA-256 is computed then (``place_shards``)."""

    def _open_part(self, part: int) -> None:
        super()._open_part(part)
        self._file.digest = _NoDigest()


def check_shared(root: str, folder: Path) -> None:
    """Refuse at once (no retries) a node that does not see the source or the destination."""
    import socket

    for needed in ([] if is_url(root) else [Path(root)]) + [folder.parent]:
        if not needed.is_dir():
            raise UsageError(f"{needed}: not found on node {socket.gethostname()}; --engine ray needs the source "
                             "and the destination on storage every node sees, at the same path")


def node_id() -> str | None:
    """The Ray node this task runs on (None when called outside Ray: asking would start Ray)."""
    try:
        import ray
    except ImportError:
        return None
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def settle_after_failure(ray: Any, refs: list[Any], stop: bool) -> None:
    """Let the other tasks of a run that has failed end before the failure is raised (at most
    ``SETTLE_S``), asking those not yet done to stop first when ``stop``. The cancel is never forced
    and never sent to a task that has ended: a cancel that crosses a task's reply trips a check in
    Ray's core worker that ends the driver's process outright (exit 1), so the user would see no
    error at all. A task Ray is asked to stop gently answers through its own reply."""
    if not refs:
        return
    _, running = ray.wait(refs, num_returns=len(refs), timeout=0)
    if stop:
        for ref in running:
            ray.cancel(ref, force=False)
    if running:
        ray.wait(running, num_returns=len(running), timeout=SETTLE_S)


def read_range(root: str, samples: list[Sample], options: EncodeOptions,
               storage_options: dict[str, Any] | None = None) -> Iterator[Encoded | Skipped]:
    """Every file of ``samples`` under ``root`` (a folder, or a URL: objects fetched), read,
    checked and encoded in order: the one place a task reads its source."""
    if is_url(root):
        return fetched_stream(root, samples, options, storage_options)
    # Reading and checking only (keep, fast check) waits on the disk with the GIL released: a few
    # threads keep one CPU busy, as in the local engine. Re-encoding stays on this task's one CPU.
    threads = IO_THREADS if io_bound(options) else 1
    return encoded_stream(Path(root), samples, 0, options, threads)


def write_range(items: Iterator[Encoded | Skipped], root: str, first_pos: int, classes: list[str],
                options: EncodeOptions, folder: Path, shard_size: int, strict: bool, hashed: bool) -> dict[str, Any]:
    """Write ``items`` (scan positions from ``first_pos``) as the shards pack ``folder``, then its
    done marker: the one place a task writes its outputs. Returns the counts for the result."""
    writer = (ShardsWriter if hashed else _UnhashedShardsWriter)(folder, shard_size)
    skipped: list[dict[str, Any]] = []
    source_bytes = 0
    try:
        for pos, item in enumerate(items, first_pos):
            source_bytes += write_or_skip(item, pos, root, writer, skipped, strict)
        # A task folder is a small pack of its own (its manifest is replaced by the driver's).
        writer.finish(build_manifest(backend="shards", encoding=options.encoding, source={}, labelled=True,
                                     classes=classes, labels=writer.index.labels(),
                                     payload_bytes=writer.index.payload_bytes, skipped=skipped, ignored=[],
                                     options={}))
    finally:
        writer.close()
    return {"records": writer.index.count, "parts": writer.parts, "skipped": skipped,
            "source_bytes": source_bytes, "payload_bytes": writer.index.payload_bytes}


def pack_range(task: int, root: str, samples: list[Sample], first_pos: int, classes: list[str],
               options: EncodeOptions, out: str, shard_size: int, strict: bool, hashed: bool = True,
               storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """One Ray task: pack ``samples`` (scan positions from ``first_pos``) into the shards pack
    ``out``, starting afresh (a retry overwrites a failed attempt); ``hashed=False`` leaves the
    shards' SHA-256 to be computed later. Writes the done marker last; returns the result it holds.
    ``out`` may be a URL: the task folder is written locally, then staged there (marker last);
    ``storage_options`` open the store of a URL ``root`` or ``out``."""
    if is_url(out):
        with tempfile.TemporaryDirectory(prefix="packload-task-") as tmp:
            folder = Path(tmp) / task_name(task)
            result = pack_range(task, root, samples, first_pos, classes, options, str(folder), shard_size, strict,
                                hashed, storage_options)
            stage_task(folder, RemoteStore(out, storage_options))
        return result
    started, cpu_started = time.perf_counter(), time.process_time()
    folder = Path(out)
    check_shared(root, folder)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir()
    counts = write_range(read_range(root, samples, options, storage_options), root, first_pos, classes, options, folder,
                         shard_size, strict, hashed)
    result = {"task": task, "range": [first_pos, first_pos + len(samples)], **counts, "node": node_id(),
              "seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu_started}
    files = {part["name"]: {"size": part["size"]} for part in counts["parts"]}
    for name in (INDEX_NAME, MANIFEST_NAME):
        data = (folder / name).read_bytes()
        files[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    write_file_atomic(folder / TASK_DONE_NAME, json.dumps({**result, "files": files}).encode("utf-8"))
    fsync_dir(folder)
    return result


def done_result(folder: Path, task: int, span: tuple[int, int], placed_into: Path | None = None,
                part_base: int = 0) -> dict[str, Any] | None:
    """The result a finished ``pack_range`` left in ``folder`` for ``task`` over the files ``span``;
    None when it did not finish (no marker, or a file missing, of another size or checksum). With
    ``placed_into``, a shard that an interrupted placement already moved counts when it is there,
    under its new name (parts from ``part_base``), with its size."""
    try:
        marker = json.loads((folder / TASK_DONE_NAME).read_bytes())
        if marker.get("task") != task or marker.get("range") != list(span):
            return None
        files = marker.pop("files")
        for j, part in enumerate(marker["parts"]):
            path = folder / part["name"]
            if not path.exists() and placed_into is not None:
                path = placed_into / shard_name(part_base + j)
            if path.stat().st_size != files[part["name"]]["size"]:
                return None
        for name in (INDEX_NAME, MANIFEST_NAME):
            data = (folder / name).read_bytes()
            if len(data) != files[name]["size"] or hashlib.sha256(data).hexdigest() != files[name]["sha256"]:
                return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return marker


def place_task(folder: str, out: str, part_base: int, record_base: int,
               storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """One Ray task: move a finished task's shards into the pack, renumbered (see ``place_shards``),
    then write the placed marker. Returns their manifest entries and the CPU time it took. With a
    URL ``folder`` (a staged task), the pack ``out`` is a URL too (``place_task_remote``)."""
    if is_url(folder):
        return place_task_remote(folder, out, part_base, record_base, storage_options)
    cpu_started = time.process_time()
    parts = place_shards(task_source(Path(folder)), Path(out), part_base, record_base, move=True)
    fsync_dir(Path(out))
    placed = {"parts": parts, "part_base": part_base, "record_base": record_base,
              "cpu_seconds": time.process_time() - cpu_started}
    write_file_atomic(Path(folder) / TASK_PLACED_NAME, json.dumps(placed).encode("utf-8"))
    return placed


def placed_result(folder: Path, out: Path, part_base: int, record_base: int) -> dict[str, Any] | None:
    """What a finished ``place_task`` left for the task folder ``folder`` at these bases; None when
    it did not finish or a shard it placed is missing from ``out`` or of another size."""
    try:
        placed = json.loads((folder / TASK_PLACED_NAME).read_bytes())
        if placed["part_base"] != part_base or placed["record_base"] != record_base:
            return None
        if any((out / part["name"]).stat().st_size != part["size"] for part in placed["parts"]):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return placed
