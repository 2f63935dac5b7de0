"""Packs on object stores and other fsspec URLs (``s3://``, ``gs://``, ``https://``, ...).

``is_url`` tells a URL from a local path; ``RemoteStore`` is one pack's place on the store (a
prefix holding a shards pack, or one LMDB object): ranged reads that are retried when a
connection drops and checked for their length, whole downloads by many ranged requests in flight,
uploads, listings, and the store's errors turned into packload's one-line errors. fsspec and the
store's own package (s3fs, gcsfs) are imported only when a URL is used; without them the error
names the extra to install.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from packload.core.errors import PackloadError, UsageError, WriteError

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
# The extra of pyproject.toml that installs each scheme's filesystem.
EXTRA_OF_SCHEME = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}
RETRIES = 5  # attempts of one request before its error is reported
RETRY_PAUSE = 0.2  # seconds before the second attempt; doubled before each next one
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


def _permanent(exc: BaseException) -> bool:
    """An error that another attempt would not cure."""
    return isinstance(exc, FileNotFoundError | PermissionError | IsADirectoryError | NotADirectoryError
                      | PackloadError | ValueError | TypeError) or _is_missing_credentials(exc) \
        or _is_denied(exc) or _is_refused(exc)


def remote_error(exc: BaseException, url: str, writing: bool = False) -> PackloadError:
    """Our one-line error for a failed request about ``url``, naming the fix."""
    if isinstance(exc, PackloadError):
        return exc
    text = " ".join(str(exc).split())[:200] or type(exc).__name__
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
    return kind(f"{url}: the object store did not answer after {RETRIES} attempts ({type(exc).__name__}: {text}); "
                f"{endpoint_hint(url)}, then retry")


def retried(call: Callable[[], T], url: str, writing: bool = False) -> T:
    """``call()``, again after a pause when it fails with an error a retry may cure (a dropped
    connection, a timeout, a short read); our one-line error once the attempts are used up."""
    pause = RETRY_PAUSE
    for attempt in range(RETRIES):
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - the store's client raises many kinds; mapped below
            if _permanent(exc) or attempt == RETRIES - 1:
                raise remote_error(exc, url, writing) from None
        time.sleep(pause)
        pause *= 2
    raise AssertionError("unreachable")


class ShortReadError(OSError):
    """A ranged read returned fewer bytes than asked for (a response cut short): retried."""


class RemoteStore:
    """One place on an object store: a prefix (a shards pack's folder) or one object (an LMDB pack).

    Names are relative to it (``""`` is the place itself). Pickles as its URL and options: each
    process opens its own connection on first use (an fsspec filesystem's event loop does not
    survive a fork)."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
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
        return f"{self.url}/{name}" if name else self.url

    def kind(self) -> str | None:
        """``"folder"`` (a prefix holding objects), ``"object"``, or None when nothing is there."""
        def look() -> str | None:
            fs = self.fs
            try:
                info = fs.info(self.full())
            except FileNotFoundError:
                return None
            return "folder" if info.get("type") == "directory" else "object"
        return retried(look, self.url)

    def size(self, name: str = "") -> int:
        return int(retried(lambda: self.fs.info(self.full(name))["size"], self.url_of(name)))

    def info(self, name: str = "") -> dict[str, Any]:
        return dict(retried(lambda: self.fs.info(self.full(name)), self.url_of(name)))

    def listing(self) -> dict[str, int]:
        """Every object directly under this prefix: name -> size (one listing request)."""
        def ls() -> dict[str, int]:
            self.fs.invalidate_cache(self.full())
            try:
                found = self.fs.ls(self.full(), detail=True)
            except FileNotFoundError:
                return {}
            return {item["name"].rstrip("/").rsplit("/", 1)[-1]: int(item.get("size") or 0)
                    for item in found if item.get("type") != "directory"}
        return retried(ls, self.url)

    def listing_top(self) -> tuple[dict[str, int], list[str]]:
        """The first level under this prefix, in one listing request: its objects (name -> size) and
        the names of its sub-prefixes ("folders"), sorted."""
        def ls() -> tuple[dict[str, int], list[str]]:
            root = self.full().rstrip("/")
            self.fs.invalidate_cache(root)
            try:
                found = self.fs.ls(root, detail=True)
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
        return retried(ls, self.url)

    def listing_all(self, name: str = "") -> dict[str, int]:
        """Every object under this prefix (or under its sub-prefix ``name``), at any depth: key
        relative to that prefix -> size (folder markers, keys ending in ``/``, left out)."""
        def find() -> dict[str, int]:
            root = self.full(name)
            self.fs.invalidate_cache(root)
            try:
                found = self.fs.find(root, detail=True)
            except FileNotFoundError:
                return {}
            cut = len(root) + 1
            return {path[cut:]: int(item.get("size") or 0) for path, item in found.items()
                    if item.get("type") != "directory" and not path.endswith("/") and len(path) > cut}
        return retried(find, self.url_of(name))

    def read_object(self, name: str) -> bytes:
        """The whole of the (small) object ``name``, in one request."""
        return retried(lambda: bytes(self.fs.cat_file(self.full(name))), self.url_of(name))

    def copy_to(self, name: str, target: RemoteStore, target_name: str) -> None:
        """Copy object ``name`` to ``target_name`` under ``target`` (on the same store) by the store's
        own server-side copy: the bytes never pass through this machine."""
        retried(lambda: self.fs.copy(self.full(name), target.full(target_name)), target.url_of(target_name),
                writing=True)

    def read_range(self, name: str, start: int, stop: int) -> bytes:
        """Bytes ``start:stop`` of object ``name``, exactly (a short answer is retried)."""
        def read() -> bytes:
            data = self.fs.cat_file(self.full(name), start=start, end=stop)
            if len(data) != stop - start:
                raise ShortReadError(f"{len(data)} bytes of {stop - start}")
            return bytes(data)
        return retried(read, self.url_of(name))

    def read_head(self, name: str, limit: int) -> bytes:
        """The first ``limit`` bytes of object ``name`` (all of it, when it is shorter), in one
        request: an object read before its size is known (a manifest read while the folder is listed)."""
        return retried(lambda: bytes(self.fs.cat_file(self.full(name), start=0, end=limit)), self.url_of(name))

    def read_all(self, name: str, size: int) -> bytes:
        """The whole of object ``name`` of ``size`` bytes, by ranged requests in flight at once."""
        if size <= DOWNLOAD_PIECE:
            return self.read_range(name, 0, size) if size else b""
        starts = list(range(0, size, DOWNLOAD_PIECE))
        with ThreadPoolExecutor(min(DOWNLOAD_THREADS, len(starts)), thread_name_prefix="packload-get") as pool:
            pieces = pool.map(lambda s: self.read_range(name, s, min(size, s + DOWNLOAD_PIECE)), starts)
            return b"".join(pieces)

    def download(self, name: str, size: int, fd: int) -> None:
        """Write the whole of object ``name`` (``size`` bytes) into the open file ``fd``, by ranged
        requests in flight at once (each piece written where it belongs as it arrives)."""
        def piece(start: int) -> None:
            data = self.read_range(name, start, min(size, start + DOWNLOAD_PIECE))
            os.pwrite(fd, data, start)
        starts = list(range(0, size, DOWNLOAD_PIECE))
        if not starts:
            return
        with ThreadPoolExecutor(min(DOWNLOAD_THREADS, len(starts)), thread_name_prefix="packload-get") as pool:
            for _ in pool.map(piece, starts):
                pass

    def upload(self, local: str | os.PathLike[str], name: str) -> None:
        """Copy the local file ``local`` to object ``name`` (whole, or not at all: retried)."""
        retried(lambda: self.fs.put_file(os.fspath(local), self.full(name)), self.url_of(name), writing=True)

    def write_bytes(self, name: str, data: bytes) -> None:
        retried(lambda: self.fs.pipe_file(self.full(name), data), self.url_of(name), writing=True)

    def remove(self, names: list[str]) -> None:
        """Delete objects ``names`` (a missing one is no error)."""
        paths = [self.full(name) for name in names]
        if paths:
            def rm() -> None:
                try:
                    self.fs.rm(paths)
                except FileNotFoundError:
                    pass
            retried(rm, self.url, writing=True)

    def check_bucket(self) -> None:
        """Fail with one line unless the place's bucket (the first path component) exists."""
        bucket = self.full().split("/", 1)[0]
        def look() -> None:
            if not self.fs.exists(bucket):
                raise FileNotFoundError(f"bucket {bucket} does not exist")
        retried(look, self.url)

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "storage_options": self.storage_options, "_fs": None, "_root": "", "_pid": 0}

    def __repr__(self) -> str:
        return f"RemoteStore({self.url!r})"


def open_filesystem(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` and the path in it; a one-line error naming the extra to
    install when fsspec or the scheme's package is missing. Options also come from the environment
    (``FSSPEC_S3_ENDPOINT_URL`` and the like, as fsspec reads them)."""
    try:
        import fsspec  # noqa: PLC0415 - optional: only URLs need it
    except ImportError:
        raise UsageError(f"{url}: reading or writing URLs needs fsspec; install it with {install_hint(url)}") from None
    try:
        fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    except ImportError as exc:
        raise UsageError(f"{url}: the {scheme_of(url)}:// scheme needs a package that is not installed "
                         f"({' '.join(str(exc).split())[:120]}); install it with {install_hint(url)}") from None
    except ValueError as exc:
        raise UsageError(f"{url}: not a URL fsspec knows ({exc}); give s3://bucket/path, gs://bucket/path, "
                         "https://... or a local path") from None
    return fs, path.rstrip("/")


def download_pack(url: str, folder: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> str:
    """Copy the whole pack at ``url`` into ``folder`` (each object by ranged requests in flight at
    once; a shards pack's manifest last) and return the local pack's path, for the commands that
    read every byte anyway (``verify``, ``unpack``, ``merge``)."""
    from packload.core.errors import IncompletePackError  # noqa: PLC0415 - beside its only use
    from packload.core.format import INDEX_NAME, MANIFEST_NAME, shard_number  # noqa: PLC0415

    store = RemoteStore(url, storage_options)
    name = store.url.rsplit("/", 1)[-1] or "pack"
    kind = store.kind()
    if kind is None:
        store.check_bucket()
        raise RemoteMissingError(f"{url}: no such pack (nothing is stored under it); give the URL `pack` wrote to")
    target = os.path.join(os.fspath(folder), name)
    if kind == "object":
        _download_to(store, "", store.size(), target)
        return target
    listing = store.listing()
    if MANIFEST_NAME not in listing:
        raise IncompletePackError(f"{url}: no {MANIFEST_NAME}: this pack did not finish (or is being written now); "
                                  "pack it again, or wait for the pack to finish")
    os.mkdir(target)
    wanted = sorted(n for n in listing if shard_number(n) is not None or n == INDEX_NAME) + [MANIFEST_NAME]
    for item in wanted:
        _download_to(store, item, listing[item], os.path.join(target, item))
    return target


def _download_to(store: RemoteStore, name: str, size: int, path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        store.download(name, size, fd)
    finally:
        os.close(fd)
