"""Shared by every test: object-store clients made in one test are not reused by the next."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def fresh_object_store_clients() -> Iterator[None]:
    """fsspec keeps one client per set of options; a client made from the environment
    (``AWS_ENDPOINT_URL``, set by tests that drive the command line) would otherwise be reused by a
    later test whose environment names another server."""
    yield
    s3fs = sys.modules.get("s3fs")
    if s3fs is not None:
        s3fs.S3FileSystem.clear_instance_cache()
