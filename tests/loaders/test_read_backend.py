"""The three pack backends give ``PackReader`` one interface (``loaders.read_backend``): each one,
opened on a pack the test makes, is a ``PackBackend`` whose methods take the Protocol's parameters;
the local ones are ``LocalPackBackend``s, the one at a URL is not (its size is its listing's)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from packload import pack
from packload.loaders.read import PackReader
from packload.loaders.read_backend import LocalPackBackend, PackBackend
from packload.loaders.read_lmdb import LmdbPack
from packload.loaders.read_remote import RemoteShardsPack
from packload.loaders.read_shards import ShardsPack
from tests.image_factory import make_image_folder

BACKENDS = [ShardsPack, LmdbPack, RemoteShardsPack]


def _protocol_methods(protocol: type) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(getattr(protocol, name)) for name in dir(protocol)
            if not name.startswith("_") and inspect.isfunction(getattr(protocol, name))}


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda cls: cls.__name__)
def test_every_backend_takes_the_protocols_parameters(backend: type) -> None:
    wanted = _protocol_methods(LocalPackBackend if backend is not RemoteShardsPack else PackBackend)
    for name, signature in wanted.items():
        got = inspect.signature(getattr(backend, name))
        assert list(got.parameters) == list(signature.parameters), f"{backend.__name__}.{name}{got}"


@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("backends")
    make_image_folder(root / "src", classes=("a", "b"), per_class=5, seed=2)
    out = {}
    for suffix in ("shards", "lmdb"):
        out[suffix] = root / f"p.{suffix}"
        pack(root / "src", out[suffix], workers=1, progress=False)
    return out


@pytest.mark.parametrize("suffix", ["shards", "lmdb"])
def test_an_open_local_pack_is_a_local_backend(packs: dict[str, Path], suffix: str) -> None:
    with PackReader(packs[suffix]) as reader:
        backend = reader._open_pack()
        assert isinstance(backend, PackBackend) and isinstance(backend, LocalPackBackend)
        assert backend.backend == suffix and len(backend.entries) == reader.records == 10
        assert backend.pack_bytes() == reader.pack_bytes() > 0


def test_an_open_pack_at_a_url_is_a_backend_but_not_a_local_one(packs: dict[str, Path], monkeypatch, tmp_path) -> None:
    pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[dev]')")
    pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")
    from tests.object_store import ObjectStore, point_cli_at

    with ObjectStore() as store:
        store.make_bucket("bkt-backend")
        point_cli_at(store, monkeypatch, tmp_path / "cache")
        url = "s3://bkt-backend/p.shards"
        store.filesystem().put(str(packs["shards"]), url, recursive=True)
        with PackReader(url) as reader:
            backend = reader._open_pack()
            assert isinstance(backend, PackBackend) and not isinstance(backend, LocalPackBackend)
            assert len(backend.entries) == 10 and backend.part_names
