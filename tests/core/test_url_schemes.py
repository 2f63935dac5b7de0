"""What packload knows of URL schemes (``packload.core.url_schemes``): which strings are URLs, the
scheme's family (its aliases taken as the store's own), the extra that installs its filesystem, and
the credentials and endpoint hints that errors name. (The s3 and gs hints as ``remote_error`` words
them are in tests/core/test_remote.py; here, the aliases, the case of a scheme and the exact words.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from packload.core.url_schemes import (
    CREDENTIALS_OF_SCHEME,
    credentials_hint,
    endpoint_hint,
    install_hint,
    is_url,
    scheme_family,
    scheme_of,
)


@pytest.mark.parametrize("text", ["s3a://b/x", "S3://B/x.lmdb", "git+ssh://host/x", "file:///tmp/x.shards",
                                  "x-y.z://h"])
def test_urls_of_any_scheme_are_urls(text: str) -> None:
    assert is_url(text)


@pytest.mark.parametrize("thing", ["3s://b/x", "://b/x", "s3:/b/x", "s3//b/x", " s3://b/x", "b/s3://x", "",
                                   b"s3://b/x", Path("s3://b/x"), None, 42])
def test_what_is_not_a_url(thing: object) -> None:
    """A scheme starts with a letter at the very start, and only a ``str`` is a URL: bytes and a
    ``Path`` (which folds ``//`` into ``/``) are local paths."""
    assert not is_url(thing)


def test_the_scheme_is_lowercased_and_aliases_join_their_family() -> None:
    assert scheme_of("S3A://Bucket/Key") == "s3a" and scheme_family("S3A://Bucket/Key") == "s3"
    assert scheme_family("GCS://b/x") == "gs" and scheme_family("gs://b/x") == "gs"
    assert scheme_family("https://h/x") == "https" and scheme_family("abfs://c/x") == "abfs"


def test_aliases_install_the_extra_of_their_store() -> None:
    assert install_hint("s3a://b/x") == 'pip install -e ".[s3]"'
    assert install_hint("GCS://b/x") == install_hint("gcs://b/x") == 'pip install -e ".[gcs]"'
    assert install_hint("abfs://c/x") == ('pip install -e ".[s3]" (fsspec, and the filesystem package of the '
                                          "URL's scheme)")


def test_aliases_get_their_stores_credentials_hint() -> None:
    assert credentials_hint("s3a://b/x") == credentials_hint("S3://b/x") == CREDENTIALS_OF_SCHEME["s3"]
    assert credentials_hint("gcs://b/x") == CREDENTIALS_OF_SCHEME["gs"]
    assert credentials_hint("https://h/x") == ("pass the credentials the filesystem of this URL takes in "
                                               "storage_options (see its documentation)")


def test_endpoint_hint_names_the_variable_of_the_family_only() -> None:
    assert endpoint_hint("s3a://b/x") == ("check the endpoint (AWS_ENDPOINT_URL or storage_options' endpoint_url, "
                                          "if you use another server) and the network")
    assert endpoint_hint("GCS://b/x") == ("check the endpoint (STORAGE_EMULATOR_HOST or storage_options' "
                                          "endpoint_url, if you use another server) and the network")
    assert endpoint_hint("https://h/x") == "check the endpoint and the network"
