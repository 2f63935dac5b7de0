"""Shared by every test: object-store clients made in one test are not reused by the next, and the
test process keeps torch to one intra-op thread."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
import torch

# Tests fork (the benchmarks' fresh child per run, fork DataLoader workers): a process that has
# started torch's OpenMP pool (a large copy, a large torch.equal) leaves its forked children unable
# to use it, and they hang at their first parallel op. One intra-op thread never starts the pool, as
# torch does in DataLoader workers; the forked children inherit it.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def fresh_object_store_clients() -> Iterator[None]:
    """fsspec keeps one client per set of options; a client made from the environment
    (``AWS_ENDPOINT_URL``, set by tests that drive the command line) would otherwise be reused by a
    later test whose environment names another server."""
    yield
    s3fs = sys.modules.get("s3fs")
    if s3fs is not None:
        s3fs.S3FileSystem.clear_instance_cache()
