"""The Ray tasks of ``pack --engine ray`` to a URL, and what they leave on the store.

A pack task writes its range into a local temporary folder on its own node (``pack_range``), then
uploads that task folder into the destination's staging prefix, ``DEST.partial/task-NNNNN/``, its
done marker last (``stage_task``). A placement task (``place_task_remote``) puts a finished task's
shards into the pack at ``DEST`` under their final names: a pack's shards are called
``shard-NNNNN.bin`` and hold their part number and every record's number, so each range but the
first is fetched, renumbered on the node (``place_shards``) and uploaded; the first range needs no
change and is copied by the store itself (server-side copy). Its placed marker follows. The driver
reads the markers back (``done_result_remote``, ``placed_result_remote``) to decide, on
``--resume``, which tasks are kept.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from packload.core.format import INDEX_NAME, MANIFEST_NAME, TASK_DONE_NAME, TASK_PLACED_NAME, shard_name
from packload.core.remote import RemoteMissingError, RemoteStore
from packload.packer.combine import ShardSource, place_shards
from packload.packer.ray_task_folder import task_source


def stage_task(folder: Path, store: RemoteStore) -> None:
    """Upload the finished local task folder ``folder`` to ``store`` (its staging prefix), replacing
    whatever a failed attempt left there; the done marker goes last."""
    store.remove(sorted(store.listing()))
    names = sorted(name for name in os.listdir(folder) if name != TASK_DONE_NAME)
    for name in names + [TASK_DONE_NAME]:
        store.upload(folder / name, name)


def _task_source_remote(store: RemoteStore, folder: Path) -> ShardSource:
    """The staged task's index and manifest, downloaded into ``folder``, as a ``ShardSource`` whose
    shards are to be fetched into ``folder`` too."""
    for name in (INDEX_NAME, MANIFEST_NAME):
        (folder / name).write_bytes(store.read_object(name))
    return task_source(folder)


def fetch_shards(store: RemoteStore, source: ShardSource, folder: Path) -> ShardSource:
    """Download the shards of the staged task ``source`` (at ``store``) into the local ``folder``:
    the same source, its shards read from there."""
    for part in source.parts:
        fd = os.open(folder / part["name"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            store.download(part["name"], int(part["size"]), fd)
        finally:
            os.close(fd)
    return dataclasses.replace(source, folder=folder)


def remote_task_source(store: RemoteStore) -> ShardSource:
    """A staged task's index and manifest (its shards stay on the store): what the driver joins."""
    with tempfile.TemporaryDirectory(prefix="packload-task-") as tmp:
        return _task_source_remote(store, Path(tmp))


def done_result_remote(store: RemoteStore, task: int, span: tuple[int, int]) -> dict[str, Any] | None:
    """The result a finished task staged at ``store`` for ``task`` over the files ``span``; None when
    it did not finish (no marker, or a file missing, of another size or checksum)."""
    try:
        listing = store.listing()
        if TASK_DONE_NAME not in listing:
            return None
        marker = json.loads(store.read_object(TASK_DONE_NAME))
        if marker.get("task") != task or marker.get("range") != list(span):
            return None
        files = marker.pop("files")
        if any(listing.get(part["name"]) != files[part["name"]]["size"] for part in marker["parts"]):
            return None
        for name in (INDEX_NAME, MANIFEST_NAME):
            if listing.get(name) != files[name]["size"]:
                return None
            if hashlib.sha256(store.read_object(name)).hexdigest() != files[name]["sha256"]:
                return None
    except (RemoteMissingError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return marker


def place_task_remote(task_url: str, out_url: str, part_base: int, record_base: int,
                      storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """One Ray task: put the shards staged at ``task_url`` into the pack at ``out_url`` as parts
    from ``part_base`` holding records from ``record_base`` on, then write the placed marker.
    Returns their manifest entries and the CPU time it took."""
    cpu_started = time.process_time()
    staged, out = RemoteStore(task_url, storage_options), RemoteStore(out_url, storage_options)
    with tempfile.TemporaryDirectory(prefix="packload-place-") as tmp:
        folder, placed_dir = Path(tmp) / "task", Path(tmp) / "placed"
        folder.mkdir()
        placed_dir.mkdir()
        source = _task_source_remote(staged, folder)
        if part_base == 0 and record_base == 0 and all(part.get("sha256") for part in source.parts):
            for k, part in enumerate(source.parts):  # nothing in them changes: the store copies them
                staged.copy_to(part["name"], out, shard_name(k))
            parts = [{"name": shard_name(k), "records": int(part["records"]), "sha256": part["sha256"],
                      "size": int(part["size"])} for k, part in enumerate(source.parts)]
        else:
            parts = place_shards(fetch_shards(staged, source, folder), placed_dir, part_base, record_base, move=True)
            for part in parts:
                out.upload(placed_dir / part["name"], part["name"])
    placed = {"parts": parts, "part_base": part_base, "record_base": record_base,
              "cpu_seconds": time.process_time() - cpu_started}
    staged.write_bytes(TASK_PLACED_NAME, json.dumps(placed).encode("utf-8"))
    return placed


def placed_result_remote(store: RemoteStore, out_listing: dict[str, int], part_base: int,
                         record_base: int) -> dict[str, Any] | None:
    """What a finished ``place_task_remote`` left for the task staged at ``store`` at these bases;
    None when it did not finish or a shard it placed is missing from the pack (``out_listing``:
    name -> size) or of another size."""
    try:
        placed = json.loads(store.read_object(TASK_PLACED_NAME))
        if placed["part_base"] != part_base or placed["record_base"] != record_base:
            return None
        if any(out_listing.get(part["name"]) != part["size"] for part in placed["parts"]):
            return None
    except (RemoteMissingError, ValueError, KeyError, TypeError):
        return None
    return placed
