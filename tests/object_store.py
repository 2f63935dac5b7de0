"""Helpers (not tests): a real S3-compatible server on 127.0.0.1 (moto's server mode) behind a small
HTTP proxy of our own that counts the requests, can add a delay to each (the benchmark's round
trip), and can cut the connection of chosen requests halfway through their answer (a dropped
connection mid-read).

    with ObjectStore() as store:          # moto on a free port, the proxy in front of it
        store.make_bucket("bkt")
        store.options                     # fsspec storage_options pointing at the proxy
        store.proxy.requests              # [(method, path, range header), ...] seen so far
        store.proxy.cut_next(2, "GET", "/bkt/p.shards/shard-")  # cut the next 2 such answers
        store.proxy.stall_next(1, "GET", "/bkt/p.shards/shard-")  # never answer the next one
        store.proxy.stall_next(1, "GET", "/bkt/p.shards/shard-", after=100)  # 100 bytes of it, then nothing

A stalled answer holds its connection open, sending nothing more, until ``release_stalls()`` (or
the proxy's close): the store that never answers, and the one that stops halfway.

    store.proxy.fault = lambda method, path: ("cut", None)   # any request: a fault of the hook's choosing

``fault`` (None by default) is asked about every request the explicit cuts and stalls leave alone,
and answers None (forward it) or ``("cut", None)``, ``("stall", None)``, ``("stall", n bytes)`` or
``("delay", seconds)``: the fuzz of ``tests/reliability/object_store.py`` draws them at random.
"""

from __future__ import annotations

import contextvars
import http.client
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# moto's server accepts any key; botocore must find one, and must not ask a cloud's metadata service.
FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
_RELAY_PIECE = 1 << 20  # bytes relayed per write
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


_RANGED_GET: contextvars.ContextVar[bool] = contextvars.ContextVar("ranged_get", default=False)


class _StoredBytes:
    """A moto object's bytes as a ranged GET sees them: its length, and a slice read from the stored
    buffer alone. (moto reads the whole object for every ranged GET, so one 8 MiB range of a 64 MiB
    object costs a copy of all 64 MiB under the object's lock; a real store reads the range.)"""

    def __init__(self, key: Any) -> None:
        self.key = key

    def __len__(self) -> int:
        return int(self.key.size)

    def __getitem__(self, where: slice) -> bytes:
        start, stop, _ = where.indices(len(self))
        with self.key.lock:
            self.key._value_buffer.seek(start)
            return self.key._value_buffer.read(max(0, stop - start))

    def whole(self) -> bytes:
        return self[:]


def _serve_ranges_alone() -> None:
    """Make moto's server read only the asked range of an object for a ranged GET (once per process)."""
    from moto.s3.models import FakeKey  # noqa: PLC0415
    from moto.s3.responses import S3Response  # noqa: PLC0415

    if getattr(S3Response, "_packload_ranges", False):
        return
    whole_value = FakeKey.value
    get_object, handle_range = S3Response.get_object, S3Response._handle_range_header

    def value(self: Any) -> Any:
        return _StoredBytes(self) if _RANGED_GET.get() else whole_value.fget(self)

    def ranged_get_object(self: Any) -> Any:
        token = _RANGED_GET.set(bool(self.headers.get("range")))
        try:
            status, headers, body = get_object(self)
        finally:
            _RANGED_GET.reset(token)
        if status != 200 and isinstance(body, _StoredBytes):  # answered whole, not by its range
            body = body.whole()
        return status, headers, body

    def range_answer(self: Any, request: Any, headers: Any, content: Any) -> Any:
        status, headers, body = handle_range(self, request, headers, content)
        return status, headers, body.whole() if isinstance(body, _StoredBytes) else body

    FakeKey.value = property(value, whole_value.fset)
    S3Response.get_object = ranged_get_object
    S3Response._handle_range_header = range_answer
    S3Response._packload_ranges = True


class _QuietServer(ThreadingHTTPServer):
    """Says nothing when a client goes away mid-answer (a reader that stops, a process that exits)."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class CountingProxy:
    """An HTTP proxy to ``upstream`` on 127.0.0.1 that notes every request it forwards."""

    def __init__(self, upstream: tuple[str, int], delay_s: float = 0.0) -> None:
        self.upstream = upstream
        self.delay_s = delay_s
        self.requests: list[tuple[str, str, str]] = []
        self._cuts: list[list[Any]] = []  # [count left, method, path prefix]
        self._stalls: list[list[Any]] = []  # [count left, method, path prefix, bytes sent first or None]
        self._released = threading.Event()
        self.stalled = 0  # answers stalled so far
        self.fault: Any = None  # (method, path) -> None or (kind, argument): see the module's notes
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _forward(self) -> None:
                proxy._handle(self)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut_next(self, count: int, method: str, path_prefix: str) -> None:
        """Cut the connection halfway through the body of the next ``count`` answers to requests
        ``method`` of a path starting with ``path_prefix``."""
        with self._lock:
            self._cuts.append([count, method, path_prefix])

    def stall_next(self, count: int, method: str, path_prefix: str, after: int | None = None) -> None:
        """Stall the next ``count`` answers to requests ``method`` of a path starting with
        ``path_prefix``: nothing at all (``after`` None: the request is read, no answer comes), or
        the status, headers and the first ``after`` bytes of the body, then nothing. The connection
        stays open until ``release_stalls`` or ``close``."""
        with self._lock:
            self._stalls.append([count, method, path_prefix, after])

    def release_stalls(self) -> None:
        """Let every stalled answer go (its connection is closed), and forget the stalls not used yet."""
        with self._lock:
            released, self._released = self._released, threading.Event()
            self._stalls = []
        released.set()

    def _should_stall(self, method: str, path: str) -> tuple[bool, int | None, threading.Event]:
        with self._lock:
            for stall in self._stalls:
                if stall[0] > 0 and method == stall[1] and path.startswith(stall[2]):
                    stall[0] -= 1
                    self.stalled += 1
                    return True, stall[3], self._released
        return False, None, self._released

    def _drawn_fault(self, method: str, path: str) -> tuple[str, Any] | None:
        hook = self.fault
        return hook(method, path) if hook is not None else None

    def _should_cut(self, method: str, path: str) -> bool:
        with self._lock:
            for cut in self._cuts:
                if cut[0] > 0 and method == cut[1] and path.startswith(cut[2]):
                    cut[0] -= 1
                    return True
        return False

    def count(self, method: str | None = None, path_prefix: str = "", ranged: bool | None = None) -> int:
        """Requests seen of ``method`` (any when None) to paths starting with ``path_prefix``
        (``ranged``: only those with, or without, a Range header)."""
        with self._lock:
            return sum(1 for m, p, r in self.requests if (method is None or m == method) and p.startswith(path_prefix)
                       and (ranged is None or bool(r) == ranged))

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        method, path = handler.command, handler.path
        with self._lock:
            self.requests.append((method, path, handler.headers.get("Range", "")))
        if self.delay_s:
            time.sleep(self.delay_s)
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else None
        stall, after, released = self._should_stall(method, path)
        drawn = None if stall else self._drawn_fault(method, path)
        if drawn is not None and drawn[0] == "delay":
            time.sleep(float(drawn[1]))
        elif drawn is not None and drawn[0] == "stall":
            stall, after = True, drawn[1]
            with self._lock:
                self.stalled += 1
        if stall and after is None:  # the request was read; no answer comes
            released.wait()
            handler.close_connection = True
            return
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in _HOP_HEADERS}
        upstream = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            upstream.request(method, path, body=body, headers=headers)
            answer = upstream.getresponse()
            size = answer.getheader("Content-Length")
            if method == "HEAD" or size is None:  # no length to stream by: the whole answer first
                data: bytes | None = answer.read()
                size = answer.getheader("Content-Length", "0") if method == "HEAD" else str(len(data))
            else:
                data = None  # streamed below, as it arrives
            cut = (self._should_cut(method, path) or (drawn is not None and drawn[0] == "cut")) and int(size) > 1 \
                and method != "HEAD"
            if stall and method != "HEAD":
                cut = False
            handler.send_response(answer.status, answer.reason)
            for key, value in answer.getheaders():
                if key.lower() not in _HOP_HEADERS and key.lower() != "content-length":
                    handler.send_header(key, value)
            # A HEAD answer's length is the object's, not its (empty) body's.
            handler.send_header("Content-Length", size)
            if cut or stall:
                handler.send_header("Connection", "close")
            handler.end_headers()
            if method == "HEAD":
                return
            if stall:  # the first bytes, then nothing until released
                self._relay(handler, answer, data, min(int(size), after or 0))
                handler.wfile.flush()
                released.wait()
                handler.close_connection = True
                return
            self._relay(handler, answer, data, int(size) // 2 if cut else int(size))
        finally:
            upstream.close()
        if cut:  # half the body went out: now the connection goes away
            handler.wfile.flush()
            handler.connection.shutdown(socket.SHUT_RDWR)
            handler.close_connection = True

    @staticmethod
    def _relay(handler: BaseHTTPRequestHandler, answer: http.client.HTTPResponse, data: bytes | None,
               count: int) -> None:
        """Write the first ``count`` bytes of the answer's body to the client, in large pieces as they
        arrive from upstream (so the proxy adds little but its delay)."""
        if data is not None:
            handler.wfile.write(data[:count])
            return
        piece = bytearray(_RELAY_PIECE)
        view = memoryview(piece)
        while count > 0:
            got = answer.readinto(view[: min(count, _RELAY_PIECE)])
            if not got:
                break
            handler.wfile.write(view[:got])
            count -= got

    def close(self) -> None:
        self.release_stalls()
        self.server.shutdown()
        self.server.server_close()


def point_cli_at(store: ObjectStore, monkeypatch: Any, cache: Any) -> None:
    """Point the command line (and readers without options) at ``store`` as users point it at
    theirs, ``AWS_ENDPOINT_URL``, with the block cache in ``cache``."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", store.proxy.endpoint)
    monkeypatch.setenv("PACKLOAD_CACHE", str(cache))


class ObjectStore:
    """moto's S3 server on a free port of 127.0.0.1, a ``CountingProxy`` in front of it."""

    def __init__(self, delay_s: float = 0.0, in_memory: bool = False) -> None:
        """``in_memory``: moto keeps every object in memory rather than in a temporary file (it reads
        the whole object for each ranged request, so large objects are served much faster so)."""
        from moto.server import ThreadedMotoServer  # noqa: PLC0415 - a dev extra; tests skip without it

        for key, value in FAKE_CREDENTIALS.items():
            os.environ.setdefault(key, value)
        if in_memory:
            os.environ["MOTO_S3_DEFAULT_KEY_BUFFER_SIZE"] = str(1 << 40)
        _serve_ranges_alone()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.proxy = CountingProxy((host, port), delay_s)
        self.options: dict[str, Any] = {"client_kwargs": {"endpoint_url": self.proxy.endpoint},
                                        "skip_instance_cache": True}

    def filesystem(self) -> Any:
        import s3fs  # noqa: PLC0415

        return s3fs.S3FileSystem(**self.options)

    def make_bucket(self, name: str) -> None:
        """Create bucket ``name`` (moto keeps one store per process: another server may have made it)."""
        try:
            self.filesystem().mkdir(name)
        except FileExistsError:
            pass

    def close(self) -> None:
        self.proxy.close()
        self.server.stop()

    def __enter__(self) -> ObjectStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
