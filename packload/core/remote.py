"""Packs on object stores and other fsspec URLs (``s3://``, ``gs://``, ``https://``, ...).

``is_url`` tells a URL from a local path; ``RemoteStore`` is one pack's place on the store (a
prefix holding a shards pack, or one LMDB object): ranged reads that are retried when a
connection drops and checked for their length, whole downloads by many ranged requests in flight,
uploads, listings, and the store's errors turned into packload's one-line errors. fsspec and the
store's own package (s3fs, gcsfs) are imported only when a URL is used; without them the error
names the extra to install.

Every request has a deadline. One attempt may take ``timeout`` seconds (``PACKLOAD_TIMEOUT``,
default 20) plus one second for each MiB it moves (``MIN_RATE``), connecting and answering
included: a store that never answers, or stalls halfway through an answer, is given up on then. All
the attempts of one request together stop ``timeout`` seconds after the first attempt's deadline,
so a request that cannot finish says so in one line in about twice the timeout (a little more
for large transfers), whatever the store's client would otherwise wait.

A listing notes each object's version (``tags``: S3's ETag, GCS's generation). A ranged read given
that version is *pinned* to it: the store answers with those bytes or refuses (S3's ``If-Match``,
GCS's ``generation``), and a refusal raises ``ObjectChangedError``: the object was replaced since
it was listed, which a reader reports as its pack having changed, never as damage.

URLs are shown through ``packload.core.urls.display_url`` (no credentials or signatures), in every
message here and in the store clients' own words quoted in them (``redact_text``).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from packload.core.errors import PackChangedError, PackloadError, UsageError, WriteError
from packload.core.progress import progress_bar
from packload.core.urls import display_url, redact_text

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
# The extra of pyproject.toml that installs each scheme's filesystem.
EXTRA_OF_SCHEME = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}
RETRIES = 5  # attempts of one request at most before its error is reported
RETRY_PAUSE = 0.2  # seconds before the second attempt; doubled before each next one
DEFAULT_TIMEOUT = 20.0  # seconds an attempt of a small request may take, connecting and answering
TIMEOUT_VARIABLE = "PACKLOAD_TIMEOUT"
MIN_RATE = 1 << 20  # bytes per second a large transfer must keep up: its attempt's deadline grows by its size
DOWNLOAD_PIECE = 16 << 20  # bytes per ranged request of a whole download
DOWNLOAD_THREADS = 16

T = TypeVar("T")


def is_url(path: object) -> bool:
    """True for a URL string (``scheme://...``); a local path, str or ``PathLike``, is not one."""
    return isinstance(path, str) and bool(_URL.match(path))


def scheme_of(url: str) -> str:
    return url.split("://", 1)[0].lower()


def install_hint(url: str) -> str:
    """The command that installs what ``url`` needs."""
    extra = EXTRA_OF_SCHEME.get(scheme_of(url))
    return f'pip install -e ".[{extra}]"' if extra else 'pip install -e ".[s3]" (fsspec, and the filesystem package of the URL\'s scheme)'


class RemoteError(PackloadError):
    """A request to an object store failed: a missing object or bucket, no credentials, no answer."""


class RemoteMissingError(RemoteError, FileNotFoundError):
    """The object (or its bucket) is not there."""


class ObjectChangedError(RemoteError, PackChangedError):
    """A read pinned to an object's version found another version there (or none): the object was
    replaced (or deleted) since it was listed."""




# What each scheme's users set for credentials, and for another endpoint (an S3-compatible server,
# a GCS emulator); named in the errors about them.
CREDENTIALS_OF_SCHEME = {
    "s3": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or a profile in ~/.aws/credentials), or pass "
          "storage_options={'anon': True} for a public bucket",
    "gs": "set GOOGLE_APPLICATION_CREDENTIALS to a service account's key file (or run `gcloud auth "
          "application-default login`), or pass storage_options={'token': 'anon'} for a public bucket",
}
ENDPOINT_OF_SCHEME = {"s3": "AWS_ENDPOINT_URL", "gs": "STORAGE_EMULATOR_HOST"}
_SCHEME_FAMILY = {"s3a": "s3", "gcs": "gs"}


def _family(url: str) -> str:
    scheme = scheme_of(url)
    return _SCHEME_FAMILY.get(scheme, scheme)


def credentials_hint(url: str) -> str:
    """How a user of ``url``'s store gives it credentials."""
    return CREDENTIALS_OF_SCHEME.get(_family(url), "pass the credentials the filesystem of this URL takes in "
                                                  "storage_options (see its documentation)")


def endpoint_hint(url: str) -> str:
    """What to check when ``url``'s store cannot be reached."""
    variable = ENDPOINT_OF_SCHEME.get(_family(url))
    where = f" ({variable} or storage_options' endpoint_url, if you use another server)" if variable else ""
    return f"check the endpoint{where} and the network"


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and the errors it was raised from, innermost last (a client's wrapping undone), as a
    traceback would show them."""
    chain: list[BaseException] = []
    item: BaseException | None = exc
    while item is not None and item not in chain and len(chain) < 16:
        chain.append(item)
        item = item.__cause__ or (None if item.__suppress_context__ else item.__context__)
    return chain


def _http_status(exc: BaseException) -> int | None:
    """The HTTP status an error of the store's client carries (``code`` or ``status``), if any."""
    for item in _causes(exc):
        for attribute in ("code", "status"):
            value = getattr(item, attribute, None)
            if isinstance(value, int) and 400 <= value < 600:
                return value
    return None


def _is_missing_credentials(exc: BaseException) -> bool:
    name = type(exc).__name__
    text = str(exc).lower()
    return name in ("NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError") \
        or "unable to locate credentials" in text or "could not find default credentials" in text \
        or _http_status(exc) == 401


def _is_denied(exc: BaseException) -> bool:
    """Access refused: a ``PermissionError``, an HTTP 403, or an error that says Forbidden (as
    gcsfs's plain ``OSError`` for a 403 does)."""
    return isinstance(exc, PermissionError) or _http_status(exc) == 403 or str(exc).startswith("Forbidden")


def _is_refused(exc: BaseException) -> bool:
    """Nothing listens at the endpoint, or its host name is unknown: the store's client has retried
    the connection itself already (gcsfs, botocore), so another attempt here only waits longer."""
    return any(isinstance(item, ConnectionRefusedError | socket.gaierror) for item in _causes(exc))


def _is_timeout(exc: BaseException) -> bool:
    """A deadline passed: ours (``asyncio``'s, fsspec's), a socket's, or the client's own (botocore's
    ``ReadTimeoutError`` and the like)."""
    return any(isinstance(item, TimeoutError) or "Timeout" in type(item).__name__ for item in _causes(exc))


def _is_precondition_failed(exc: BaseException) -> bool:
    """The store refused a read pinned to a version (HTTP 412: S3's ``If-Match`` did not hold)."""
    for item in _causes(exc):
        response = getattr(item, "response", None)
        if isinstance(response, dict):
            error = response.get("Error") or {}
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if error.get("Code") == "PreconditionFailed" or status == 412:
                return True
    return _http_status(exc) == 412


def request_timeout(timeout: float | None = None) -> float:
    """Seconds one attempt of a small request may take: ``timeout`` when given, else
    ``$PACKLOAD_TIMEOUT``, else ``DEFAULT_TIMEOUT``."""
    text = os.environ.get(TIMEOUT_VARIABLE, "").strip() if timeout is None else str(timeout)
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        where = f"{TIMEOUT_VARIABLE}={text!r}" if timeout is None else f"timeout {text}"
        raise UsageError(f"{where}: give the seconds a request to the object store may take, more than 0, "
                         f"for example {DEFAULT_TIMEOUT:g}")
    return value


def attempt_deadline(timeout: float, nbytes: int = 0) -> float:
    """Seconds one attempt of a request moving ``nbytes`` may take: ``timeout``, plus a second for
    each ``MIN_RATE`` bytes."""
    return timeout + nbytes / MIN_RATE


def _permanent(exc: BaseException) -> bool:
    """An error that another attempt would not cure."""
    return isinstance(exc, FileNotFoundError | PermissionError | IsADirectoryError | NotADirectoryError
                      | PackloadError | ValueError | TypeError) or _is_missing_credentials(exc) \
        or _is_denied(exc) or _is_refused(exc) or _is_precondition_failed(exc)


def remote_error(exc: BaseException, url: str, writing: bool = False, attempts: int = RETRIES,
                 seconds: float | None = None, timeout: float | None = None) -> PackloadError:
    """Our one-line error for a failed request about ``url``, naming the fix (the URL and the
    client's words shown without credentials). ``attempts`` made in ``seconds``, each allowed
    ``timeout`` seconds (named when the last one ran out of time)."""
    if isinstance(exc, PackloadError):
        return exc
    url = display_url(url)
    text = redact_text(" ".join(str(exc).split()))[:200] or type(exc).__name__
    if _is_missing_credentials(exc):
        return RemoteError(f"{url}: no credentials for the object store, or they were refused ({text}); "
                           f"{credentials_hint(url)}")
    if isinstance(exc, FileNotFoundError):
        if "bucket" in text.lower():
            return RemoteMissingError(f"{url}: the bucket does not exist ({text}); check the bucket's name, "
                                      "or create it first")
        return RemoteMissingError(f"{url}: no such object; check the URL (give the shards folder or .lmdb "
                                  "object that `pack` wrote)")
    if _is_denied(exc):
        return RemoteError(f"{url}: access denied ({text}); check the credentials and the bucket's permissions")
    kind = WriteError if writing else RemoteError
    if _is_refused(exc):
        return kind(f"{url}: could not connect to the object store ({type(exc).__name__}: {text}); "
                    f"{endpoint_hint(url)}")
    took = f" in {seconds:.0f} s" if seconds is not None else ""
    if _is_timeout(exc):
        allowed = f"{timeout:g} s" if timeout is not None else f"{request_timeout():g} s"
        return kind(f"{url}: the object store did not answer after {attempts} attempt(s){took} (each may take "
                    f"{allowed}, and a second more per MiB moved); {endpoint_hint(url)}, then retry; on a slow "
                    f"link raise {TIMEOUT_VARIABLE} (seconds)")
    return kind(f"{url}: the object store did not answer after {attempts} attempt(s){took} "
                f"({type(exc).__name__}: {text}); {endpoint_hint(url)}, then retry")


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
            if not probed and _is_timeout(exc):
                probed = True
                refused = probe()  # type: ignore[misc]
                if refused is not None:
                    raise remote_error(refused, url, writing, attempt, time.monotonic() - started, timeout) from None
            out_of_time = time.monotonic() + pause >= until
            if _permanent(exc) or attempt == RETRIES or out_of_time:
                raise remote_error(exc, url, writing, attempt, time.monotonic() - started, timeout) from None
        time.sleep(pause)
        pause *= 2
    raise AssertionError("unreachable")


def tag_of(item: dict[str, Any]) -> str | None:
    """The version of a listed object, as a pinned read names it: ``generation:N`` (GCS) or
    ``etag:"..."`` (S3 and others that give an ETag); None when the store gives neither."""
    generation = item.get("generation")
    if generation:
        return f"generation:{generation}"
    etag = item.get("ETag") or item.get("etag")
    return f"etag:{etag}" if etag else None


def content_matches_tag(tag: str | None, data: bytes, item: dict[str, Any] | None = None) -> bool | None:
    """Whether ``data`` are the bytes of the object version ``tag`` (listed with ``item``) by their
    MD5, where the store gives one (a single-part S3 upload's ETag, GCS's ``md5Hash``); None when
    it cannot tell."""
    md5 = hashlib.md5(data, usedforsecurity=False)
    if item and isinstance(item.get("md5Hash"), str):
        return base64.b64encode(md5.digest()).decode() == item["md5Hash"]
    if tag and tag.startswith("etag:"):
        etag = tag[5:].strip('"')
        if re.fullmatch(r"[0-9a-f]{32}", etag):
            return md5.hexdigest() == etag
    return None


async def _s3_pinned_get(fs: Any, path: str, start: int, stop: int, etag: str) -> bytes:
    """Bytes ``start:stop`` of S3 object ``path`` if its ETag is still ``etag`` (``If-Match``)."""
    bucket, key, version = fs.split_path(path)
    extra = {"VersionId": version} if version else {}
    answer = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{stop - 1}",
                               IfMatch=etag, **extra)
    try:
        return bytes(await answer["Body"].read())
    finally:
        answer["Body"].close()


class ShortReadError(OSError):
    """A ranged read returned fewer bytes than asked for (a response cut short): retried."""


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
            return _on_loop(fs, deadline, coroutine, *args, **kwargs)
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
        return retried(attempt, self.url_of(where), writing, until=until, timeout=self.timeout, probe=self._probe)

    def endpoint(self) -> str | None:
        """The endpoint the filesystem talks to, where it names one (an S3-compatible server, a GCS
        emulator); None for the cloud's own, which is not probed."""
        fs = self.fs
        options = getattr(fs, "client_kwargs", None) or {}
        for value in (options.get("endpoint_url"), getattr(fs, "endpoint_url", None),
                      os.environ.get("AWS_ENDPOINT_URL") if _family(self.url) == "s3" else None,
                      getattr(fs, "_location", None) if _family(self.url) == "gs" else None):
            if isinstance(value, str) and "://" in value:
                return value
        return None

    def _probe(self) -> BaseException | None:
        """The error of a connection to the endpoint (a refused one, an unknown host), or None when it
        connects, cannot be told, or is the cloud's own."""
        endpoint = self.endpoint()
        if endpoint is None:
            return None
        scheme, _, rest = endpoint.partition("://")
        host_port = rest.split("/", 1)[0].rsplit("@", 1)[-1]
        host, sep, port = host_port.rpartition(":")
        if not sep or not port.isdigit():
            host, port = host_port, "443" if scheme == "https" else "80"
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=min(3.0, self.timeout)).close()
        except (ConnectionRefusedError, socket.gaierror) as exc:
            return exc
        except OSError:
            return None
        return None

    def _pinned(self, name: str, start: int, stop: int, tag: str | None) -> Any:
        """A coroutine function and arguments reading bytes ``start:stop`` of ``name`` pinned to the
        version ``tag`` where the store can be asked so; plain otherwise."""
        fs = self.fs
        path = self.full(name)
        if tag and tag.startswith("etag:") and hasattr(fs, "_call_s3") and hasattr(fs, "split_path"):
            return _s3_pinned_get, (fs, path, start, stop, tag[5:]), {}
        if tag and tag.startswith("generation:") and _family(self.url) == "gs":
            return fs._cat_file, (path,), {"start": start, "end": stop, "generation": tag[11:]}
        return fs._cat_file, (path,), {"start": start, "end": stop}

    # -- what is there ----------------------------------------------------------------------
    def kind(self) -> str | None:
        """``"folder"`` (a prefix holding objects), ``"object"``, or None when nothing is there."""
        def look() -> str | None:
            try:
                info = self._call("info", self.full(), deadline=self.timeout)
            except FileNotFoundError:
                return None
            return "folder" if info.get("type") == "directory" else "object"
        return retried(look, self.url, until=time.monotonic() + 2 * self.timeout, timeout=self.timeout,
                       probe=self._probe)

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
        found = retried(ls, self.url, until=time.monotonic() + 2 * self.timeout, timeout=self.timeout,
                       probe=self._probe)
        sizes: dict[str, int] = {}
        tags: dict[str, str] = {}
        for item in found:
            if item.get("type") == "directory":
                continue
            name = item["name"].rstrip("/").rsplit("/", 1)[-1]
            sizes[name] = int(item.get("size") or 0)
            tag = tag_of(item)
            if tag:
                tags[name] = tag
        self.tags = tags
        self.listed = {item["name"].rstrip("/").rsplit("/", 1)[-1]: item for item in found
                       if item.get("type") != "directory"}
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
            files: dict[str, int] = {}
            folders: list[str] = []
            for item in found:
                path = item["name"].rstrip("/")
                if path == root:  # a folder marker of the prefix itself
                    continue
                name = path.rsplit("/", 1)[-1]
                if item.get("type") == "directory":
                    folders.append(name)
                else:
                    files[name] = int(item.get("size") or 0)
            return files, sorted(folders)
        return retried(ls, self.url, until=time.monotonic() + 2 * self.timeout, timeout=self.timeout,
                       probe=self._probe)

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
        return retried(find, self.url_of(name), until=time.monotonic() + 5 * self.timeout, timeout=self.timeout,
                       probe=self._probe)

    # -- reading ----------------------------------------------------------------------------
    def read_object(self, name: str) -> bytes:
        """The whole of the (small) object ``name``, in one request."""
        return bytes(self._request("cat_file", self.full(name), where=name))

    def read_range(self, name: str, start: int, stop: int, tag: str | None = None) -> bytes:
        """Bytes ``start:stop`` of object ``name``, exactly (a short answer is asked again); with
        ``tag``, pinned to that version of it (``ObjectChangedError`` when it is not there now)."""
        function, args, kwargs = self._pinned(name, start, stop, tag)

        def attempt(deadline: float) -> bytes:
            try:
                if getattr(self.fs, "async_impl", False):
                    data = _on_loop(self.fs, deadline, function, *args, **kwargs)
                else:
                    data = self.fs.cat_file(self.full(name), start=start, end=stop)
            except Exception as exc:
                if tag and (isinstance(exc, FileNotFoundError) or _is_precondition_failed(exc)):
                    raise self.changed(name) from None
                raise
            if len(data) != stop - start:
                if tag and self._version_now(name, deadline, tag) != tag:  # shorter now: another object there
                    raise self.changed(name)
                raise ShortReadError(f"{len(data)} bytes of {stop - start}")
            return bytes(data)

        per_attempt = attempt_deadline(self.timeout, stop - start)
        until = time.monotonic() + per_attempt + self.timeout
        return retried(lambda: attempt(min(per_attempt, max(until - time.monotonic(), 0.05))),
                       self.url_of(name), until=until, timeout=self.timeout, probe=self._probe)

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
        callback = _sent_callback(sent)
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
            retried(rm, self.url, True, until=time.monotonic() + 2 * self.timeout + len(paths) / 50,
                    timeout=self.timeout, probe=self._probe)

    def check_bucket(self) -> None:
        """Fail with one line unless the place's bucket (the first path component) exists."""
        bucket = self.full().split("/", 1)[0]
        def look() -> None:
            if not self._call("exists", bucket, deadline=self.timeout):
                raise FileNotFoundError(f"bucket {bucket} does not exist")
        retried(look, self.url, until=time.monotonic() + 2 * self.timeout, timeout=self.timeout,
                       probe=self._probe)

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "storage_options": self.storage_options, "timeout": self.timeout, "tags": self.tags,
                "listed": {}, "_fs": None, "_root": "", "_pid": 0}

    def __repr__(self) -> str:
        return f"RemoteStore({self.shown!r})"


def _on_loop(fs: Any, deadline: float, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run the coroutine ``function(*args, **kwargs)`` on ``fs``'s event loop and wait for it at most
    ``deadline`` seconds: then it is cancelled (its connection closed) and ``TimeoutError`` raised."""
    import fsspec.asyn  # noqa: PLC0415 - optional: only URLs need it

    return fsspec.asyn.sync(fs.loop, function, *args, timeout=deadline, **kwargs)



def open_filesystem(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` and the path in it; a one-line error naming the extra to
    install when fsspec or the scheme's package is missing. Options also come from the environment
    (``FSSPEC_S3_ENDPOINT_URL`` and the like, as fsspec reads them)."""
    shown = display_url(url)
    try:
        import fsspec  # noqa: PLC0415 - optional: only URLs need it
    except ImportError:
        raise UsageError(f"{shown}: reading or writing URLs needs fsspec; install it with {install_hint(url)}") from None
    try:
        fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    except ImportError as exc:
        raise UsageError(f"{shown}: the {scheme_of(url)}:// scheme needs a package that is not installed "
                         f"({' '.join(str(exc).split())[:120]}); install it with {install_hint(url)}") from None
    except ValueError as exc:
        raise UsageError(f"{shown}: not a URL fsspec knows ({redact_text(str(exc))}); give s3://bucket/path, "
                         "gs://bucket/path, https://... or a local path") from None
    return fs, path.rstrip("/")


def download_pack(url: str, folder: str | os.PathLike[str], storage_options: dict[str, Any] | None = None,
                  progress: bool = False) -> str:
    """Copy the whole pack at ``url`` into ``folder`` (each object by ranged requests in flight at
    once, pinned to the version listed first; a shards pack's manifest last) and return the local
    pack's path, for the commands that read every byte anyway (``verify``, ``unpack``, ``merge``).
    A pack replaced while it is copied is refused (``PackChangedError``), never copied half and half.
    ``progress``: a bar of the megabytes copied (the wait before such a command's own work)."""
    from packload.core.errors import IncompletePackError  # noqa: PLC0415 - beside its only use
    from packload.core.format import FIELDS_NAME, INDEX_NAME, MANIFEST_NAME, shard_number  # noqa: PLC0415

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


def _sent_callback(sent: Callable[[int], None] | None) -> Any:
    """An fsspec ``Callback`` that tells ``sent`` each increment of bytes written (None without
    ``sent``). A retried upload counts from zero again: what the failed attempt reported is taken
    back. ``finish(size)`` tops the count up to ``size`` where a filesystem reports nothing."""
    if sent is None:
        return None
    from fsspec.callbacks import Callback  # noqa: PLC0415 - fsspec is the object-store extra

    class Sent(Callback):  # type: ignore[misc] - fsspec is untyped
        reported = 0

        def set_size(self, size: int) -> None:  # each attempt begins by sizing its transfer
            if self.reported:
                sent(-self.reported)
                self.reported = 0
            self.value = 0
            super().set_size(size)

        def call(self, hook_name: str | None = None, **kwargs: Any) -> None:
            if self.value > self.reported:
                sent(self.value - self.reported)
                self.reported = self.value

        def finish(self, size: int) -> None:
            if size > self.reported:
                sent(size - self.reported)
                self.reported = size

    return Sent()


def url_name(url: str) -> str:
    """The last component of ``url``'s path (no query string or fragment): the name a local copy takes."""
    path = url.split("://", 1)[-1].split("?", 1)[0].split("#", 1)[0].rstrip("/")
    return path.rsplit("/", 1)[-1] if "/" in path else ""


class TransferBar:
    """A bar (``progress_bar``) of ``size`` bytes moved, counted in MB, for an upload or a download:
    call it with each increment of bytes. Threads may call it at once (transfers run on pools)."""

    def __init__(self, desc: str, size: int, progress: bool) -> None:
        self.bar = progress_bar(total=size / 1e6, desc=desc, unit="MB", disable=not progress)
        self.lock = threading.Lock()

    def __call__(self, nbytes: int) -> None:
        with self.lock:
            self.bar.update(nbytes / 1e6)

    def __enter__(self) -> TransferBar:
        return self

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.bar.close()


def _download_to(store: RemoteStore, name: str, size: int, path: str, tag: str | None = None,
                 sent: Callable[[int], None] | None = None) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        store.download(name, size, fd, tag, sent)
    finally:
        os.close(fd)
