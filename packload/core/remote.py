"""Packs on object stores and other fsspec URLs (``s3://``, ``gs://``, ``https://``, ...).

``RemoteStore`` is one pack's place on the store (a prefix holding a shards pack, or one LMDB
object): ranged reads that are retried when a connection drops and checked for their length, whole
downloads by many ranged requests in flight, uploads, listings (``pack_download`` copies a whole
pack to a local folder through it). Beside it: URLs and their schemes (``url_schemes``), the filesystem under a
store (``remote_fs``), deadlines (``remote_deadlines``), errors (``remote_errors``), what a listing
says (``remote_listing``) and the progress of transfers (``transfer_progress``).

Every request has a deadline, and its attempts a time limit (``remote_deadlines``).

A listing notes each object's version (``tags``: S3's ETag, GCS's generation). A ranged read given
that version is *pinned* to it: the store answers with those bytes or refuses (S3's ``If-Match``,
GCS's ``generation``), and a refusal raises ``ObjectChangedError``: the object was replaced since
it was listed, which a reader reports as its pack having changed, never as damage.

URLs are shown through ``packload.core.urls.display_url`` (no credentials or signatures), in every
message here and in the store clients' own words quoted in them (``redact_text``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from packload.core.remote_deadlines import RETRIES, RETRY_PAUSE, attempt_deadline, request_timeout
from packload.core.remote_errors import (
    ObjectChangedError,
    RemoteError,
    RemoteMissingError,
    ShortReadError,
    is_permanent,
    is_precondition_failed,
    is_timeout,
    remote_error,
)
from packload.core.remote_fs import connection_refused, endpoint_of, on_loop, open_filesystem, pinned_read
from packload.core.remote_listing import content_matches_tag, read_listing, read_top_listing, tag_of
from packload.core.transfer_progress import TransferBar, sent_callback
from packload.core.url_schemes import install_hint, is_url
from packload.core.urls import display_url

# The names callers import from here, defined here or in the modules beside it.
__all__ = ["RETRIES", "RETRY_PAUSE", "ObjectChangedError", "RemoteError", "RemoteMissingError", "RemoteStore",
           "TransferBar", "attempt_deadline", "content_matches_tag", "install_hint", "is_url", "remote_error",
           "request_timeout", "retried", "tag_of"]

DOWNLOAD_PIECE = 16 << 20  # bytes per ranged request of a whole download
DOWNLOAD_THREADS = 16

T = TypeVar("T")


def retried(call: Callable[[], T], url: str, writing: bool = False, *, until: float | None = None,
            timeout: float | None = None, probe: Callable[[], BaseException | None] | None = None) -> T:
    """``call()``, again after a pause when it fails with an error a retry may cure (a dropped
    connection, a deadline passed, a short read); our one-line error once the attempts are used up
    or the time is: no attempt starts after ``until`` (a ``time.monotonic()``; default: twice the
    request timeout from now). ``probe``, asked once after a deadline passed, says whether the
    store's endpoint refuses connections (its error; None: it does not): a client that retries a
    refused connection on its own for longer than the deadline then gets our "could not connect"."""
    started = time.monotonic()
    if until is None:
        until = started + 2 * request_timeout(timeout)
    pause = RETRY_PAUSE
    probed = probe is None
    for attempt in range(1, RETRIES + 1):
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - the store's client raises many kinds; mapped below
            if not probed and is_timeout(exc):
                probed = True
                refused = probe()  # type: ignore[misc]
                if refused is not None:
                    raise remote_error(refused, url, writing, attempt, time.monotonic() - started, timeout) from None
            out_of_time = time.monotonic() + pause >= until
            if is_permanent(exc) or attempt == RETRIES or out_of_time:
                raise remote_error(exc, url, writing, attempt, time.monotonic() - started, timeout) from None
        time.sleep(pause)
        pause *= 2
    raise AssertionError("unreachable")


class RemoteStore:
    """One place on an object store: a prefix (a shards pack's folder) or one object (an LMDB pack).

    Names are relative to it (``""`` is the place itself). ``timeout``: seconds one attempt of a
    small request may take (``request_timeout``). ``tags``: the version of each object of the last
    ``listing`` (``tag_of``), for reads pinned to them. Pickles as its URL, options and timeout:
    each process opens its own connection on first use (an fsspec filesystem's event loop does not
    survive a fork)."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None,
                 timeout: float | None = None) -> None:
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.timeout = request_timeout(timeout)
        self.tags: dict[str, str] = {}
        self.listed: dict[str, dict[str, Any]] = {}  # the last listing's own entries, by name
        self._fs: Any = None
        self._root = ""
        self._pid = 0

    @property
    def fs(self) -> Any:
        """The fsspec filesystem (opened on first use, again after a fork)."""
        if self._fs is None or self._pid != os.getpid():
            self._fs, self._root = open_filesystem(self.url, self.storage_options)
            self._pid = os.getpid()
        return self._fs

    def full(self, name: str = "") -> str:
        """The store's path of ``name`` (without the scheme, as fsspec takes it)."""
        root = self.root
        return f"{root}/{name}" if name else root

    @property
    def root(self) -> str:
        """The place's path in the filesystem (known once it is opened)."""
        _ = self.fs
        return self._root

    def url_of(self, name: str = "") -> str:
        """The URL of ``name`` (to pass on; ``shown_of`` is the one to show)."""
        return f"{self.url}/{name}" if name else self.url

    @property
    def shown(self) -> str:
        """This place's URL as it may be shown (``display_url``)."""
        return display_url(self.url)

    def shown_of(self, name: str = "") -> str:
        """The URL of ``name`` as it may be shown."""
        return display_url(self.url_of(name))

    # -- requests under a deadline ----------------------------------------------------------
    def _call(self, method: str, *args: Any, deadline: float, **kwargs: Any) -> Any:
        """``fs.<method>(*args, **kwargs)``, given up after ``deadline`` seconds: an asynchronous
        filesystem's coroutine runs on its loop under the deadline (cancelled when it passes); a
        synchronous one (a local path) is called as it is."""
        fs = self.fs
        coroutine = getattr(fs, "_" + method, None)
        if getattr(fs, "async_impl", False) and coroutine is not None:
            return on_loop(fs, deadline, coroutine, *args, **kwargs)
        return getattr(fs, method)(*args, **kwargs)

    def _request(self, method: str, *args: Any, where: str = "", nbytes: int = 0, writing: bool = False,
                 check: Callable[[Any], Any] | None = None, **kwargs: Any) -> Any:
        """``_call`` retried (``retried``) within this store's deadlines; ``check`` sees each answer
        (and may raise ``ShortReadError`` to have it asked again); errors name ``where``."""
        per_attempt = attempt_deadline(self.timeout, nbytes)
        until = time.monotonic() + per_attempt + self.timeout

        def attempt() -> Any:
            left = max(until - time.monotonic(), 0.05)
            answer = self._call(method, *args, deadline=min(per_attempt, left), **kwargs)
            return check(answer) if check is not None else answer
        return self._retried(attempt, where, writing, until)

    def _retried(self, call: Callable[[], T], where: str = "", writing: bool = False,
                 until: float | None = None) -> T:
        """``retried`` under this store's timeout and probe, its errors naming ``where``; no attempt
        starts after ``until`` (default: two timeouts from now)."""
        until = time.monotonic() + 2 * self.timeout if until is None else until
        return retried(call, self.url_of(where), writing, until=until, timeout=self.timeout, probe=self._probe)

    def endpoint(self) -> str | None:
        """The endpoint the filesystem talks to, where it names one (an S3-compatible server, a GCS
        emulator); None for the cloud's own, which is not probed."""
        return endpoint_of(self.fs, self.url)

    def _probe(self) -> BaseException | None:
        """The error of a connection to the endpoint (a refused one, an unknown host), or None when it
        connects, cannot be told, or is the cloud's own."""
        endpoint = self.endpoint()
        return None if endpoint is None else connection_refused(endpoint, self.timeout)

    # -- what is there ----------------------------------------------------------------------
    def kind(self) -> str | None:
        """``"folder"`` (a prefix holding objects), ``"object"``, or None when nothing is there."""
        def look() -> str | None:
            try:
                info = self._call("info", self.full(), deadline=self.timeout)
            except FileNotFoundError:
                return None
            return "folder" if info.get("type") == "directory" else "object"
        return self._retried(look)

    def size(self, name: str = "") -> int:
        return int(self.info(name)["size"])

    def info(self, name: str = "") -> dict[str, Any]:
        return dict(self._request("info", self.full(name), where=name))

    def listing(self) -> dict[str, int]:
        """Every object directly under this prefix: name -> size (one listing request). Each one's
        version goes to ``tags``."""
        def ls() -> list[dict[str, Any]]:
            self.fs.invalidate_cache(self.full())
            try:
                return list(self._call("ls", self.full(), detail=True, deadline=self.timeout))
            except FileNotFoundError:
                return []
        found = self._retried(ls)
        sizes, self.tags, self.listed = read_listing(found)
        return sizes

    def listing_top(self) -> tuple[dict[str, int], list[str]]:
        """The first level under this prefix, in one listing request: its objects (name -> size) and
        the names of its sub-prefixes ("folders"), sorted."""
        def ls() -> tuple[dict[str, int], list[str]]:
            root = self.full().rstrip("/")
            self.fs.invalidate_cache(root)
            try:
                found = self._call("ls", root, detail=True, deadline=self.timeout)
            except FileNotFoundError:
                return {}, []
            return read_top_listing(found, root)
        return self._retried(ls)

    def listing_all(self, name: str = "") -> dict[str, int]:
        """Every object under this prefix (or under its sub-prefix ``name``), at any depth: key
        relative to that prefix -> size (folder markers, keys ending in ``/``, left out)."""
        def find() -> dict[str, int]:
            root = self.full(name)
            self.fs.invalidate_cache(root)
            try:
                found = self._call("find", root, detail=True, deadline=4 * self.timeout)
            except FileNotFoundError:
                return {}
            cut = len(root) + 1
            return {path[cut:]: int(item.get("size") or 0) for path, item in found.items()
                    if item.get("type") != "directory" and not path.endswith("/") and len(path) > cut}
        return self._retried(find, name, until=time.monotonic() + 5 * self.timeout)

    # -- reading ----------------------------------------------------------------------------
    def read_object(self, name: str) -> bytes:
        """The whole of the (small) object ``name``, in one request."""
        return bytes(self._request("cat_file", self.full(name), where=name))

    def read_range(self, name: str, start: int, stop: int, tag: str | None = None) -> bytes:
        """Bytes ``start:stop`` of object ``name``, exactly (a short answer is asked again); with
        ``tag``, pinned to that version of it (``ObjectChangedError`` when it is not there now)."""
        # A coroutine to pin the read where the filesystem has them; a synchronous one (a local
        # path, memory) has none, and no versions to pin to: its cat_file reads.
        pinned = pinned_read(self.fs, self.url, self.full(name), start, stop, tag) \
            if getattr(self.fs, "async_impl", False) else None

        def attempt(deadline: float) -> bytes:
            try:
                if pinned is not None:
                    function, args, kwargs = pinned
                    data = on_loop(self.fs, deadline, function, *args, **kwargs)
                else:
                    data = self.fs.cat_file(self.full(name), start=start, end=stop)
            except Exception as exc:
                if tag and (isinstance(exc, FileNotFoundError) or is_precondition_failed(exc)):
                    raise self.changed(name) from None
                raise
            if len(data) != stop - start:
                if tag and self._version_now(name, deadline, tag) != tag:  # shorter now: another object there
                    raise self.changed(name)
                raise ShortReadError(f"{len(data)} bytes of {stop - start}")
            return bytes(data)

        per_attempt = attempt_deadline(self.timeout, stop - start)
        until = time.monotonic() + per_attempt + self.timeout
        return self._retried(lambda: attempt(min(per_attempt, max(until - time.monotonic(), 0.05))), name,
                             until=until)

    def _version_now(self, name: str, deadline: float, then: str) -> str | None:
        """The version of object ``name`` now (None when it is gone; ``then`` when it cannot be told)."""
        try:
            self.fs.invalidate_cache(self.full(name))
            return tag_of(self._call("info", self.full(name), deadline=deadline))
        except FileNotFoundError:
            return None
        except Exception:  # noqa: BLE001 - the short read is what the caller reports then
            return then

    def changed(self, name: str) -> ObjectChangedError:
        """The error of a pinned read of ``name`` that found another version there."""
        return ObjectChangedError(f"{self.shown_of(name)}: replaced or deleted since it was listed")

    def read_head(self, name: str, limit: int) -> bytes:
        """The first ``limit`` bytes of object ``name`` (all of it, when it is shorter), in one
        request: an object read before its size is known (a manifest read while the folder is listed)."""
        # Its deadline is a small object's: the object is most often far shorter than the limit
        # (a manifest), and one that is not is read again by its size, under its own deadline.
        return bytes(self._request("cat_file", self.full(name), start=0, end=limit, where=name,
                                   nbytes=min(limit, 1 << 20)))

    def read_all(self, name: str, size: int, tag: str | None = None) -> bytes:
        """The whole of object ``name`` of ``size`` bytes, by ranged requests in flight at once
        (pinned to version ``tag`` when given)."""
        if size <= DOWNLOAD_PIECE:
            return self.read_range(name, 0, size, tag) if size else b""
        starts = list(range(0, size, DOWNLOAD_PIECE))
        with ThreadPoolExecutor(min(DOWNLOAD_THREADS, len(starts)), thread_name_prefix="packload-get") as pool:
            pieces = pool.map(lambda s: self.read_range(name, s, min(size, s + DOWNLOAD_PIECE), tag), starts)
            return b"".join(pieces)

    def download(self, name: str, size: int, fd: int, tag: str | None = None,
                 sent: Callable[[int], None] | None = None) -> None:
        """Write the whole of object ``name`` (``size`` bytes) into the open file ``fd``, by ranged
        requests in flight at once (each piece written where it belongs as it arrives; pinned to
        version ``tag`` when given); ``sent`` is told each piece's bytes as it is written (progress)."""
        def piece(start: int) -> None:
            data = self.read_range(name, start, min(size, start + DOWNLOAD_PIECE), tag)
            os.pwrite(fd, data, start)
            if sent is not None:
                sent(len(data))
        starts = list(range(0, size, DOWNLOAD_PIECE))
        if not starts:
            return
        with ThreadPoolExecutor(min(DOWNLOAD_THREADS, len(starts)), thread_name_prefix="packload-get") as pool:
            for _ in pool.map(piece, starts):
                pass

    # -- writing ----------------------------------------------------------------------------
    def copy_to(self, name: str, target: RemoteStore, target_name: str, size: int = 0) -> None:
        """Copy object ``name`` to ``target_name`` under ``target`` (on the same store) by the store's
        own server-side copy: the bytes never pass through this machine."""
        self._request("copy", self.full(name), target.full(target_name), where=name, nbytes=size // 16,
                      writing=True)

    def upload(self, local: str | os.PathLike[str], name: str, sent: Callable[[int], None] | None = None) -> None:
        """Copy the local file ``local`` to object ``name`` (whole, or not at all: retried); ``sent``
        is told the bytes as the filesystem reports them sent (progress), else the whole size at the end."""
        size = os.path.getsize(local)
        callback = sent_callback(sent)
        extra = {} if callback is None else {"callback": callback}
        self._request("put_file", os.fspath(local), self.full(name), where=name, nbytes=size, writing=True, **extra)
        if callback is not None:
            callback.finish(size)

    def write_bytes(self, name: str, data: bytes) -> None:
        self._request("pipe_file", self.full(name), data, where=name, nbytes=len(data), writing=True)

    def remove(self, names: list[str]) -> None:
        """Delete objects ``names`` (a missing one is no error)."""
        paths = [self.full(name) for name in names]
        if paths:
            def rm() -> None:
                try:
                    self._call("rm", paths, deadline=self.timeout + len(paths) / 100)
                except FileNotFoundError:
                    pass
            self._retried(rm, writing=True, until=time.monotonic() + 2 * self.timeout + len(paths) / 50)

    def check_bucket(self) -> None:
        """Fail with one line unless the place's bucket (the first path component) exists."""
        bucket = self.full().split("/", 1)[0]
        def look() -> None:
            if not self._call("exists", bucket, deadline=self.timeout):
                raise FileNotFoundError(f"bucket {bucket} does not exist")
        self._retried(look)

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "storage_options": self.storage_options, "timeout": self.timeout, "tags": self.tags,
                "listed": {}, "_fs": None, "_root": "", "_pid": 0}

    def __repr__(self) -> str:
        return f"RemoteStore({self.shown!r})"
