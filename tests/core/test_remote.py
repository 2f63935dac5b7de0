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


def test_display_url_hides_credentials_and_signatures():
    from packload.core.urls import REDACTED, display_url, redact_text

    signed = ("https://bkt.s3.amazonaws.com/p.lmdb?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAEXAMPLE"
              "%2F20261205%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Signature=deadbeef&X-Amz-Expires=600")
    shown = display_url(signed)
    assert "AKIAEXAMPLE" not in shown and "deadbeef" not in shown
    assert shown.startswith("https://bkt.s3.amazonaws.com/p.lmdb?X-Amz-Algorithm=" + REDACTED)
    assert display_url("https://user:hunter2@host/x.lmdb") == "https://host/x.lmdb"
    assert display_url("s3://bkt/p.shards") == "s3://bkt/p.shards"  # nothing to hide: as given
    assert "s3cr3t" not in display_url("gs://b/x#access_token=s3cr3t")
    assert "pw" not in display_url("simplecache::https://u:pw@host/x?sig=1")
    text = f"Client error for url '{signed}': 403 Forbidden; sig=abc123 token=xyz"
    assert not any(word in redact_text(text) for word in ("AKIAEXAMPLE", "deadbeef", "abc123", "xyz"))
    assert "403 Forbidden" in redact_text(text)


def test_errors_show_the_url_without_its_secrets():
    url = "https://user:hunter2@host/p.lmdb?X-Amz-Signature=deadbeef"
    error = ConnectionResetError(f"reset while reading {url}")
    text = str(remote_error(error, url))
    assert "hunter2" not in text and "deadbeef" not in text and "https://host/p.lmdb?" in text
    assert "deadbeef" not in repr(RemoteStore(url))


class _Clock:
    """A virtual clock for ``remote.time``: sleeping advances it, and so does each attempt."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_retries_stop_once_their_time_is_used_up(monkeypatch):
    """Each attempt here takes 3 virtual seconds; attempts stop starting once the budget is past."""
    clock = _Clock(3.0)
    monkeypatch.setattr(remote, "time", clock)
    calls = []

    def slow_timeout():
        calls.append(clock.now)
        clock.now += clock.step
        raise TimeoutError("read timed out")

    with pytest.raises(PackloadError, match=r"did not answer after 2 attempt\(s\) in 6 s") as info:
        retried(slow_timeout, "s3://b/x", until=5.0, timeout=3.0)
    assert calls == [0.0, 3.2] and "PACKLOAD_TIMEOUT" in str(info.value)


def test_a_timeout_asks_whether_the_endpoint_refuses(monkeypatch):
    """A deadline passed while the client retried a refused connection on its own: said as such."""
    monkeypatch.setattr(remote, "RETRY_PAUSE", 0.001)
    probes = []

    def probe():
        probes.append(1)
        return ConnectionRefusedError(111, "Connection refused")

    def stalled():
        raise TimeoutError()

    with pytest.raises(PackloadError, match="could not connect"):
        retried(stalled, "s3://b/x", probe=probe)
    assert probes == [1]


def test_the_timeout_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("PACKLOAD_TIMEOUT", "2.5")
    assert remote.request_timeout() == 2.5 and RemoteStore("s3://b/x").timeout == 2.5
    assert RemoteStore("s3://b/x", timeout=7).timeout == 7
    for bad in ("0", "-3", "soon", "inf"):
        monkeypatch.setenv("PACKLOAD_TIMEOUT", bad)
        with pytest.raises(UsageError, match="PACKLOAD_TIMEOUT") as info:
            remote.request_timeout()
        assert "\n" not in str(info.value)
    assert remote.attempt_deadline(10.0, 8 << 20) == 18.0  # a second more per MiB moved


@pytest.mark.parametrize("scheme", ["file", "memory"])
def test_ranged_reads_of_a_synchronous_filesystem(tmp_path, scheme):
    """fsspec's local and memory filesystems have no coroutines: a read of theirs (pinned to a
    version or not: they give none) is their ``cat_file``."""
    pytest.importorskip("fsspec", reason="fsspec is not installed")
    url = f"file://{tmp_path}" if scheme == "file" else f"memory://{tmp_path.name}"
    store = RemoteStore(url)
    data = bytes(range(256)) * 4
    store.write_bytes("blob", data)
    assert store.read_range("blob", 5, 900) == data[5:900]
    assert store.read_range("blob", 0, len(data), tag='etag:"abc"') == data
    assert store.read_all("blob", len(data)) == data
