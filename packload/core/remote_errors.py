"""The errors of requests to object stores: what each failure of a store's client is, and packload's
one-line error for it, naming the fix (the URL and the client's words shown without credentials)."""

from __future__ import annotations

import socket

from packload.core.errors import PackChangedError, PackloadError, WriteError
from packload.core.remote_deadlines import RETRIES, TIMEOUT_VARIABLE, request_timeout
from packload.core.url_schemes import credentials_hint, endpoint_hint
from packload.core.urls import display_url, redact_text


class RemoteError(PackloadError):
    """A request to an object store failed: a missing object or bucket, no credentials, no answer."""


class RemoteMissingError(RemoteError, FileNotFoundError):
    """The object (or its bucket) is not there."""


class ObjectChangedError(RemoteError, PackChangedError):
    """A read pinned to an object's version found another version there (or none): the object was
    replaced (or deleted) since it was listed."""


class ShortReadError(OSError):
    """A ranged read returned fewer bytes than asked for (a response cut short): retried."""


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
    """The HTTP status an error of the store's client carries (``status`` or ``code``), if any."""
    for item in _causes(exc):
        for attribute in ("status", "code"):  # `status` first: aiohttp warns when its `code` is read
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


def is_timeout(exc: BaseException) -> bool:
    """A deadline passed: ours (``asyncio``'s, fsspec's), a socket's, or the client's own (botocore's
    ``ReadTimeoutError`` and the like)."""
    return any(isinstance(item, TimeoutError) or "Timeout" in type(item).__name__ for item in _causes(exc))


def is_precondition_failed(exc: BaseException) -> bool:
    """The store refused a read pinned to a version (HTTP 412: S3's ``If-Match`` did not hold)."""
    for item in _causes(exc):
        response = getattr(item, "response", None)
        if isinstance(response, dict):
            error = response.get("Error") or {}
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if error.get("Code") == "PreconditionFailed" or status == 412:
                return True
    return _http_status(exc) == 412


def is_permanent(exc: BaseException) -> bool:
    """An error that another attempt would not cure."""
    return isinstance(exc, FileNotFoundError | PermissionError | IsADirectoryError | NotADirectoryError
                      | PackloadError | ValueError | TypeError) or _is_missing_credentials(exc) \
        or _is_denied(exc) or _is_refused(exc) or is_precondition_failed(exc)


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
    if is_timeout(exc):
        allowed = f"{timeout:g} s" if timeout is not None else f"{request_timeout():g} s"
        return kind(f"{url}: the object store did not answer after {attempts} attempt(s){took} (each may take "
                    f"{allowed}, and a second more per MiB moved); {endpoint_hint(url)}, then retry; on a slow "
                    f"link raise {TIMEOUT_VARIABLE} (seconds)")
    return kind(f"{url}: the object store did not answer after {attempts} attempt(s){took} "
                f"({type(exc).__name__}: {text}); {endpoint_hint(url)}, then retry")


