"""An object store's fsspec filesystem (``packload.core.remote_fs``): opening one for a URL (and the
one-line errors naming the extra to install), a coroutine run under a deadline and cancelled when it
passes, reads pinned to an object's version on moto's S3 server (tests/object_store.py), the
endpoint a filesystem talks to, and the look at whether it listens, on real sockets."""

from __future__ import annotations

import asyncio
import importlib
import socket
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from packload.core.errors import UsageError
from packload.core.remote_errors import is_precondition_failed
from packload.core.remote_fs import connection_refused, endpoint_of, on_loop, open_filesystem, pinned_read
from packload.core.remote_listing import tag_of

fsspec = pytest.importorskip("fsspec", reason="fsspec is not installed (pip install -e '.[s3]')")
BUCKET = "remote-fs"


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[dev]')")
    pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")
    from tests.object_store import ObjectStore  # noqa: PLC0415 - only with the dev extra

    with ObjectStore() as store:
        store.make_bucket(BUCKET)
        yield store.filesystem()


# -- opening ---------------------------------------------------------------------------------------
def test_the_filesystem_and_the_path_without_a_trailing_slash(tmp_path: Any) -> None:
    fs, path = open_filesystem(f"file://{tmp_path}/p.shards/")
    assert fs.protocol[0] == "file" and path == f"{tmp_path}/p.shards"
    fs, path = open_filesystem("memory://bkt/x.lmdb")
    assert "memory" in fs.protocol and path == "/bkt/x.lmdb"


@pytest.mark.parametrize(("url", "package", "shown", "extra"), [
    ("s3://KEY:SECRET@bkt/p.shards", "s3fs", "s3://bkt/p.shards", "s3"),
    ("gcs://bkt/p.lmdb?token=t", "gcsfs", "gcs://bkt/p.lmdb?token=REDACTED", "gcs"),
])
def test_a_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch, url: str, package: str, shown: str,
                                           extra: str) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # importing it now fails
    classes = importlib.import_module("fsspec.registry")._registry  # the classes fsspec imported before
    for protocol in ("s3", "s3a", "gs", "gcs"):  # forgotten: it imports again, and fails
        monkeypatch.delitem(classes, protocol, raising=False)
    with pytest.raises(UsageError) as info:
        open_filesystem(url)
    text = str(info.value)
    assert text.startswith(f"{shown}: the {url.split(':')[0]}:// scheme needs a package that is not installed (")
    assert text.endswith(f'); install it with pip install -e ".[{extra}]"') and "\n" not in text
    assert "SECRET" not in text and "token=t" not in text


def test_an_unknown_scheme_says_what_to_give_without_the_secrets() -> None:
    with pytest.raises(UsageError) as info:
        open_filesystem("nosuchscheme://user:pw@b/x?sig=abc")
    assert str(info.value) == ("nosuchscheme://b/x?sig=REDACTED: not a URL fsspec knows (Protocol not known: "
                               "nosuchscheme); give s3://bucket/path, gs://bucket/path, https://... or a local path")


# -- a coroutine under a deadline ------------------------------------------------------------------
def test_on_loop_returns_the_coroutines_result(s3: Any) -> None:
    async def answer(x: int, *, plus: int) -> int:
        await asyncio.sleep(0)
        return x + plus

    assert on_loop(s3, 5.0, answer, 40, plus=2) == 42


def test_on_loop_cancels_the_coroutine_when_its_deadline_passes(s3: Any) -> None:
    cancelled: list[bool] = []

    async def never_answers() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(True)  # its connection would be closed here
            raise

    with pytest.raises(TimeoutError):
        on_loop(s3, 0.01, never_answers)
    assert cancelled == [True]


# -- pinned reads ----------------------------------------------------------------------------------
def test_a_read_pinned_to_an_etag_gives_those_bytes_or_is_refused(s3: Any) -> None:
    first, second = bytes(range(256)) * 8, bytes(range(255, -1, -1)) * 8
    s3.pipe(f"{BUCKET}/obj", first)
    tag = tag_of(s3.info(f"{BUCKET}/obj"))
    function, args, kwargs = pinned_read(s3, f"s3://{BUCKET}/obj", f"{BUCKET}/obj", 3, 1030, tag)
    assert function.__name__ == "s3_pinned_get"
    assert on_loop(s3, 10.0, function, *args, **kwargs) == first[3:1030]
    s3.pipe(f"{BUCKET}/obj", second)  # replaced: the same read is refused, not answered with other bytes
    with pytest.raises(OSError) as info:
        on_loop(s3, 10.0, function, *args, **kwargs)
    assert is_precondition_failed(info.value)
    function, args, kwargs = pinned_read(s3, f"s3://{BUCKET}/obj", f"{BUCKET}/obj", 3, 1030, None)
    assert on_loop(s3, 10.0, function, *args, **kwargs) == second[3:1030]  # not pinned: what is there now


def test_which_read_each_store_and_tag_gets(s3: Any) -> None:
    class Gcs:  # the one method of gcsfs's that a generation-pinned read calls
        async def _cat_file(self, path: str, start: int, end: int, generation: str | None = None) -> bytes:
            return b""

    gcs = Gcs()
    assert pinned_read(gcs, "gcs://b/o", "b/o", 0, 9, "generation:1712") == (
        gcs._cat_file, ("b/o",), {"start": 0, "end": 9, "generation": "1712"})
    # a generation on a store that is not GCS, an ETag on one that is not S3, no tag: a plain read
    assert pinned_read(gcs, "https://h/o", "h/o", 0, 9, "generation:1712")[2] == {"start": 0, "end": 9}
    plain = (s3._cat_file, ("b/o",), {"start": 2, "end": 4})
    assert pinned_read(s3, "s3://b/o", "b/o", 2, 4, "generation:1712") == plain
    assert pinned_read(s3, "s3://b/o", "b/o", 2, 4, None) == plain


# -- the endpoint ------------------------------------------------------------------------------------
def test_the_endpoint_an_s3_filesystem_names(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert endpoint_of(s3, f"s3://{BUCKET}/x") == s3.client_kwargs["endpoint_url"]
    import s3fs  # noqa: PLC0415 - the fixture found it

    plain = s3fs.S3FileSystem(anon=True, skip_instance_cache=True)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    assert endpoint_of(plain, "s3://b/x") is None  # AWS's own: not probed
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    assert endpoint_of(plain, "s3a://b/x") == "http://127.0.0.1:9000"
    assert endpoint_of(plain, "https://h/x") is None  # the variable is S3's alone
    monkeypatch.setenv("AWS_ENDPOINT_URL", "127.0.0.1:9000")  # no scheme: not an endpoint to probe
    assert endpoint_of(plain, "s3://b/x") is None


def test_the_endpoint_a_gcs_filesystem_names(monkeypatch: pytest.MonkeyPatch) -> None:
    gcsfs = pytest.importorskip("gcsfs", reason="gcsfs is not installed (pip install -e '.[gcs]')")
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    cloud = gcsfs.GCSFileSystem(token="anon", skip_instance_cache=True)
    assert endpoint_of(cloud, "gs://b/x") is None  # Google's own: not probed
    given = gcsfs.GCSFileSystem(token="anon", endpoint_url="http://127.0.0.1:4443", skip_instance_cache=True)
    assert endpoint_of(given, "gcs://b/x") == "http://127.0.0.1:4443"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:4443")  # gcsfs adds the scheme
    emulated = gcsfs.GCSFileSystem(token="anon", skip_instance_cache=True)
    assert endpoint_of(emulated, "gs://b/x") == "http://127.0.0.1:4443"


# -- does the endpoint listen ------------------------------------------------------------------------
@pytest.fixture
def listening() -> Iterator[int]:
    """A port of 127.0.0.1 that accepts connections."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def closed_port() -> int:
    """A port of 127.0.0.1 that nothing listens at (bound, then let go)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_listening_endpoint_is_no_error(listening: int) -> None:
    assert connection_refused(f"http://127.0.0.1:{listening}", 1.0) is None
    # the user, the password and the path are no part of the address
    assert connection_refused(f"http://user:pw@127.0.0.1:{listening}/bucket/key", 1.0) is None


def test_a_closed_port_is_a_refused_connection() -> None:
    refused = connection_refused(f"http://127.0.0.1:{closed_port()}", 1.0)
    assert isinstance(refused, ConnectionRefusedError)


def test_the_address_and_the_time_given_to_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[tuple[str, int], float]] = []

    def nobody(address: tuple[str, int], timeout: float) -> socket.socket:
        asked.append((address, timeout))
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(socket, "create_connection", nobody)
    for endpoint, timeout in (("https://storage.example", 20.0), ("http://minio.local", 0.5),
                              ("http://[::1]:9000/x", 2.0), ("http://host:notaport", 1.0)):
        assert isinstance(connection_refused(endpoint, timeout), ConnectionRefusedError)
    # the default port of the scheme; a probe waits 3 s at most; brackets of an IPv6 address taken off
    assert asked == [(("storage.example", 443), 3.0), (("minio.local", 80), 0.5), (("::1", 9000), 2.0),
                     (("host:notaport", 80), 1.0)]


def test_an_unknown_host_is_an_error_and_a_slow_one_cannot_be_told(monkeypatch: pytest.MonkeyPatch) -> None:
    unknown = socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    def unresolved(address: tuple[str, int], timeout: float) -> socket.socket:
        raise unknown

    monkeypatch.setattr(socket, "create_connection", unresolved)
    assert connection_refused("http://nowhere.invalid:9000", 1.0) is unknown

    def slow(address: tuple[str, int], timeout: float) -> socket.socket:
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "create_connection", slow)
    assert connection_refused("http://10.255.255.1:9000", 1.0) is None
