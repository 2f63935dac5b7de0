"""A whole pack at a URL copied to a local folder, for the commands that read every byte anyway
(``verify``, ``unpack``, ``merge``): each object by ranged requests in flight at once, pinned to the
version listed first, a shards pack's manifest last."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from packload.core.errors import IncompletePackError, PackChangedError
from packload.core.format import FIELDS_NAME, INDEX_NAME, MANIFEST_NAME, shard_number
from packload.core.remote import RemoteStore
from packload.core.remote_errors import ObjectChangedError, RemoteMissingError
from packload.core.remote_listing import tag_of
from packload.core.transfer_progress import TransferBar


def download_pack(url: str, folder: str | os.PathLike[str], storage_options: dict[str, Any] | None = None,
                  progress: bool = False) -> str:
    """Copy the whole pack at ``url`` into ``folder`` (each object by ranged requests in flight at
    once, pinned to the version listed first; a shards pack's manifest last) and return the local
    pack's path, for the commands that read every byte anyway (``verify``, ``unpack``, ``merge``).
    A pack replaced while it is copied is refused (``PackChangedError``), never copied half and half.
    ``progress``: a bar of the megabytes copied (the wait before such a command's own work)."""
    store = RemoteStore(url, storage_options)
    name = url_name(store.url) or "pack"
    kind = store.kind()
    if kind is None:
        store.check_bucket()
        raise RemoteMissingError(f"{store.shown}: no such pack (nothing is stored under it); give the URL `pack` "
                                 "wrote to")
    target = os.path.join(os.fspath(folder), name)
    try:
        if kind == "object":
            info = store.info()
            with TransferBar(f"download {name}", int(info["size"]), progress) as sent:
                _download_to(store, "", int(info["size"]), target, tag_of(info), sent)
            return target
        listing = store.listing()
        if MANIFEST_NAME not in listing:
            raise IncompletePackError(f"{store.shown}: no {MANIFEST_NAME}: this pack did not finish (or is being "
                                      "written now); pack it again, or wait for the pack to finish")
        os.mkdir(target)
        wanted = sorted(n for n in listing if shard_number(n) is not None or n in (INDEX_NAME, FIELDS_NAME)) + [
            MANIFEST_NAME]
        with TransferBar(f"download {name}", sum(listing[item] for item in wanted), progress) as sent:
            for item in wanted:
                _download_to(store, item, listing[item], os.path.join(target, item), store.tags.get(item), sent)
    except ObjectChangedError as exc:
        raise PackChangedError(f"{store.shown}: the pack changed while it was copied ({exc}); run the command "
                               "again once it is written") from None
    return target


def url_name(url: str) -> str:
    """The last component of ``url``'s path (no query string or fragment): the name a local copy takes."""
    path = url.split("://", 1)[-1].split("?", 1)[0].split("#", 1)[0].rstrip("/")
    return path.rsplit("/", 1)[-1] if "/" in path else ""


def _download_to(store: RemoteStore, name: str, size: int, path: str, tag: str | None = None,
                 sent: Callable[[int], None] | None = None) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        store.download(name, size, fd, tag, sent)
    finally:
        os.close(fd)
