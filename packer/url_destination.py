"""Where ``pack`` and ``merge`` write at a URL, and what they may replace there: the rules of
``packer.destination`` for an object store, checked before anything is removed.

What may be at the URL ``DEST`` (``inspect``):

* nothing;
* a shards pack of packload's under the prefix ``DEST/``: only pack files (``manifest.json``,
  ``index.bin``, ``shard-NNNNN.bin``), its manifest packload's. Replaced only with ``--overwrite``;
* an unfinished shards pack of packload's (no manifest): only pack files, every shard starting
  with packload's shard header (``index.bin`` with its index header). The local engine cannot
  resume a pack at a URL, so it is worth nothing: a new pack replaces it without ``--overwrite``
  (unless a Ray run that ``--resume`` can finish is staged in ``DEST.partial/``);
* an LMDB pack of packload's, the object ``DEST``: an LMDB file whose B-tree holds packload's
  ``#manifest`` (or ``#progress``), found by a few ranged requests (its meta pages, the pages down
  to the key, the value). Replaced only with ``--overwrite``;
* anything else (an object that is not an LMDB pack of ours: a user's file, a user's own LMDB
  database; a prefix holding other objects or sub-prefixes; a ``manifest.json`` that is not
  packload's) is refused in one line naming the URL and the fix, with or without ``--overwrite``,
  and never touched.

``DEST.partial/`` is packload's own staging prefix (a new pack waits there while an old one is
replaced; Ray stages its tasks there): it may hold only what packload stages.

**Nothing is removed before the new pack is ready.** The check reads only. Into an empty
destination (or one holding an unfinished pack of ours) shards are uploaded as they are finished and
the manifest last. When a finished pack is to be replaced, the new shards wait in ``DEST.partial/``;
once the new pack is complete the destination is checked again, the old manifest deleted (the old
pack stops being a pack), the new objects copied into place by the store's own server-side copy,
the old pack's other objects deleted, and the new manifest written last. An LMDB pack is built
locally and uploaded over the old object in one request (the store replaces an object whole). A
pack that fails removes what it uploaded, never the old pack.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packload.core.errors import PackFormatError, UsageError
from packload.core.format import (
    FIELDS_NAME,
    INDEX_MAGIC,
    INDEX_NAME,
    LMDB_MANIFEST_KEY,
    MANIFEST_NAME,
    PARTIAL_SUFFIX,
    PROGRESS_KEY,
    PROGRESS_NAME,
    RAY_RUN_NAME,
    SHARD_HEADER,
    decode_shard_header,
    shard_number,
)
from packload.core.lmdb_meta import starts_as_lmdb
from packload.core.lmdb_pages import LmdbLayout
from packload.core.manifest import MANIFEST_LIMIT
from packload.core.remote import RemoteStore
from packload.core.urls import display_url
from packload.packer.destination import (
    is_our_manifest,
    is_our_progress,
    is_pack_file_name,
    is_task_folder_name,
)

LMDB_HEAD = 128 << 10  # bytes read first of an object: LMDB's two meta pages at its largest page size
LMDB_PROBE_LIMIT = (64 << 20) + MANIFEST_LIMIT  # bytes an LMDB object's check may read in all
HEAD_THREADS = 16  # shard headers read at once


@dataclass
class Found:
    """What ``inspect`` found at a URL: ``what`` is ``nothing``, ``pack`` (a finished shards pack),
    ``unfinished`` (shards of ours without a manifest) or ``lmdb`` (an LMDB pack of ours, the object
    itself); ``listing``: the objects under the prefix; ``is_object``: an object at the URL itself."""

    what: str
    listing: dict[str, int] = field(default_factory=dict)
    is_object: bool = False

    @property
    def finished(self) -> bool:
        """A finished pack is there (a shards pack, or an LMDB pack beside whatever the prefix holds)."""
        return self.what == "pack" or self.is_object


def refused(store: RemoteStore, problem: str) -> UsageError:
    """The one-line refusal of a destination that holds something that is not a pack of ours."""
    return UsageError(f"{store.shown}: {problem}: not a pack of packload's, so it is never replaced or deleted "
                      "(--overwrite replaces only packs written by packload); choose another URL, or remove it "
                      "yourself")


def inspect(store: RemoteStore, trusted: frozenset[str] = frozenset()) -> Found:
    """What is at ``store``'s URL (see the module's notes); ``UsageError`` for anything that is not
    packload's. ``trusted``: objects this run wrote there (their headers are not read again)."""
    info = _object_info(store)
    listing = store.listing_all()
    is_object = info is not None
    if is_object:
        problem = lmdb_object_problem(store, int(info.get("size") or 0))
        if problem:
            raise refused(store, problem)
    if not listing:
        return Found("lmdb" if is_object else "nothing", {}, is_object)
    what = _prefix_kind(store, listing, trusted)
    return Found(what, listing, is_object)


def _object_info(store: RemoteStore) -> dict[str, Any] | None:
    """The info of an object at the URL itself (None when there is none: nothing, or a prefix)."""
    try:
        store.fs.invalidate_cache(store.full())  # a listing of the prefix would answer for the object
        info = store.info()
    except FileNotFoundError:
        return None
    return None if info.get("type") == "directory" else info


def _prefix_kind(store: RemoteStore, listing: dict[str, int], trusted: frozenset[str] = frozenset()) -> str:
    """``pack`` or ``unfinished`` for a prefix holding a shards pack of ours; refuses anything else."""
    for name in sorted(listing):
        if "/" in name:
            raise refused(store, f"holds {name.split('/', 1)[0]}/, a folder no pack holds")
        if not is_pack_file_name(name) or name.endswith(".tmp"):
            raise refused(store, f"holds {name!r}, which is not a pack file")
    if MANIFEST_NAME in listing:
        if listing[MANIFEST_NAME] > MANIFEST_LIMIT or not is_our_manifest(store.read_object(MANIFEST_NAME)):
            raise refused(store, f"holds a {MANIFEST_NAME} that is not packload's")
        return "pack"
    if PROGRESS_NAME in listing and not is_our_progress(store.read_object(PROGRESS_NAME)):
        raise refused(store, f"holds a {PROGRESS_NAME} that is not packload's")
    heads = [name for name in sorted(listing)
             if (shard_number(name) is not None or name == INDEX_NAME) and name not in trusted]
    with ThreadPoolExecutor(HEAD_THREADS, thread_name_prefix="packload-check") as pool:
        for name, ours in zip(heads, pool.map(lambda n: _starts_as_ours(store, n, listing[n]), heads), strict=True):
            if not ours:
                raise refused(store, f"holds {name!r}, which does not start as packload's {name.split('-')[0]}")
    return "unfinished"


def _starts_as_ours(store: RemoteStore, name: str, size: int) -> bool:
    """Whether object ``name`` starts with packload's shard (or index) header."""
    length = SHARD_HEADER.itemsize if name != INDEX_NAME else len(INDEX_MAGIC)
    if size < length:
        return False
    head = store.read_range(name, 0, length)
    return head == INDEX_MAGIC if name == INDEX_NAME else decode_shard_header(head) is not None


def lmdb_object_problem(store: RemoteStore, size: int) -> str | None:
    """Why the object at ``store``'s URL is not an LMDB pack of packload's (None when it is): its
    B-tree is walked through a sparse local copy that holds only the pages the walk reads, fetched
    by ranged requests (a handful for a pack)."""
    if size == 0:
        return "is an empty object"
    head = store.read_range("", 0, min(size, LMDB_HEAD))
    if not starts_as_lmdb(head):
        return "is an object, not an LMDB pack"
    with tempfile.TemporaryDirectory(prefix="packload-check-") as folder:
        path = os.path.join(folder, "object")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            os.ftruncate(fd, size)  # sparse: only what is fetched takes room
            os.pwrite(fd, head, 0)
            with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as data:
                return _keys_problem(store, fd, data, size)
        finally:
            os.close(fd)


def _keys_problem(store: RemoteStore, fd: int, data: mmap.mmap, size: int) -> str | None:
    fetched = [0]  # bytes fetched so far (the head aside)

    def fetch(ranges: list[tuple[int, int]]) -> None:
        for start, length in ranges:
            stop = min(size, start + length)
            fetched[0] += stop - start
            if fetched[0] > LMDB_PROBE_LIMIT:
                raise PackFormatError(f"{store.shown}: more than {LMDB_PROBE_LIMIT:,} bytes to read")
            if stop > start:
                os.pwrite(fd, store.read_range("", start, stop), start)

    try:
        layout = LmdbLayout(data, store.shown, prefetch=fetch)
        try:
            manifest, progress = layout.locate_many([LMDB_MANIFEST_KEY, PROGRESS_KEY])
        finally:
            layout.close()
    except PackFormatError as exc:
        return f"is an object that packload cannot read as an LMDB pack ({str(exc).split(': ', 1)[-1][:120]})"
    for place, ours in ((manifest, is_our_manifest), (progress, is_our_progress)):
        if place is not None and place[1] <= MANIFEST_LIMIT:
            start, length = place
            fetch([(start, length)])
            if ours(bytes(data[start : start + length])):
                return None
    return "is an LMDB database without packload's #manifest (someone else's database)"


@dataclass
class Staged:
    """What ``DEST.partial/`` holds (``inspect_partial``): its objects, and whether a Ray run that
    ``--resume`` can finish is among them."""

    listing: dict[str, int]
    ray_run: bool


def inspect_partial(store: RemoteStore) -> Staged:
    """What packload staged at ``DEST.partial/``; ``UsageError`` for anything else there."""
    listing = store.listing_all()
    for name in sorted(listing):
        top, _, rest = name.partition("/")
        ours = (not rest and (top == RAY_RUN_NAME or is_pack_file_name(top))) or \
            (is_task_folder_name(top) and "/" not in rest and is_pack_file_name(rest))
        if not ours:
            raise UsageError(f"{store.shown}: holds {name!r}, which packload does not stage there: not an unfinished "
                             "pack of packload's, so it is left alone; remove it yourself, or choose another URL")
    return Staged(listing, RAY_RUN_NAME in listing)


def pack_name(url: str) -> str:
    """The name a pack at ``url`` is given (its last path component); refuses a URL that gives the
    pack no name of its own (a bucket, a staging prefix)."""
    destination = url.rstrip("/")
    name = destination.rsplit("/", 1)[-1]
    if "/" not in destination.split("://", 1)[-1] or not name or name.endswith(PARTIAL_SUFFIX) or \
            "?" in name or "#" in name:
        raise UsageError(f"{display_url(url)}: give the pack a name of its own, for example s3://bucket/train.shards")
    return name


class UrlDestination:
    """A new pack at ``url``: ``check`` (reads only), then the shards go to ``shard_store`` (the
    destination, or ``DEST.partial/`` while an old pack is there), then ``publish_shards`` or
    ``publish_object``; ``abandon`` after a failure removes what this run uploaded."""

    def __init__(self, url: str, overwrite: bool = False, storage_options: dict[str, Any] | None = None) -> None:
        self.name = pack_name(url)
        self.url = url.rstrip("/")
        self.overwrite = overwrite
        self.store = RemoteStore(self.url, storage_options)
        self.partial = RemoteStore(self.url + PARTIAL_SUFFIX, storage_options)
        self.found = Found("nothing")
        self.staged = Staged({}, False)
        self.uploaded: list[str] = []  # names this run put in shard_store
        self.replacing = False  # the old pack is being replaced: what was staged is needed now
        self.sent: Callable[[int], None] | None = None  # told the bytes of each upload (a progress bar)

    @property
    def shown(self) -> str:
        return self.store.shown

    def check(self) -> None:
        """Refuse, in one line and before anything is written or removed, a destination that holds
        anything but a pack of ours, a pack without ``overwrite``, or a Ray run ``--resume`` could
        finish without ``overwrite``."""
        self.store.check_bucket()
        self.found = inspect(self.store)
        self.staged = inspect_partial(self.partial)
        if self.found.finished and not self.overwrite:
            raise UsageError(f"{self.shown}: a pack is there; add --overwrite to replace it, or choose another URL")
        if self.staged.ray_run and not self.overwrite:
            raise UsageError(f"{self.partial.shown}: an unfinished pack of --engine ray is staged there; finish it with "
                             "--engine ray --resume, or add --overwrite to start over")

    @property
    def shard_store(self) -> RemoteStore:
        """Where the new pack's shards go while it is written: ``DEST.partial/`` while a finished
        pack is at the destination (it stays whole until the new one is), else the destination."""
        return self.partial if self.found.what == "pack" else self.store

    def begin(self) -> None:
        """Before shards are staged in ``DEST.partial/``: clear what an older run left there (ours,
        checked; no pack, and a Ray run only with ``overwrite``)."""
        if self.shard_store is self.partial:
            self._clear_staged()

    def _clear_staged(self) -> None:
        if self.staged.listing and (self.overwrite or not self.staged.ray_run):
            _remove_in_order(self.partial, self.staged.listing)
            self.staged = Staged({}, False)

    def upload_shard(self, local: Path) -> None:
        """Upload a finished shard of the new pack to ``shard_store``."""
        self.shard_store.upload(local, local.name, self.sent)
        self.uploaded.append(local.name)

    def publish_shards(self, local: Path) -> None:
        """The finished shards pack ``local`` (its shards not uploaded yet, its index and manifest)
        into place, the manifest last (see the module's notes)."""
        for path in sorted(p for p in local.iterdir() if shard_number(p.name) is not None):
            self.upload_shard(path)
        self.shard_store.upload(local / INDEX_NAME, INDEX_NAME, self.sent)
        self.uploaded.append(INDEX_NAME)
        if (local / FIELDS_NAME).exists():  # a pack made from a table
            self.shard_store.upload(local / FIELDS_NAME, FIELDS_NAME, self.sent)
            self.uploaded.append(FIELDS_NAME)
        new = set(self.uploaded) | {MANIFEST_NAME}
        now = self._still_ours(frozenset(new) if self.shard_store is self.store else frozenset())
        self.replacing = True
        if self.shard_store is self.partial:
            if MANIFEST_NAME in now.listing:
                self.store.remove([MANIFEST_NAME])  # the old pack stops being a pack, first
            sizes = self.partial.listing()
            for name in sorted(set(self.uploaded)):
                self.partial.copy_to(name, self.store, name, sizes.get(name, 0))
        stale = sorted(name for name in now.listing if name not in new)
        if MANIFEST_NAME in now.listing and self.shard_store is self.store:
            stale.insert(0, MANIFEST_NAME)  # an unfinished pack has none; kept for symmetry
        self.store.remove(stale)
        self.store.upload(local / MANIFEST_NAME, MANIFEST_NAME, self.sent)
        if now.is_object:
            self.store.remove([""])  # an old LMDB pack at the same URL: the shards pack is in place now
        if self.shard_store is self.partial:
            self.partial.remove(sorted(set(self.uploaded)))
        self._clear_staged()
        self.uploaded = []

    def publish_object(self, local: Path) -> None:
        """The finished LMDB pack ``local`` uploaded over the object at the URL (replaced whole, in
        one request), then an old shards pack under the prefix deleted, its manifest first."""
        now = self._still_ours()
        self.replacing = True
        self.store.upload(local, "", self.sent)
        if now.listing:
            _remove_in_order(self.store, now.listing)
        self._clear_staged()

    def _still_ours(self, trusted: frozenset[str] = frozenset()) -> Found:
        """What is at the destination now, checked again just before the old pack is replaced (it
        may have changed while the new pack was written); ``trusted``: what this run put there."""
        found = inspect(self.store, trusted)
        if found.finished and not self.overwrite:
            raise UsageError(f"{self.shown}: a pack was written there while this one was packed; add --overwrite to "
                             "replace it, or choose another URL")
        return found

    def abandon(self) -> None:
        """After a failure: remove what this run uploaded (the old pack, if any, is untouched). Once
        the old pack is being replaced, what was staged stays: it is the new pack."""
        if self.replacing:
            return
        names = sorted(set(self.uploaded))
        self.uploaded = []
        try:
            self.shard_store.remove(names)
        except Exception:  # noqa: BLE001 - the failure that stopped the pack is the one to report
            pass

    def size(self, backend: str) -> int:
        """Bytes the published pack takes on the store."""
        return self.store.size("") if backend == "lmdb" else sum(self.store.listing().values())


def _remove_in_order(store: RemoteStore, listing: dict[str, int]) -> None:
    """Delete ``listing``'s objects under ``store``: a manifest first (what was a pack stops being
    one), a Ray run record last (what stays is still a run to resume or clear)."""
    names = sorted(listing)
    first = [name for name in names if name == MANIFEST_NAME]
    last = [name for name in names if name == RAY_RUN_NAME]
    store.remove(first)
    store.remove([name for name in names if name not in first and name not in last])
    store.remove(last)


def prepare_destination(url: str, overwrite: bool, storage_options: dict[str, Any] | None = None) -> RemoteStore:
    """Check the destination ``url`` (its bucket exists; a pack there only with ``overwrite``;
    anything else there never): ``UrlDestination.check``, for the engines that write it themselves.
    Reads only: nothing is removed."""
    destination = UrlDestination(url, overwrite, storage_options)
    destination.check()
    return destination.store
