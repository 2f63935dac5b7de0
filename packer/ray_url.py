"""``pack --engine ray`` to an object store: ``pack ./images s3://bucket/train.shards --engine ray``.

No node needs a shared disk. Each task packs its range into a local temporary folder and stages
it under ``DEST.partial/task-NNNNN/`` on the store, its done marker last; placement tasks put
each finished range's shards into ``DEST`` under their final names (``packer.ray_url_tasks``).
The run record ``ray-run.json`` sits in ``DEST.partial/`` as it does locally. Once every range is
placed, the driver writes the index, deletes the staging prefix (the run record last) and writes
the manifest last of all: a pack at a URL without ``manifest.json`` is unfinished, and readers
refuse it. A run that fails, or whose driver is killed, leaves what finished on the store (never a
manifest): ``--resume`` keeps the tasks whose done markers are there, as for a local pack.

Only a shards pack can be written so; an LMDB destination at a URL is refused in one line (pack it
with the local engine, which uploads the file whole). The store is reached with
``storage_options`` (which travel to the tasks in their arguments) or, on each node, the usual
environment variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...). Object stores have no
locks: two packs to the same URL at once are not prevented.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from packload.core.errors import UsageError
from packload.core.format import INDEX_NAME, MANIFEST_NAME, RAY_RUN_NAME, shard_number
from packload.core.manifest import encode_manifest
from packload.core.remote import RemoteStore
from packload.packer.combine import ShardSource
from packload.packer.destination import PARTIAL_SUFFIX
from packload.packer.pipeline import backend_for
from packload.packer.ray_resume import check_same_run
from packload.packer.ray_tasks import task_name
from packload.packer.ray_url_tasks import done_result_remote, placed_result_remote, remote_task_source

LMDB_REFUSED = ("--engine ray packs to a URL as a shards folder only; give the pack a name without .lmdb "
                "(for example s3://bucket/train.shards), or pack the LMDB file with --engine local, which "
                "uploads it whole")


class UrlTarget:
    """A shards pack at ``url`` written by Ray tasks through the staging prefix ``URL.partial/``:
    what the Ray engine's driver does with its destination (see the module's notes)."""

    backend = "shards"
    after_failure = ("what finished stays on the store (no manifest: not a pack); fix the cause and pack again "
                     "with --resume to keep it, or --overwrite to start over")

    def __init__(self, url: str, backend: str | None, storage_options: dict[str, Any] | None = None) -> None:
        self.destination = url.rstrip("/")
        name = self.destination.rsplit("/", 1)[-1]
        if "/" not in self.destination.split("://", 1)[-1] or not name or name.endswith(PARTIAL_SUFFIX):
            raise UsageError(f"{url}: give the pack a name of its own, for example s3://bucket/train.shards")
        if backend_for(Path(name), backend) == "lmdb":
            raise UsageError(f"{url}: {LMDB_REFUSED}")
        self.store = RemoteStore(self.destination, storage_options)
        self.staging = RemoteStore(self.destination + PARTIAL_SUFFIX, storage_options)
        self.place_into: str | None = self.destination

    def task_out(self, k: int) -> str:
        """Where task ``k`` stages its folder."""
        return self.staging.url_of(task_name(k))

    def _task_store(self, k: int) -> RemoteStore:
        return RemoteStore(self.task_out(k), self.staging.storage_options)

    def check(self, overwrite: bool) -> None:
        """Before the scan: the bucket exists, nothing but a pack is at the URL, and a finished pack
        there is replaced only with ``overwrite``."""
        self.store.check_bucket()
        if self.store.kind() == "object":
            raise UsageError(f"{self.destination}: an object (not a shards pack) is stored there; choose another "
                             "URL, or delete it first")
        listing = self.store.listing()
        strangers = sorted(name for name in listing if name not in (MANIFEST_NAME, INDEX_NAME)
                           and shard_number(name) is None)
        if strangers:
            raise UsageError(f"{self.destination}: holds objects that are not a pack's ({strangers[0]}, ...); "
                             "choose another URL, it is never overwritten")
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
        if not dest and not staged:
            return None
        if not resume:
            if not overwrite:
                raise UsageError(f"{self.destination}: an unfinished pack is there; add --resume to finish it, "
                                 "or --overwrite to start over")
            self._clear(dest, staged)
            return None
        if RAY_RUN_NAME not in staged:  # stopped before its tasks started, or not a Ray pack's: nothing to keep
            self._clear(dest, staged)
            return None
        try:
            before = json.loads(self.staging.read_object(RAY_RUN_NAME))
        except ValueError as exc:
            raise UsageError(f"{self.staging.url_of(RAY_RUN_NAME)}: cannot be read ({exc}); start over with "
                             "--overwrite") from None
        check_same_run(before, now, task_files, root)
        return before

    def _clear(self, dest: dict[str, int], staged: dict[str, int]) -> None:
        self.store.remove([MANIFEST_NAME] if MANIFEST_NAME in dest else [])  # no longer a pack, first
        self.store.remove(sorted(dest))
        self.staging.remove(sorted(name for name in staged if name != RAY_RUN_NAME))
        self.staging.remove([RAY_RUN_NAME] if RAY_RUN_NAME in staged else [])

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
               manifest: dict[str, Any], files: int) -> None:
        """With every shard in place: the index, then the staging prefix deleted (the run record
        last), then the manifest, last of all."""
        self.store.write_bytes(INDEX_NAME, index)
        staged = self.staging.listing_all()
        self.staging.remove(sorted(name for name in staged if name != RAY_RUN_NAME))
        self.staging.remove([RAY_RUN_NAME])
        manifest.update(parts=parts, index={"name": INDEX_NAME, "size": len(index),
                                            "sha256": hashlib.sha256(index).hexdigest()})
        self.store.write_bytes(MANIFEST_NAME, encode_manifest(manifest))

    def discard(self) -> None:
        """After a failed run: nothing to do, what finished stays for ``--resume`` (see ``after_failure``)."""

    def publish(self) -> int:
        """The pack is complete once its manifest is written: its size on the store."""
        return sum(self.store.listing().values())
