"""Uploading packs to an object store: shards as they are finished (``ShardUploader``), and a finished
local pack (``upload_pack``, what ``merge`` to a URL and the Ray engine's LMDB destination do).

A shards pack is written locally into a staging folder, and every shard is uploaded as soon as it
is complete, then deleted there (``ShardUploader``: at most ``IN_FLIGHT`` shards wait, so the
staging folder holds a few shards, never the whole pack). Where the shards go, and how the pack is
put in place (the index after the last shard, the manifest **last**: a pack at a URL without
``manifest.json`` is visibly unfinished, and readers refuse it), is ``packer.url_destination``'s:
it checks the destination before anything is written, and removes nothing before the new pack is
ready. ``pack()`` to a URL is ``packer.pack_url``.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from packload.core.remote import RemoteStore, TransferBar
from packload.packer.url_destination import UrlDestination, prepare_destination

__all__ = ["IN_FLIGHT", "ShardUploader", "prepare_destination", "upload_pack"]

IN_FLIGHT = 2  # finished shards uploading (or waiting to) before the writer waits for the oldest


class ShardUploader:
    """Upload each finished shard it is given to ``store`` and delete the local file: a shard sink
    for ``ShardsWriter``. Uploads run on a thread of their own while the next shard is written; the
    first failure is raised by the next call (or by ``wait``)."""

    def __init__(self, store: RemoteStore, outbox: Path, in_flight: int = IN_FLIGHT,
                 uploaded: list[str] | None = None) -> None:
        """``outbox``: a local folder where shards wait for their upload (moved there at once, so
        the pack's own folder may be renamed meanwhile); ``uploaded``: the list each uploaded
        shard's name is added to (a new one by default)."""
        self.store = store
        self.outbox = outbox
        self.in_flight = in_flight
        self.uploaded: list[str] = [] if uploaded is None else uploaded
        self.given_bytes = 0  # bytes of every shard given so far (the writer's thread alone adds to it)
        self._sent: Callable[[int], None] | None = None  # told each shard's bytes once it is up (progress)
        self._done_bytes = 0  # bytes of the shards uploaded so far
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="packload-upload")
        self._pending: deque[Future[None]] = deque()
        self._lock = threading.Lock()

    def __call__(self, path: Path) -> None:
        while len(self._pending) >= self.in_flight:
            self._pending.popleft().result()
        waiting = self.outbox / path.name
        self.given_bytes += path.stat().st_size
        os.replace(path, waiting)
        self._pending.append(self._pool.submit(self._send, waiting))

    def _send(self, path: Path) -> None:
        size = path.stat().st_size
        self.store.upload(path, path.name)
        path.unlink()
        with self._lock:
            self._done_bytes += size
            self.uploaded.append(path.name)
            if self._sent is not None:
                self._sent(size)

    def follow(self, sent: Callable[[int], None]) -> None:
        """Tell ``sent`` the bytes of every shard uploaded so far, then each next shard's bytes once
        it is up: a bar of ``given_bytes`` ends full whenever it is attached (the count and the
        hand-over share one lock, so no shard is counted twice or missed)."""
        with self._lock:
            self._sent = sent
            sent(self._done_bytes)

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


def upload_pack(local: Path, url: str, overwrite: bool, storage_options: dict[str, Any] | None = None,
                progress: bool = False) -> None:
    """Put the finished local pack ``local`` (a shards folder or an LMDB file) at ``url``, by the
    destination's rules (``packer.url_destination``: checked first, an old pack there replaced only
    with ``overwrite`` and only once the new one is up, the manifest last); ``progress``: a bar of
    the megabytes uploaded."""
    destination = UrlDestination(url, overwrite, storage_options)
    destination.check()
    with TransferBar(f"upload {destination.name}", local_bytes(local), progress) as sent:
        destination.sent = sent
        if not local.is_dir():
            destination.publish_object(local)
            return
        destination.begin()
        try:
            destination.publish_shards(local)
        except BaseException:
            destination.abandon()
            raise


def local_bytes(path: Path) -> int:
    """Bytes of a local file, or of the files directly in a folder (a shards pack)."""
    if not path.is_dir():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())
