"""``pack ./images s3://bucket/train.shards``: a pack written to an object store.

``pipeline.pack`` hands a URL destination here, with itself as ``local_pack`` (this module never
imports the pipeline: the URL is dispatched in one place, and the imports go one way). The order:

1. the source folder is looked at first (a missing or unreadable source is refused before the
   destination is even read);
2. the destination is checked, reading only (``packer.url_destination``): anything there that is
   not a pack of ours is refused, a pack needs ``--overwrite``;
3. the pack is written locally into a staging folder (the system's temporary folder, or
   ``staging_dir``): a shards pack's shards are uploaded as each is finished (to the destination,
   or to ``DEST.partial/`` while an old pack is there) and deleted locally; an LMDB pack is written
   whole;
4. once it is complete, it is published: the old pack (if any) replaced, the manifest last.

A pack that fails removes what it uploaded; the old pack is untouched, and a rerun of the same
command simply starts again (the local engine cannot resume a pack at a URL).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packload.core.errors import UsageError
from packload.core.remote import TransferBar, is_url
from packload.core.scan import list_top
from packload.core.urls import display_url
from packload.packer.upload import ShardUploader, local_bytes
from packload.packer.url_destination import UrlDestination


def pack_to_url(src: str | os.PathLike[str], url: str, *, local_pack: Callable[..., dict[str, Any]], backend: str,
                overwrite: bool = False, resume: bool = False, staging_dir: str | os.PathLike[str] | None = None,
                storage_options: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    """Pack ``src`` into ``url`` (see the module's notes) with ``local_pack`` (``pipeline.pack``,
    given ``options``) into a local staging folder; returns its summary, the destination and the
    bytes on the store in it."""
    started = time.perf_counter()
    if not is_url(url):
        raise UsageError(f"{url}: not a URL")
    if resume:
        raise UsageError(f"{display_url(url)}: --resume does not apply to a pack at a URL with --engine local; "
                         "pack again (what an interrupted pack left there is replaced)")
    destination = UrlDestination(url, overwrite, storage_options)
    list_top(src)  # the source first: nothing at the destination is looked at for a typo'd source
    destination.check()
    with tempfile.TemporaryDirectory(prefix="packload-staging-", dir=staging_dir) as staging:
        local = Path(staging) / destination.name
        if backend == "lmdb":
            summary = local_pack(src, local, backend=backend, **options)
            with TransferBar(f"upload {destination.name}", local_bytes(local), options.get("progress", True)) as sent:
                destination.sent = sent
                destination.publish_object(local)
        else:
            summary = _pack_shards(src, local, destination, local_pack, backend, options)
    summary.update(destination=destination.shown, pack_bytes=destination.size(backend))
    return whole_command_rates(summary, time.perf_counter() - started)


def whole_command_rates(summary: dict[str, Any], seconds: float) -> dict[str, Any]:
    """``summary`` with its time the wall time of the whole command (``seconds``: listing, packing,
    uploading, publishing), and its rates of files and source bytes per second restated over it (a
    pack at a URL is never resumed: this run packed every file)."""
    summary.update(seconds=round(seconds, 3),
                   files_per_s=round(summary["files_this_run"] / seconds, 1) if seconds > 0 else None,
                   mb_per_s=round(summary["source_bytes"] / seconds / 1e6, 1) if seconds > 0 else None)
    return summary


def _pack_shards(src: str | os.PathLike[str], local: Path, destination: UrlDestination,
                 local_pack: Callable[..., dict[str, Any]], backend: str, options: dict[str, Any]) -> dict[str, Any]:
    """A shards pack: each shard uploaded as it is finished, then the pack published."""
    outbox = local.parent / "outbox"
    outbox.mkdir()
    destination.begin()
    uploader = ShardUploader(destination.shard_store, outbox, uploaded=destination.uploaded)
    try:
        try:
            summary = local_pack(src, local, backend=backend, shard_sink=uploader, **options)
        except BaseException:
            uploader.abandon()  # the error that stopped the pack is the one to report
            raise
        # the bar covers every shard: those uploaded while packing count at once, the rest as they go
        total = uploader.given_bytes + local_bytes(local)
        with TransferBar(f"upload {destination.name}", total, options.get("progress", True)) as sent:
            uploader.follow(sent)
            destination.sent = sent
            uploader.wait()
            destination.publish_shards(local)
    except BaseException:
        destination.abandon()  # what this run uploaded; never the old pack
        raise
    return summary
