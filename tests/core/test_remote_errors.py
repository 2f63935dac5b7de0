"""The errors of requests to object stores (``packload.core.remote_errors``): what each failure of a
store's client is (a timeout, a refused connection, a read pinned to a version refused, one that no
retry cures), read from real exception objects of botocore and aiohttp and from exception chains as
clients raise them; and the exact one-line error made of each. (The kinds of error by their
keywords, and retries, are in tests/core/test_remote.py.)"""

from __future__ import annotations

import errno
import socket
import warnings

import pytest

from packload.core.errors import PackChangedError, PackFormatError, PackloadError, WriteError
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

ENDPOINT_S3 = ("check the endpoint (AWS_ENDPOINT_URL or storage_options' endpoint_url, if you use another "
               "server) and the network")


def raised(inner: BaseException, outer: BaseException, *, how: str) -> BaseException:
    """``outer`` raised while ``inner`` was handled, as a client wraps an error: ``from`` it
    (``__cause__``), implicitly (``__context__``), or ``from None`` (the context suppressed)."""
    try:
        try:
            raise inner
        except BaseException as first:
            if how == "from":
                raise outer from first
            if how == "from None":
                raise outer from None
            raise outer  # noqa: B904 - the implicit chain is what is tested
    except BaseException as caught:
        return caught


# -- what each failure is ----------------------------------------------------------------------
def test_timeouts_are_found_anywhere_in_the_chain_a_traceback_shows() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.settimeout(0.001)
        with pytest.raises(OSError) as waited:  # a real socket's timeout: nothing comes
            left.recv(1)
    assert is_timeout(waited.value) and is_timeout(TimeoutError())
    assert is_timeout(raised(TimeoutError(), OSError("read failed"), how="from"))
    assert is_timeout(raised(TimeoutError(), OSError("read failed"), how="context"))
    # `raise ... from None` hides the context from a traceback: it is no longer this error's cause
    assert not is_timeout(raised(TimeoutError(), OSError("read failed"), how="from None"))
    assert not is_timeout(ConnectionResetError("reset"))


def test_a_chain_that_loops_is_read_once() -> None:
    a, b = OSError("a"), OSError("b")
    a.__cause__, b.__cause__ = b, a
    assert not is_timeout(a) and not is_permanent(a)
    b.__cause__ = TimeoutError()  # the loop broken: the timeout below is seen
    assert is_timeout(a)


def test_client_timeouts_by_their_class_name() -> None:
    exceptions = pytest.importorskip("botocore.exceptions")
    read = exceptions.ReadTimeoutError(endpoint_url="http://127.0.0.1:9")
    assert not isinstance(read, TimeoutError) and is_timeout(read)  # "Timeout" in its class's name
    assert is_timeout(exceptions.ConnectTimeoutError(endpoint_url="http://127.0.0.1:9"))
    assert not is_permanent(read)  # a timeout is retried


def test_a_refused_pinned_read_is_precondition_failed() -> None:
    exceptions = pytest.importorskip("botocore.exceptions")
    by_code = exceptions.ClientError({"Error": {"Code": "PreconditionFailed", "Message": "did not hold"}}, "GetObject")
    by_status = exceptions.ClientError({"Error": {}, "ResponseMetadata": {"HTTPStatusCode": 412}}, "GetObject")
    other = exceptions.ClientError({"Error": {"Code": "SlowDown"}, "ResponseMetadata": {"HTTPStatusCode": 503}},
                                   "GetObject")
    assert is_precondition_failed(by_code) and is_precondition_failed(by_status)
    assert is_precondition_failed(raised(by_code, OSError("wrapped"), how="from"))
    assert not is_precondition_failed(other) and not is_permanent(other)
    assert is_permanent(by_code)  # the same version will not come back: not retried


def test_an_aiohttp_412_is_precondition_failed() -> None:
    aiohttp = pytest.importorskip("aiohttp")
    multidict, yarl = pytest.importorskip("multidict"), pytest.importorskip("yarl")
    url = yarl.URL("https://storage.example/b/p.lmdb")
    request = aiohttp.RequestInfo(url, "GET", multidict.CIMultiDictProxy(multidict.CIMultiDict()), url)
    assert is_precondition_failed(aiohttp.ClientResponseError(request, (), status=412, message="Precondition Failed"))
    assert not is_precondition_failed(aiohttp.ClientResponseError(request, (), status=404, message="Not Found"))


@pytest.mark.parametrize("exc", [FileNotFoundError("x"), PermissionError("x"), IsADirectoryError("x"),
                                 NotADirectoryError("x"), OSError(errno.EACCES, "denied"), ValueError("bad range"),
                                 TypeError("bad argument"), PackFormatError("damaged"),
                                 socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
                                 ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
                                 OSError("Forbidden: the caller does not have storage.objects.get access")])
def test_permanent_errors(exc: BaseException) -> None:
    assert is_permanent(exc)


@pytest.mark.parametrize("exc", [ConnectionResetError("reset"), TimeoutError(), ShortReadError("3 bytes of 8"),
                                 OSError("Server disconnected"), BrokenPipeError()])
def test_errors_a_retry_may_cure(exc: BaseException) -> None:
    assert not is_permanent(exc)


def test_the_classes_say_what_callers_catch() -> None:
    assert issubclass(RemoteMissingError, FileNotFoundError) and issubclass(RemoteMissingError, RemoteError)
    assert issubclass(ObjectChangedError, PackChangedError) and issubclass(ObjectChangedError, RemoteError)
    assert issubclass(RemoteError, PackloadError) and not issubclass(ShortReadError, PackloadError)


# -- the one-line error --------------------------------------------------------------------------
def test_our_own_errors_pass_unchanged() -> None:
    mine = PackFormatError("p.lmdb: damaged")
    assert remote_error(mine, "s3://b/p.lmdb", writing=True) is mine


def test_a_missing_object_names_what_to_give() -> None:
    error = remote_error(FileNotFoundError("bkt/x.shards/index.npy"), "s3://bkt/x.shards/index.npy")
    assert type(error) is RemoteMissingError
    assert str(error) == ("s3://bkt/x.shards/index.npy: no such object; check the URL (give the shards folder or "
                          ".lmdb object that `pack` wrote)")


def test_missing_credentials_from_botocore() -> None:
    exceptions = pytest.importorskip("botocore.exceptions")
    partial = exceptions.PartialCredentialsError(provider="env", cred_var="AWS_SECRET_ACCESS_KEY")
    error = remote_error(partial, "s3://b/p.lmdb", writing=True)  # no credentials is no write error
    assert type(error) is RemoteError
    assert str(error).startswith("s3://b/p.lmdb: no credentials for the object store, or they were refused "
                                 "(Partial credentials found in env, missing: AWS_SECRET_ACCESS_KEY); set "
                                 "AWS_ACCESS_KEY_ID")


def test_a_forbidden_answer_redacts_the_clients_words() -> None:
    aiohttp = pytest.importorskip("aiohttp")
    multidict, yarl = pytest.importorskip("multidict"), pytest.importorskip("yarl")
    signed = "https://h/p.lmdb?X-Goog-Signature=abc123"
    request = aiohttp.RequestInfo(yarl.URL(signed), "GET", multidict.CIMultiDictProxy(multidict.CIMultiDict()),
                                  yarl.URL(signed))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # aiohttp's `code` is deprecated for `status`: read without a warning
        error = remote_error(aiohttp.ClientResponseError(request, (), status=403, message="Forbidden"), signed)
    assert type(error) is RemoteError
    assert str(error) == ("https://h/p.lmdb?X-Goog-Signature=REDACTED: access denied (403, message='Forbidden', "
                          "url='https://h/p.lmdb?X-Goog-Signature=REDACTED'); check the credentials and the "
                          "bucket's permissions")


def test_an_unknown_host_could_not_connect() -> None:
    unknown = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    error = remote_error(raised(unknown, OSError("Cannot connect to host nowhere.invalid:443"), how="context"),
                         "s3://b/p.lmdb", writing=True)
    assert type(error) is WriteError
    assert str(error) == ("s3://b/p.lmdb: could not connect to the object store (OSError: Cannot connect to host "
                          f"nowhere.invalid:443); {ENDPOINT_S3}")


def test_a_timeout_names_the_attempts_the_time_and_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    error = remote_error(TimeoutError(), "s3://b/p.lmdb", attempts=3, seconds=41.6, timeout=20.0)
    assert type(error) is RemoteError
    assert str(error) == ("s3://b/p.lmdb: the object store did not answer after 3 attempt(s) in 42 s (each may take "
                          f"20 s, and a second more per MiB moved); {ENDPOINT_S3}, then retry; on a slow link raise "
                          "PACKLOAD_TIMEOUT (seconds)")
    monkeypatch.setenv("PACKLOAD_TIMEOUT", "7.5")  # not given: the timeout in force is named
    assert "(each may take 7.5 s," in str(remote_error(TimeoutError(), "s3://b/p.lmdb"))
    assert " attempt(s) (each" in str(remote_error(TimeoutError(), "s3://b/p.lmdb"))  # no time: none said


def test_any_other_failure_is_one_line_of_at_most_200_characters_of_the_clients_words() -> None:
    words = "Server disconnected\n   while reading " + "x" * 500
    error = remote_error(OSError(words), "gs://b/p.shards", attempts=5, seconds=3.2, writing=True)
    assert type(error) is WriteError and "\n" not in str(error)
    quoted = " ".join(words.split())[:200]
    assert str(error) == ("gs://b/p.shards: the object store did not answer after 5 attempt(s) in 3 s (OSError: "
                          f"{quoted}); check the endpoint (STORAGE_EMULATOR_HOST or storage_options' endpoint_url, "
                          "if you use another server) and the network, then retry")


def test_an_error_without_words_is_named_by_its_class() -> None:
    assert str(remote_error(ConnectionResetError(), "https://h/p.lmdb", attempts=1)) == (
        "https://h/p.lmdb: the object store did not answer after 1 attempt(s) (ConnectionResetError: "
        "ConnectionResetError); check the endpoint and the network, then retry")
