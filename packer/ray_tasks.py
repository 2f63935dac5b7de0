"""The Ray tasks of ``pack --engine ray``, run on any node of the cluster: ``pack_range`` packs one
range of the folder into a task folder (a small shards pack of its own), ``place_task`` moves a
finished task's shards into the pack, renumbered."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from packload.core.errors import UsageError
from packload.core.format import INDEX_NAME, MANIFEST_NAME, decode_index
from packload.core.manifest import build_manifest
from packload.core.scan import Sample
from packload.packer.combine import ShardSource, place_shards
from packload.packer.encode import EncodeOptions
from packload.packer.pipeline import encoded_stream, io_bound, write_or_skip
from packload.packer.write_shards import ShardsWriter

IO_THREADS = 2  # threads per task when encoding is reading and checking only


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

    for needed in (Path(root), folder.parent):
        if not needed.is_dir():
            raise UsageError(f"{needed}: not found on node {socket.gethostname()}; --engine ray needs the source "
                             "and the destination on storage every node sees, at the same path")

def pack_range(task: int, root: str, samples: list[Sample], first_pos: int, classes: list[str],
               options: EncodeOptions, out: str, shard_size: int, strict: bool, hashed: bool = True) -> dict[str, Any]:
    """One Ray task: pack ``samples`` (scan positions from ``first_pos``) into the shards pack
    ``out``, starting afresh (a retry overwrites a failed attempt); ``hashed=False`` leaves the
    shards' SHA-256 to be computed later. Returns its counts and times."""
    started, cpu_started = time.perf_counter(), time.process_time()
    folder = Path(out)
    check_shared(root, folder)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir()
    writer = (ShardsWriter if hashed else _UnhashedShardsWriter)(folder, shard_size)
    skipped: list[dict[str, Any]] = []
    source_bytes = 0
    # Reading and checking only (keep, fast check) waits on the disk with the GIL released: a few
    # threads keep one CPU busy, as in the local engine. Re-encoding stays on this task's one CPU.
    threads = IO_THREADS if io_bound(options) else 1
    try:
        for pos, item in enumerate(encoded_stream(Path(root), samples, 0, options, threads), first_pos):
            source_bytes += write_or_skip(item, pos, Path(root), writer, skipped, strict)
        encode_seconds = time.perf_counter() - started
        # A task folder is a small pack of its own (its manifest is replaced by the driver's).
        writer.finish(build_manifest(backend="shards", encoding=options.encoding, source={}, labelled=True,
                                     classes=classes, labels=writer.index.labels(),
                                     payload_bytes=writer.index.payload_bytes, skipped=skipped, ignored=[],
                                     options={}))
    finally:
        writer.close()
    return {"task": task, "records": writer.index.count, "parts": writer.parts, "skipped": skipped,
            "source_bytes": source_bytes, "payload_bytes": writer.index.payload_bytes,
            "seconds": time.perf_counter() - started, "encode_seconds": encode_seconds,
            "cpu_seconds": time.process_time() - cpu_started}

def place_task(folder: str, out: str, part_base: int, record_base: int) -> dict[str, Any]:
    """One Ray task: move a finished task's shards into the pack, renumbered (see ``place_shards``).
    Returns their manifest entries and the CPU time it took."""
    cpu_started = time.process_time()
    parts = place_shards(task_source(Path(folder)), Path(out), part_base, record_base, move=True)
    return {"parts": parts, "cpu_seconds": time.process_time() - cpu_started}

def task_source(folder: Path) -> ShardSource:
    import json

    manifest = json.loads((folder / MANIFEST_NAME).read_bytes())
    entries, paths = decode_index((folder / INDEX_NAME).read_bytes(), str(folder / INDEX_NAME))
    return ShardSource(folder, manifest["parts"], entries, paths)
