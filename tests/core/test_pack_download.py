"""A whole pack at a URL copied to a local folder (``packload.core.pack_download``), on moto's S3 server
(tests/object_store.py): a shards pack's shards, index and manifest (the manifest last, nothing else
of the folder), an LMDB object, a pack at a bucket's root; the one-line refusals of a missing pack,
an unfinished one and one replaced while it is copied; and the local name a URL gives."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[dev]')")
pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")

from packload import pack, verify  # noqa: E402
from packload.core import remote  # noqa: E402
from packload.core.errors import IncompletePackError, PackChangedError  # noqa: E402
from packload.core.format import INDEX_NAME, MANIFEST_NAME  # noqa: E402
from packload.core.pack_download import download_pack, url_name  # noqa: E402
from packload.core.remote_errors import RemoteMissingError  # noqa: E402
from tests.image_factory import make_image_folder  # noqa: E402
from tests.object_store import ObjectStore  # noqa: E402

BUCKET = "pack-download"


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``p.shards`` and ``p.lmdb`` of one small image folder."""
    root = tmp_path_factory.mktemp("pack-download")
    make_image_folder(root / "src", per_class=3, seed=5)
    pack(root / "src", root / "p.shards", workers=1, progress=False)
    pack(root / "src", root / "p.lmdb", workers=1, progress=False)
    return root


@pytest.fixture(scope="module")
def store() -> ObjectStore:
    with ObjectStore() as s:
        s.make_bucket(BUCKET)
        yield s


@pytest.fixture(scope="module")
def fs(store: ObjectStore) -> Any:
    return store.filesystem()


def upload(fs: Any, folder: Path, prefix: str, extra: dict[str, bytes] | None = None) -> None:
    """Every file of ``folder`` as an object under ``prefix``, and ``extra`` objects beside them."""
    fs.pipe({f"{prefix}/{path.name}": path.read_bytes() for path in sorted(folder.iterdir())} | {
        f"{prefix}/{name}": data for name, data in (extra or {}).items()})


def same_files(copy: Path, local: Path) -> None:
    assert sorted(os.listdir(copy)) == sorted(os.listdir(local))
    for path in local.iterdir():
        assert (copy / path.name).read_bytes() == path.read_bytes(), path.name


def test_a_shards_pack_is_copied_whole_its_manifest_last(store: ObjectStore, fs: Any, packs: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    upload(fs, packs / "p.shards", f"{BUCKET}/whole.shards", extra={"notes.txt": b"not the pack's"})
    before = len(store.proxy.requests)
    copy = Path(download_pack(f"s3://{BUCKET}/whole.shards/", tmp_path, store.options, progress=True))
    assert copy == tmp_path / "whole.shards"
    same_files(copy, packs / "p.shards")  # no notes.txt
    gets = [path for method, path, _ in store.proxy.requests[before:] if method == "GET" and "whole.shards/" in path]
    assert gets[-1].split("?")[0].endswith(f"/{MANIFEST_NAME}") and not any("notes.txt" in path for path in gets)
    assert verify(copy, progress=False)["ok"]
    done = [line for line in capsys.readouterr().err.splitlines() if ": done " in line]
    assert len(done) == 1 and done[0].startswith("download whole.shards: done ") and " MB (100%)" in done[0]


def test_an_lmdb_object_is_copied(store: ObjectStore, fs: Any, packs: Path, tmp_path: Path) -> None:
    fs.pipe_file(f"{BUCKET}/one/p.lmdb", (packs / "p.lmdb").read_bytes())
    copy = download_pack(f"s3://{BUCKET}/one/p.lmdb", tmp_path, store.options)
    assert copy == str(tmp_path / "p.lmdb")
    assert Path(copy).read_bytes() == (packs / "p.lmdb").read_bytes() and verify(copy, progress=False)["ok"]


def test_a_pack_at_a_buckets_root_is_called_pack(store: ObjectStore, fs: Any, packs: Path, tmp_path: Path) -> None:
    store.make_bucket("pack-download-root")
    upload(fs, packs / "p.shards", "pack-download-root")
    copy = Path(download_pack("s3://pack-download-root", tmp_path, store.options))
    assert copy == tmp_path / "pack"
    same_files(copy, packs / "p.shards")


def test_nothing_there_is_no_such_pack(store: ObjectStore, tmp_path: Path) -> None:
    with pytest.raises(RemoteMissingError) as info:
        download_pack(f"s3://{BUCKET}/nothing.shards", tmp_path, store.options)
    assert str(info.value) == (f"s3://{BUCKET}/nothing.shards: no such pack (nothing is stored under it); give the URL "
                               "`pack` wrote to")
    with pytest.raises(RemoteMissingError, match="the bucket does not exist"):
        download_pack("s3://no-such-bucket-here/p.shards", tmp_path, store.options)
    assert os.listdir(tmp_path) == []


def test_an_unfinished_pack_is_refused_before_anything_is_copied(store: ObjectStore, fs: Any, packs: Path,
                                                                 tmp_path: Path) -> None:
    shards = packs / "p.shards"
    upload(fs, shards, f"{BUCKET}/half.shards")
    fs.rm_file(f"{BUCKET}/half.shards/{MANIFEST_NAME}")
    with pytest.raises(IncompletePackError) as info:
        download_pack(f"s3://{BUCKET}/half.shards", tmp_path, store.options)
    assert str(info.value) == (f"s3://{BUCKET}/half.shards: no {MANIFEST_NAME}: this pack did not finish (or is being "
                               "written now); pack it again, or wait for the pack to finish")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(("kind", "replaced"), [("shards", INDEX_NAME), ("lmdb", "")])
def test_a_pack_replaced_while_it_is_copied_is_refused(store: ObjectStore, fs: Any, packs: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch, kind: str,
                                                       replaced: str) -> None:
    """The first object to be copied is overwritten just before its first read: the read, pinned
    to the version listed, is refused, and so is the copy: never half of one pack and half of another."""
    url = f"s3://{BUCKET}/{tmp_path.name}/p.{kind}"
    if kind == "shards":
        upload(fs, packs / "p.shards", url[5:])
    else:
        fs.pipe_file(url[5:], (packs / "p.lmdb").read_bytes())
    download = remote.RemoteStore.download

    def overwritten_first(self: remote.RemoteStore, name: str, *args: Any) -> None:
        if name == replaced:
            fs.pipe_file(self.full(name), b"another pack's bytes")
        return download(self, name, *args)

    monkeypatch.setattr(remote.RemoteStore, "download", overwritten_first)
    with pytest.raises(PackChangedError) as info:
        download_pack(url, tmp_path, store.options)
    where = f"{url}/{replaced}" if replaced else url
    assert str(info.value) == (f"{url}: the pack changed while it was copied ({where}: replaced or deleted since it "
                               "was listed); run the command again once it is written")


@pytest.mark.parametrize(("url", "name"), [
    ("s3://b/x/p.shards", "p.shards"), ("s3://b/x/p.shards///", "p.shards"),
    ("https://h/a/p.lmdb?X-Amz-Signature=abc", "p.lmdb"), ("https://h/a/p.lmdb#part", "p.lmdb"),
    ("gs://b/x/p.lmdb?generation=17#frag", "p.lmdb"), ("s3://bucket", ""), ("s3://bucket/", ""),
])
def test_url_name(url: str, name: str) -> None:
    assert url_name(url) == name
