"""URL detection, the retry of failed requests and the one-line errors of ``packload.core.remote``."""

from __future__ import annotations

import sys

import pytest

from packload.core import remote
from packload.core.errors import PackloadError, UsageError, WriteError
from packload.core.remote import RemoteStore, install_hint, is_url, remote_error, retried


def test_is_url_tells_urls_from_local_paths(tmp_path):
    assert is_url("s3://bucket/train.shards") and is_url("gs://b/x.lmdb") and is_url("https://host/p.shards")
    assert not is_url("train.shards") and not is_url(str(tmp_path)) and not is_url(tmp_path)
    assert not is_url("C:/data/x.lmdb") and not is_url("s3:/bucket/x")


def test_install_hint_names_the_extra():
    assert install_hint("s3://b/x") == 'pip install -e ".[s3]"'
    assert install_hint("gs://b/x") == 'pip install -e ".[gcs]"'
    assert '".[s3]"' in install_hint("https://host/x")


def test_retried_cures_a_dropped_connection(monkeypatch):
    monkeypatch.setattr(remote, "RETRY_PAUSE", 0.001)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("connection reset by peer")
        return b"data"

    assert retried(flaky, "s3://b/x") == b"data" and len(calls) == 3


def test_retried_gives_up_with_one_line(monkeypatch):
    monkeypatch.setattr(remote, "RETRY_PAUSE", 0.001)
    calls = []

    def down():
        calls.append(1)
        raise TimeoutError("timed out\nafter a while")

    with pytest.raises(PackloadError, match="did not answer after") as info:
        retried(down, "s3://b/x")
    assert len(calls) == remote.RETRIES and "\n" not in str(info.value)
    with pytest.raises(WriteError):
        retried(down, "s3://b/x", writing=True)


def test_missing_objects_are_not_retried(monkeypatch):
    monkeypatch.setattr(remote, "RETRY_PAUSE", 0.001)
    calls = []

    def missing():
        calls.append(1)
        raise FileNotFoundError("bkt/x")

    with pytest.raises(FileNotFoundError, match="no such object"):
        retried(missing, "s3://bkt/x")
    assert len(calls) == 1


def test_error_mapping_names_the_fix():
    class NoCredentialsError(Exception):
        pass

    assert "no credentials" in str(remote_error(NoCredentialsError("Unable to locate credentials"), "s3://b/x"))
    assert "bucket does not exist" in str(remote_error(FileNotFoundError("The specified bucket does not exist"), "s3://b/x"))
    assert "access denied" in str(remote_error(PermissionError("Forbidden"), "s3://b/x"))


def test_without_fsspec_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "fsspec", None)
    with pytest.raises(UsageError, match=r'pip install -e "\.\[gcs\]"') as info:
        RemoteStore("gs://bucket/x.shards").kind()
    assert "\n" not in str(info.value)


def test_unknown_scheme_is_one_line():
    pytest.importorskip("fsspec", reason="fsspec is not installed")
    with pytest.raises(UsageError, match="nosuchscheme") as info:
        RemoteStore("nosuchscheme://bucket/x").kind()
    assert "\n" not in str(info.value)


def test_a_store_pickles_as_its_url():
    import pickle

    store = RemoteStore("s3://bkt/x.shards/", {"anon": True})
    copy = pickle.loads(pickle.dumps(store))
    assert copy.url == "s3://bkt/x.shards" and copy.storage_options == {"anon": True} and copy._fs is None


def test_a_refused_connection_is_not_retried(monkeypatch):
    """The store's client retried the connection already; wrapped as clients wrap it."""
    monkeypatch.setattr(remote, "RETRY_PAUSE", 0.001)
    calls = []

    def refused():
        calls.append(1)
        try:
            raise ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 9)")
        except ConnectionRefusedError as exc:
            raise OSError("Cannot connect to host 127.0.0.1:9") from exc

    with pytest.raises(PackloadError, match="could not connect") as info:
        retried(refused, "s3://b/x")
    assert len(calls) == 1 and "AWS_ENDPOINT_URL" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(WriteError, match="STORAGE_EMULATOR_HOST"):
        retried(refused, "gs://b/x", writing=True)


def test_each_scheme_gets_its_own_credentials_hint():
    class NoCredentialsError(Exception):
        pass

    missing = NoCredentialsError("Unable to locate credentials")
    s3, gs = str(remote_error(missing, "s3://b/x")), str(remote_error(missing, "gcs://b/x"))
    assert "AWS_ACCESS_KEY_ID" in s3 and "GOOGLE_APPLICATION_CREDENTIALS" not in s3
    assert "GOOGLE_APPLICATION_CREDENTIALS" in gs and "AWS_" not in gs
    assert "storage_options" in str(remote_error(missing, "abfs://c/x"))


def test_an_http_status_in_the_chain_is_read():
    class ClientResponseError(Exception):  # as aiohttp's: the status in an attribute
        def __init__(self, status: int) -> None:
            super().__init__(f"{status}, message='Forbidden'")
            self.status = status

    assert "access denied" in str(remote_error(ClientResponseError(403), "https://host/x"))
    assert "no credentials" in str(remote_error(ClientResponseError(401), "https://host/x"))
    assert "did not answer" in str(remote_error(ClientResponseError(503), "https://host/x"))
