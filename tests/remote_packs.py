"""Helpers (not tests): small packs of generated images, and copies of them put on the test object
store (``tests/object_store.py``), for the tests of the modules that read packs at a URL.

    with store_with_bucket("bkt") as store: ...         # moto's S3 server, a bucket made
    local = small_packs(tmp / "a", ("shards", "lmdb"))   # {"shards": Path, "lmdb": Path}
    two = other_packs(tmp, "lmdb")                       # {"a": Path, "b": Path}: packs of other images
    url = upload(store, local["shards"], "bkt", "a.shards")  # "s3://bkt/a.shards"
    RemoteStore(url, options(store))                          # the stores of one test share one client
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from packload import pack
from tests.image_factory import make_image_folder


def small_packs(root: Path, backends: tuple[str, ...] = ("shards",), *, seed: int = 0, per_class: int = 24,
                shard_size: int = 1 << 16) -> dict[str, Path]:
    """An ImageFolder of two classes under ``root/src`` packed as ``root/p.<backend>`` for each of
    ``backends`` (small shards, so that the pack has several)."""
    make_image_folder(root / "src", classes=("cat", "dog"), per_class=per_class, seed=seed)
    out = {}
    for backend in backends:
        out[backend] = root / f"p.{backend}"
        pack(root / "src", out[backend], shard_size=shard_size, progress=False)
    return out


def other_packs(root: Path, backend: str = "shards", **kwargs: Any) -> dict[str, Path]:
    """Packs ``a`` and ``b`` of ``backend`` (``small_packs``' ``kwargs``) of other images, for a pack
    replaced by another."""
    return {name: small_packs(root / name, (backend,), seed=seed, **kwargs)[backend] for name, seed in (("a", 0), ("b", 3))}


@contextlib.contextmanager
def store_with_bucket(bucket: str) -> Iterator[Any]:
    """moto's S3 server (``tests.object_store.ObjectStore``) with ``bucket`` made: moto keeps one store
    per process, so each test file names a bucket of its own."""
    from tests.object_store import ObjectStore  # noqa: PLC0415 - moto is a dev extra; its tests skip without it

    with ObjectStore() as store:
        store.make_bucket(bucket)
        yield store


def options(store: Any) -> dict[str, Any]:
    """``store``'s fsspec options with fsspec's cache of filesystems on: the stores and filesystems a
    test opens share one client (made once per test: the conftest clears the cache after each),
    where a client of their own each costs a second or so on a busy machine."""
    return {key: value for key, value in store.options.items() if key != "skip_instance_cache"}


def filesystem(store: Any) -> Any:
    """The filesystem of ``store`` through the shared client (``options``)."""
    import s3fs  # noqa: PLC0415 - a dev extra; the tests that use it skip without it

    return s3fs.S3FileSystem(**options(store))


def upload(store: Any, local: Path, bucket: str, key: str, replace: bool = False) -> str:
    """``local`` (a shards folder or an LMDB file) put at ``bucket/key`` (its files at once), in place
    of whatever was there where ``replace``; its URL."""
    fs = filesystem(store)
    if replace:
        fs.rm(f"{bucket}/{key}", recursive=True)
    files = {f"{bucket}/{key}/{path.name}": path for path in sorted(local.iterdir())} if local.is_dir() \
        else {f"{bucket}/{key}": local}
    fs.pipe({target: path.read_bytes() for target, path in files.items()})
    return f"s3://{bucket}/{key}"
