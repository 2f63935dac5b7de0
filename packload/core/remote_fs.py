"""An object store's fsspec filesystem: opening it for a URL, running its coroutines under a
deadline, reads pinned to an object's version, and a look at whether its endpoint listens.

fsspec and the store's own package (s3fs, gcsfs) are imported only when a URL is used; without
them the error names the extra to install.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

from packload.core.errors import UsageError
from packload.core.url_schemes import install_hint, scheme_family, scheme_of
from packload.core.urls import display_url, redact_text


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



def on_loop(fs: Any, deadline: float, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run the coroutine ``function(*args, **kwargs)`` on ``fs``'s event loop and wait for it at most
    ``deadline`` seconds: then it is cancelled (its connection closed) and ``TimeoutError`` raised."""
    import fsspec.asyn  # noqa: PLC0415 - optional: only URLs need it

    return fsspec.asyn.sync(fs.loop, function, *args, timeout=deadline, **kwargs)



async def s3_pinned_get(fs: Any, path: str, start: int, stop: int, etag: str) -> bytes:
    """Bytes ``start:stop`` of S3 object ``path`` if its ETag is still ``etag`` (``If-Match``)."""
    bucket, key, version = fs.split_path(path)
    extra = {"VersionId": version} if version else {}
    answer = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{stop - 1}",
                               IfMatch=etag, **extra)
    try:
        return bytes(await answer["Body"].read())
    finally:
        answer["Body"].close()



def pinned_read(fs: Any, url: str, path: str, start: int, stop: int, tag: str | None) -> Any:
    """A coroutine function and arguments reading bytes ``start:stop`` of ``path`` pinned to the
    version ``tag`` where the store can be asked so; plain otherwise."""
    if tag and tag.startswith("etag:") and hasattr(fs, "_call_s3") and hasattr(fs, "split_path"):
        return s3_pinned_get, (fs, path, start, stop, tag[5:]), {}
    if tag and tag.startswith("generation:") and scheme_family(url) == "gs":
        return fs._cat_file, (path,), {"start": start, "end": stop, "generation": tag[11:]}
    return fs._cat_file, (path,), {"start": start, "end": stop}


def endpoint_of(fs: Any, url: str) -> str | None:
    """The endpoint ``fs`` (of ``url``) talks to, where it names one (an S3-compatible server, a GCS
    emulator); None for the cloud's own, which is not probed."""
    options = getattr(fs, "client_kwargs", None) or {}
    family = scheme_family(url)
    # gcsfs's location is Google's own unless an endpoint_url or STORAGE_EMULATOR_HOST names another
    elsewhere = bool(getattr(fs, "_endpoint", None)) or \
        os.environ.get("STORAGE_EMULATOR_HOST", "") not in ("", "default")
    for value in (options.get("endpoint_url"), getattr(fs, "endpoint_url", None),
                  os.environ.get("AWS_ENDPOINT_URL") if family == "s3" else None,
                  getattr(fs, "_location", None) if family == "gs" and elsewhere else None):
        if isinstance(value, str) and "://" in value:
            return value
    return None


def connection_refused(endpoint: str, timeout: float) -> BaseException | None:
    """The error of a connection to ``endpoint`` (a refused one, an unknown host), or None when it
    connects or cannot be told (within ``timeout`` seconds, 3 at most)."""
    scheme, _, rest = endpoint.partition("://")
    host_port = rest.split("/", 1)[0].rsplit("@", 1)[-1]
    host, sep, port = host_port.rpartition(":")
    if not sep or not port.isdigit():
        host, port = host_port, "443" if scheme == "https" else "80"
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=min(3.0, timeout)).close()
    except (ConnectionRefusedError, socket.gaierror) as exc:
        return exc
    except OSError:
        return None
    return None
