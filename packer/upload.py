"""Packing to an object store: ``pack ./images s3://bucket/train.shards``.

A shards pack is written locally into a staging folder, and every shard is uploaded as soon as it
is complete, then deleted there (``ShardUploader``: at most ``IN_FLIGHT`` shards wait, so the
staging folder holds a few shards, never the whole pack). The index follows the last shard, and
the manifest goes up **last**: a pack at a URL without ``manifest.json`` is visibly unfinished, and
readers refuse it, so a killed or failed pack never looks complete. An LMDB pack is written whole
in the staging folder and then uploaded as one object. Object stores have no rename, so
``--overwrite`` deletes the old pack's manifest first (it stops being a pack), then its other objects.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from packload.core.errors import UsageError
from packload.core.format import INDEX_NAME, MANIFEST_NAME, PROGRESS_NAME, shard_number
from packload.core.remote import RemoteStore, is_url
from packload.packer.pipeline import backend_for, pack

IN_FLIGHT = 2  # finished shards uploading (or waiting to) before the writer waits for the oldest


class ShardUploader:
    """Upload each finished shard it is given to ``store`` and delete the local file: a shard sink
    for ``ShardsWriter``. Uploads run on a thread of their own while the next shard is written; the
    first failure is raised by the next call (or by ``wait``)."""

    def __init__(self, store: RemoteStore, outbox: Path, in_flight: int = IN_FLIGHT) -> None:
        """``outbox``: a local folder where shards wait for their upload (moved there at once, so
        the pack's own folder may be renamed meanwhile)."""
        self.store = store
        self.outbox = outbox
        self.in_flight = in_flight
        self.uploaded: list[str] = []
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="packload-upload")
        self._pending: deque[Future[None]] = deque()
        self._lock = threading.Lock()

    def __call__(self, path: Path) -> None:
        while len(self._pending) >= self.in_flight:
            self._pending.popleft().result()
        waiting = self.outbox / path.name
        os.replace(path, waiting)
        self._pending.append(self._pool.submit(self._send, waiting))

    def _send(self, path: Path) -> None:
        self.store.upload(path, path.name)
        path.unlink()
        with self._lock:
            self.uploaded.append(path.name)

    def wait(self) -> None:
        """Return once every shard given is uploaded; raise the first upload's error."""
        try:
            while self._pending:
                self._pending.popleft().result()
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def abandon(self) -> None:
        """Stop: uploads not started are dropped, the running one finishes, errors are not raised."""
        self._pending.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)


def _is_pack_file(name: str) -> bool:
    return name in (MANIFEST_NAME, INDEX_NAME, PROGRESS_NAME) or shard_number(name) is not None


def prepare_destination(url: str, overwrite: bool, storage_options: dict[str, Any] | None = None) -> RemoteStore:
    """The store of a new pack at ``url``: its bucket must exist; a pack there is replaced only with
    ``overwrite`` (its manifest deleted first), and anything there that is not a pack never is."""
    store = RemoteStore(url, storage_options)
    store.check_bucket()
    kind = store.kind()
    if kind == "object":
        if not overwrite:
            raise UsageError(f"{url}: exists; add --overwrite to replace it")
        store.remove([""])
        return store
    listing = store.listing() if kind == "folder" else {}
    if not listing:
        return store
    strangers = sorted(name for name in listing if not _is_pack_file(name))
    if strangers:
        raise UsageError(f"{url}: holds objects that are not a pack's ({strangers[0]}, ...); choose another URL, "
                         "it is never overwritten")
    if not overwrite:
        what = "a pack" if MANIFEST_NAME in listing else "an unfinished pack"
        raise UsageError(f"{url}: {what} is there; add --overwrite to replace it")
    store.remove([MANIFEST_NAME])  # no longer a pack, before any of its parts goes
    store.remove(sorted(listing))
    return store


def publish_remote(store: RemoteStore, local: Path) -> None:
    """Upload the rest of the finished shards pack ``local``: any shard still there, the index, and
    the manifest last."""
    names = sorted(p.name for p in local.iterdir() if shard_number(p.name) is not None)
    for name in names:
        store.upload(local / name, name)
    store.upload(local / INDEX_NAME, INDEX_NAME)
    store.upload(local / MANIFEST_NAME, MANIFEST_NAME)


def upload_pack(local: Path, url: str, overwrite: bool, storage_options: dict[str, Any] | None = None) -> None:
    """Upload the finished local pack ``local`` (a shards folder or an LMDB file) to ``url``, the
    manifest last (what ``merge`` to a URL does with its result)."""
    store = prepare_destination(url, overwrite, storage_options)
    if local.is_dir():
        publish_remote(store, local)
    else:
        store.upload(local, "")


def pack_to_url(src: str | os.PathLike[str], url: str, *, overwrite: bool = False, resume: bool = False,
                backend: str | None = None, staging_dir: str | os.PathLike[str] | None = None,
                storage_options: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    """``packer.pipeline.pack`` into an object store at ``url`` (see the module's notes); the
    other ``options`` go to ``pack``. ``staging_dir``: where shards wait for their upload (default:
    the system's temporary folder)."""
    if not is_url(url):
        raise UsageError(f"{url}: not a URL")
    if resume:
        raise UsageError(f"{url}: --resume does not apply to a pack at a URL; pack again with --overwrite")
    name = url.rstrip("/").rsplit("/", 1)[-1]
    if not name or name.endswith(".partial"):
        raise UsageError(f"{url}: give the pack a name of its own, for example s3://bucket/train.shards")
    backend = backend_for(Path(name), backend)
    store = prepare_destination(url, overwrite, storage_options)
    with tempfile.TemporaryDirectory(prefix="packload-staging-", dir=staging_dir) as staging:
        local = Path(staging) / name
        if backend == "lmdb":
            summary = pack(src, local, backend=backend, **options)
            store.upload(local, "")
        else:
            outbox = Path(staging) / "outbox"
            outbox.mkdir()
            uploader = ShardUploader(store, outbox)
            try:
                summary = pack(src, local, backend=backend, shard_sink=uploader, **options)
            except BaseException:
                uploader.abandon()  # the error that stopped the pack is the one to report
                raise
            uploader.wait()
            publish_remote(store, local)
    summary.update(destination=url.rstrip("/"),
                   pack_bytes=store.size("") if backend == "lmdb" else sum(store.listing().values()))
    return summary
