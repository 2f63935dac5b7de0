"""``pack --engine ray`` to a folder on storage every node sees (a local disk for one machine, a shared
file system for a cluster): each task writes its range into its own folder under ``DEST.partial``
(``DEST.partial-tasks`` for an LMDB pack); the driver joins them there (shards renamed and
renumbered into place, or records copied into the LMDB file), writes the index and the manifest
last, and publishes by rename, as ``pack`` does. A failed run's leftovers are removed; a killed
driver's are kept for ``--resume``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import lmdb

from packload.core.format import (
    FIELDS_NAME,
    INDEX_NAME,
    MANIFEST_NAME,
    PARTIAL_SUFFIX,
    RAY_RUN_NAME,
    pack_size,
)
from packload.core.manifest import Manifest, encode_manifest, index_entry
from packload.packer.combine import ShardPayloads, ShardSource, copy_records
from packload.packer.destination import creation_error
from packload.packer.pack_destination import PackDestination
from packload.packer.pipeline import LMDB_MAP_PER_FILE
from packload.packer.ray_resume import kept_tasks, previous_run, write_run_record
from packload.packer.ray_task_folder import task_source
from packload.packer.ray_tasks import task_name
from packload.packer.write_lmdb import LmdbWriter
from packload.packer.write_shards import FieldsPart, fsync_dir, write_file_atomic, write_part_atomic


class LocalTarget:
    """A pack on this machine's file system (shared by every node): the tasks' folders under
    ``DEST.partial`` (``DEST.partial-tasks`` for an LMDB pack), joined there and published by
    rename; a failed run's leftovers are removed."""

    after_failure = "nothing was published; fix the cause (every node must see the source and destination " \
                    "folders) and pack again"
    fields: FieldsPart | None = None  # makes the fields part, of a pack made from a table

    def __init__(self, destination: PackDestination, backend: str) -> None:
        self.dst, self.backend, self.destination = destination.path, backend, str(destination.path)
        self.place = destination
        self.tmp = destination.partial
        self.staging = self.tmp if backend == "shards" else staging_path(self.dst)
        self.place_into = str(self.tmp.resolve()) if backend == "shards" else None

    def task_out(self, k: int) -> str:
        """Where task ``k`` writes its folder."""
        return str(self.staging.resolve() / task_name(k))

    def check(self, overwrite: bool) -> None:
        """Nothing more to check: ``PackDestination`` checked what is there when entered."""

    def previous(self, now: dict[str, Any], task_files: int | None, resume: bool, overwrite: bool,
                 root: str) -> dict[str, Any] | None:
        for leftover in dict.fromkeys((self.tmp, self.staging)):
            self.place.leftover(leftover)
        return previous_run(self.staging, self.tmp, now, task_files, resume, overwrite, Path(root))

    def begin(self, record: dict[str, Any]) -> None:
        try:
            self.staging.mkdir()
            write_run_record(self.staging, record)
        except OSError as exc:
            raise creation_error(self.staging, exc) from None

    def resume(self, ranges: list[tuple[int, int]]) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]]]:
        if self.backend == "lmdb":
            self.place.discard()  # a join the driver did not finish: done again
        return kept_tasks(self.staging, ranges, self.tmp if self.backend == "shards" else None)

    def sources(self, results: list[dict[str, Any]]) -> list[ShardSource]:
        return [task_source(self.staging / task_name(r["task"])) for r in results]

    def finish(self, sources: list[ShardSource], parts: list[dict[str, Any]], index: bytes,
               manifest: Manifest, files: int) -> None:
        if self.backend == "shards":
            _finish_shards(sources, parts, self.tmp, index, manifest, self.fields)
        else:
            join_lmdb(sources, self.tmp, files, manifest, self.fields)
            shutil.rmtree(self.staging)

    def discard(self) -> None:
        for leftover in dict.fromkeys((self.tmp, self.staging)):
            self.place.discard(leftover)

    def publish(self) -> int:
        self.place.publish()
        return pack_size(self.dst)


TASKS_SUFFIX = PARTIAL_SUFFIX + "-tasks"  # the tasks' folder of an LMDB pack, beside its unfinished file


def staging_path(dst: Path) -> Path:
    """Where the tasks of an LMDB pack write their ranges: ``DEST.partial-tasks``."""
    return dst.with_name(dst.name + TASKS_SUFFIX)


def _finish_shards(sources: list[ShardSource], parts: list[dict[str, Any]], tmp: Path, index: bytes,
                   manifest: Manifest, fields: FieldsPart | None = None) -> None:
    """With every shard in place: write the index, drop the task folders and the run record, and
    write the manifest last. (A driver killed before the manifest leaves a pack that resumes: a task
    folder already dropped is packed again, and its shards replace the same ones.)"""
    write_file_atomic(tmp / INDEX_NAME, index)
    if fields is not None:
        manifest.fields = write_part_atomic(tmp / FIELDS_NAME, fields)
    for source in sources:
        shutil.rmtree(source.folder)
    (tmp / RAY_RUN_NAME).unlink()
    manifest.parts, manifest.index = parts, index_entry(INDEX_NAME, index)
    write_file_atomic(tmp / MANIFEST_NAME, encode_manifest(manifest))
    fsync_dir(tmp)


def join_lmdb(sources: Iterable[ShardSource], tmp: Path, files: int, manifest: Manifest,
              fields: FieldsPart | None = None) -> None:
    """Copy every task's records, in order, into the LMDB file ``tmp`` (chunks as ``pack`` makes),
    then its index and ``manifest`` (updated with them). ``sources`` is read one after the other:
    it may fetch each task's shards as it comes (``packer.ray_url``)."""
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
        manifest.update(writer.finish(manifest, fields))
    finally:
        writer.close()
