"""Tests for the test store itself (tests/object_store.py): moto's server answers ranged GETs from
the asked range alone, with the bytes, headers and errors S3 gives."""

from __future__ import annotations

import os
import urllib.error
import urllib.request

import pytest

pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[dev]')")
pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")

from tests.object_store import ObjectStore  # noqa: E402


@pytest.fixture(scope="module")
def store_and_data():
    data = os.urandom((3 << 20) + 12345)
    with ObjectStore() as store:
        store.make_bucket("rng")
        fs = store.filesystem()
        fs.pipe("rng/blob", data)
        yield store, fs, data


@pytest.mark.parametrize(("start", "end"), [(0, 1), (5, 4096), (1 << 20, 3 << 20), (100, None), (0, None)])
def test_ranged_reads_give_exactly_the_range(store_and_data, start, end):
    _, fs, data = store_and_data
    assert fs.cat_file("rng/blob", start=start, end=end) == data[start:end]


def _get(url: str, header: str) -> tuple[int, bytes, str]:
    request = urllib.request.Request(url, headers={"Range": header})
    try:
        with urllib.request.urlopen(request) as answer:
            return answer.status, answer.read(), answer.headers.get("Content-Range", "")
    except urllib.error.HTTPError as exc:
        return exc.code, b"", ""


def test_range_headers_as_s3_answers_them(store_and_data):
    store, fs, data = store_and_data
    url = fs.sign("rng/blob", expiration=600)
    size = len(data)
    assert _get(url, "bytes=-10") == (206, data[-10:], f"bytes {size - 10}-{size - 1}/{size}")
    assert _get(url, "bytes=7-") == (206, data[7:], f"bytes 7-{size - 1}/{size}")
    assert _get(url, f"bytes=10-{size + 50}") == (206, data[10:], f"bytes 10-{size - 1}/{size}")
    assert _get(url, "bytes=0-1,5-6")[:2] == (200, data)  # several ranges: the whole object, as moto does
    assert _get(url, f"bytes={size}-")[0] == 416
    with urllib.request.urlopen(url) as answer:  # no range: the whole object
        assert answer.read() == data
