"""``pack --engine ray`` to an object store: ``pack ./images s3://bucket/train.shards --engine ray``.

No node needs a shared disk. Each task packs its range into a local temporary folder and stages
it under ``DEST.partial/task-NNNNN/`` on the store, its done marker last; placement tasks put
each finished range's shards into ``DEST`` under their final names (``packer.ray_url_tasks``).
The run record ``ray-run.json`` sits in ``DEST.partial/`` as it does locally. Once every range is
placed, the driver writes the index, deletes the staging prefix (the run record last) and writes
the manifest last of all: a pack at a URL without ``manifest.json`` is unfinished, and readers
refuse it. A run that fails, or whose driver is killed, leaves what finished on the store (never a
manifest): ``--resume`` keeps the tasks whose done markers are there, as for a local pack.

An ``.lmdb`` URL is one object: the tasks stage their ranges as shards under
``DEST.partial-tasks/task-NNNNN/`` the same way (no placement), and the driver fetches them one
task after the other, joins their records into an LMDB file in a local temporary folder (as it
joins a local LMDB pack, ``ray_folder.join_lmdb``; the driver needs room for the whole file) and
uploads it as ``pack --engine local`` uploads an LMDB pack (``upload.upload_pack``: one object,
whole or not at all, its manifest inside), then deletes the staging prefix, the run record last.
The store is reached with
``storage_options`` (which travel to the tasks in their arguments) or, on each node, the usual
environment variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...). Object stores have no
locks: two packs to the same URL at once are not prevented.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from packload.core.errors import UsageError
from packload.core.format import FIELDS_NAME, INDEX_NAME, MANIFEST_NAME, PARTIAL_SUFFIX, RAY_RUN_NAME
from packload.core.manifest import Manifest, encode_manifest, index_entry
from packload.core.remote import RemoteStore
from packload.packer.combine import ShardSource
from packload.packer.pipeline import backend_for
from packload.packer.ray_folder import TASKS_SUFFIX, join_lmdb
from packload.packer.ray_resume import check_same_run
from packload.packer.ray_tasks import task_name
from packload.packer.ray_url_tasks import (
    done_result_remote,
    fetch_shards,
    placed_result_remote,
    remote_task_source,
)
from packload.packer.upload import prepare_destination, upload_pack
from packload.packer.url_destination import inspect
from packload.packer.write_shards import FieldsPart


def check_pack_url(url: str) -> str:
    """``url`` without a trailing ``/``, refusing in one line a URL that gives the pack no name of
    its own (a bucket, or an unfinished pack's staging prefix)."""
    destination = url.rstrip("/")
    name = destination.rsplit("/", 1)[-1]
    if "/" not in destination.split("://", 1)[-1] or not name or name.endswith((PARTIAL_SUFFIX, TASKS_SUFFIX)):
        raise UsageError(f"{url}: give the pack a name of its own, for example s3://bucket/train.shards")
    return destination


def url_target(url: str, backend: str | None, storage_options: dict[str, Any] | None = None
               ) -> UrlTarget | UrlLmdbTarget:
    """The Ray engine's destination at ``url``: a shards pack, or an LMDB file for an ``.lmdb``
    name (or ``backend="lmdb"``)."""
    name = check_pack_url(url).rsplit("/", 1)[-1]
    if backend_for(Path(name), backend) == "lmdb":
        return UrlLmdbTarget(url, storage_options)
    return UrlTarget(url, storage_options)


def clear_staging(staging: RemoteStore, staged: dict[str, int]) -> None:
    """Delete what a run staged (``staged``: its listing), the run record last."""
    staging.remove(sorted(name for name in staged if name != RAY_RUN_NAME))
    staging.remove([RAY_RUN_NAME] if RAY_RUN_NAME in staged else [])


def resumable_run(destination: str, staging: RemoteStore, staged: dict[str, int], unfinished: bool,
                  now: dict[str, Any], task_files: int | None, resume: bool, overwrite: bool, root: str,
                  clear: Callable[[], None]) -> dict[str, Any] | None:
    """The run record staged to resume, or None to start afresh (after ``clear``, which deletes what
    an older run left); ``unfinished``: an unfinished pack is there besides ``staged``. As
    ``ray_resume.previous_run`` decides for a local pack."""
    if not staged and not unfinished:
        return None
    if not resume:
        if not overwrite:
            raise UsageError(f"{destination}: an unfinished pack is there; add --resume to finish it, "
                             "or --overwrite to start over")
        clear()
        return None
    if RAY_RUN_NAME not in staged:  # stopped before its tasks started, or not a Ray pack's: nothing to keep
        clear()
        return None
    try:
        before = json.loads(staging.read_object(RAY_RUN_NAME))
    except ValueError as exc:
        raise UsageError(f"{staging.url_of(RAY_RUN_NAME)}: cannot be read ({exc}); start over with "
                         "--overwrite") from None
    check_same_run(before, now, task_files, root)
    return before


class UrlTarget:
    """A shards pack at ``url`` written by Ray tasks through the staging prefix ``URL.partial/``:
    what the Ray engine's driver does with its destination (see the module's notes)."""

    backend = "shards"
    after_failure = ("what finished stays on the store (no manifest: not a pack); fix the cause and pack again "
                     "with --resume to keep it, or --overwrite to start over")
    fields: FieldsPart | None = None  # makes the fields part, of a pack made from a table

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.destination = check_pack_url(url)
        self.store = RemoteStore(self.destination, storage_options)
        self.staging = RemoteStore(self.destination + PARTIAL_SUFFIX, storage_options)
        self.place_into: str | None = self.destination

    def task_out(self, k: int) -> str:
        """Where task ``k`` stages its folder."""
        return self.staging.url_of(task_name(k))

    def _task_store(self, k: int) -> RemoteStore:
        return RemoteStore(self.task_out(k), self.staging.storage_options)

    def check(self, overwrite: bool) -> None:
        """Before the scan: the bucket exists, nothing but a pack of ours is at the URL (the rules of
        ``packer.url_destination``), and a finished pack there is replaced only with ``overwrite``."""
        self.store.check_bucket()
        found = inspect(self.store)  # anything not packload's there is refused, with or without overwrite
        if found.is_object:
            raise UsageError(f"{self.store.shown}: an object (not a shards pack) is stored there; choose another "
                             "URL, or delete it first")
        listing = found.listing
        if MANIFEST_NAME in listing and not overwrite:
            raise UsageError(f"{self.destination}: exists; add --overwrite to replace it")

    def previous(self, now: dict[str, Any], task_files: int | None, resume: bool, overwrite: bool,
                 root: str) -> dict[str, Any] | None:
        """The run record to resume, or None to start afresh (what an older pack or run left is
        deleted then); as ``ray_resume.previous_run`` decides for a local pack."""
        dest, staged = self.store.listing(), self.staging.listing_all()
        if MANIFEST_NAME in dest:  # a finished pack, to replace (``check`` saw --overwrite)
            self._clear(dest, staged)
            return None
        return resumable_run(self.destination, self.staging, staged, bool(dest), now, task_files, resume, overwrite,
                             root, lambda: self._clear(dest, staged))

    def _clear(self, dest: dict[str, int], staged: dict[str, int]) -> None:
        self.store.remove([MANIFEST_NAME] if MANIFEST_NAME in dest else [])  # no longer a pack, first
        self.store.remove(sorted(dest))
        clear_staging(self.staging, staged)

    def begin(self, record: dict[str, Any]) -> None:
        self.staging.write_bytes(RAY_RUN_NAME, json.dumps(record).encode("utf-8"))

    def resume(self, ranges: list[tuple[int, int]]) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]]]:
        """The tasks that finished before (by their done markers on the store) and the placements
        that finished (by theirs, with their shards in the pack), by task number."""
        results: dict[int, dict[str, Any]] = {}
        placed: dict[int, dict[str, Any]] = {}
        dest = self.store.listing()
        part_base = record_base = 0
        in_order = True  # only the ranges before the first unfinished one can have been placed
        for k, span in enumerate(ranges):
            result = done_result_remote(self._task_store(k), k, span)
            if result is None:
                in_order = False
                continue
            results[k] = result
            if in_order:
                done = placed_result_remote(self._task_store(k), dest, part_base, record_base)
                if done is not None:
                    placed[k] = done
            part_base += len(result["parts"])
            record_base += result["records"]
        return results, placed

    def sources(self, results: list[dict[str, Any]]) -> list[ShardSource]:
        return [remote_task_source(self._task_store(r["task"])) for r in results]

    def finish(self, sources: list[ShardSource], parts: list[dict[str, Any]], index: bytes,
               manifest: Manifest, files: int) -> None:
        """With every shard in place: the index, then the staging prefix deleted (the run record
        last), then the manifest, last of all."""
        self.store.write_bytes(INDEX_NAME, index)
        if self.fields is not None:
            data = bytearray()
            manifest.fields = self.fields(data.extend)
            self.store.write_bytes(FIELDS_NAME, bytes(data))
        clear_staging(self.staging, self.staging.listing_all())
        manifest.parts, manifest.index = parts, index_entry(INDEX_NAME, index)
        self.store.write_bytes(MANIFEST_NAME, encode_manifest(manifest))

    def discard(self) -> None:
        """After a failed run: nothing to do, what finished stays for ``--resume`` (see ``after_failure``)."""

    def publish(self) -> int:
        """The pack is complete once its manifest is written: its size on the store."""
        return sum(self.store.listing().values())


class UrlLmdbTarget:
    """An LMDB pack at ``url`` (one object) written by Ray tasks through the staging prefix
    ``URL.partial-tasks/``, joined and uploaded by the driver (see the module's notes)."""

    backend = "lmdb"
    after_failure = UrlTarget.after_failure
    place_into: str | None = None  # the tasks' shards are joined by the driver, not placed
    fields: FieldsPart | None = None  # makes the fields part, of a pack made from a table

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.destination = check_pack_url(url)
        self.storage_options = storage_options
        self.store = RemoteStore(self.destination, storage_options)
        self.staging = RemoteStore(self.destination + TASKS_SUFFIX, storage_options)
        self.overwrite = False  # what ``check`` allowed: the upload replaces an old pack only then

    def task_out(self, k: int) -> str:
        """Where task ``k`` stages its folder."""
        return self.staging.url_of(task_name(k))

    def _task_store(self, k: int) -> RemoteStore:
        return RemoteStore(self.task_out(k), self.storage_options)

    def check(self, overwrite: bool) -> None:
        """Before the scan, as ``pack --engine local`` to a URL: the bucket exists; a pack there is
        replaced only with ``overwrite`` (once the new one is uploaded), anything else there never is."""
        prepare_destination(self.destination, overwrite, self.storage_options)
        self.overwrite = overwrite

    def previous(self, now: dict[str, Any], task_files: int | None, resume: bool, overwrite: bool,
                 root: str) -> dict[str, Any] | None:
        """The run record to resume, or None to start afresh (what an older run staged is deleted then)."""
        staged = self.staging.listing_all()
        return resumable_run(self.destination, self.staging, staged, False, now, task_files, resume, overwrite,
                             root, lambda: clear_staging(self.staging, staged))

    def begin(self, record: dict[str, Any]) -> None:
        self.staging.write_bytes(RAY_RUN_NAME, json.dumps(record).encode("utf-8"))

    def resume(self, ranges: list[tuple[int, int]]) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]]]:
        """The tasks that finished before, by their done markers on the store (nothing is placed)."""
        results = {k: done_result_remote(self._task_store(k), k, span) for k, span in enumerate(ranges)}
        return {k: result for k, result in results.items() if result is not None}, {}

    def sources(self, results: list[dict[str, Any]]) -> list[ShardSource]:
        return [remote_task_source(self._task_store(r["task"])) for r in results]

    def finish(self, sources: list[ShardSource], parts: list[dict[str, Any]], index: bytes,
               manifest: Manifest, files: int) -> None:
        """Join the tasks' records (``sources``, task by task) into a local LMDB file, upload it
        whole, then delete the staging prefix (the run record last)."""
        name = self.destination.rsplit("/", 1)[-1]
        with tempfile.TemporaryDirectory(prefix="packload-staging-") as tmp:
            local = Path(tmp) / name
            join_lmdb(self._fetched(sources, Path(tmp)), local, files, manifest, self.fields)
            upload_pack(local, self.destination, self.overwrite, self.storage_options)
        clear_staging(self.staging, self.staging.listing_all())

    def _fetched(self, sources: list[ShardSource], tmp: Path) -> Iterator[ShardSource]:
        """Each task's source with its shards fetched into ``tmp``, deleted once the next is wanted:
        the local disk holds one task's shards at a time, besides the LMDB file."""
        for k, source in enumerate(sources):
            folder = tmp / task_name(k)
            folder.mkdir()
            yield fetch_shards(self._task_store(k), source, folder)
            shutil.rmtree(folder)

    def discard(self) -> None:
        """After a failed run: nothing to do, what finished stays for ``--resume`` (see ``after_failure``)."""

    def publish(self) -> int:
        """The pack is complete once its object is uploaded: its size on the store."""
        return self.store.size("")
