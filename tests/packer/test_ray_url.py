"""``pack --engine ray`` with object-store URLs as source and destination (moto's S3 server on
127.0.0.1, the shared local Ray instance): each pack, shards or LMDB, equals a local pack of the
same folder, record by record; missing buckets and prefixes fail in one line; a failed run resumes
from the store."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[dev]')")
pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")

from packload import PackloadError, pack, pack_ray  # noqa: E402
from packload.cli import main  # noqa: E402
from packload.core.format import MANIFEST_NAME, RAY_RUN_NAME, TASK_DONE_NAME  # noqa: E402
from packload.core.pack_download import download_pack  # noqa: E402
from packload.core.remote import RemoteStore  # noqa: E402
from packload.loaders.read import PackReader  # noqa: E402
from tests.image_factory import make_image_folder, write_broken_files, write_hidden_and_stray  # noqa: E402
from tests.object_store import ObjectStore  # noqa: E402
from tests.packer.test_ray_engine import manifest_of, records_of  # noqa: E402
from tests.ray_faults import logged_tasks  # noqa: E402
from tests.ray_local import LocalRay, local_ray  # noqa: E402, F401 - a fixture

BUCKET = "rayurl"
SHARD = 1 << 16
TASK_FILES = 8


@pytest.fixture(scope="module")
def store() -> ObjectStore:
    """The S3 server, started before Ray so that Ray's workers inherit its (fake) credentials."""
    with ObjectStore() as s:
        s.make_bucket(BUCKET)
        yield s


@pytest.fixture(scope="module")
def ray_here(store: ObjectStore, local_ray: LocalRay) -> LocalRay:  # noqa: F811 - the fixture imported above
    return local_ray


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory, store: ObjectStore) -> Path:
    """About 60 small images in three classes (a nested folder in one), broken files, hidden and
    stray files; also uploaded under s3://rayurl/images/."""
    root = tmp_path_factory.mktemp("rayurl-src") / "images"
    make_image_folder(root, classes=("ant", "bee", "cow"), per_class=16)
    make_image_folder(root / "cow" / "deeper", classes=("z",), per_class=3)
    write_broken_files(root / "bee")
    write_hidden_and_stray(root)
    fs = store.filesystem()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        fs.pipe_file(f"{BUCKET}/images/{path.relative_to(root).as_posix()}", path.read_bytes())
    return root


@pytest.fixture(scope="module")
def local_pack(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rayurl-local") / "local.shards"
    pack(source, out, workers=1, progress=False, shard_size=SHARD)
    return out


@pytest.fixture(scope="module")
def local_lmdb(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rayurl-local") / "local.lmdb"
    pack(source, out, workers=1, progress=False)
    return out


def _fetched(url: str, store: ObjectStore, tmp_path: Path) -> Path:
    folder = tmp_path / "fetched"
    folder.mkdir()
    return Path(download_pack(url, folder, store.options))


def _same_pack(pack_path: Path, local_pack: Path) -> None:
    assert records_of(pack_path) == records_of(local_pack)
    assert manifest_of(pack_path) == manifest_of(local_pack)  # labels, skipped and ignored lists, counts


def _names(store: ObjectStore, prefix: str) -> list[str]:
    return sorted(RemoteStore(f"s3://{BUCKET}/{prefix}", store.options).listing_all())


def test_url_source_to_a_local_pack(ray_here: LocalRay, store: ObjectStore, source: Path, local_pack: Path,
                                    tmp_path: Path) -> None:
    out = tmp_path / "from-url.shards"
    result = pack_ray(f"s3://{BUCKET}/images/", out, task_files=TASK_FILES, shard_size=SHARD, progress=False,
                      storage_options=store.options)
    assert result["records"] == len(records_of(local_pack)) > 50 and result["ray"]["tasks"] > 5
    _same_pack(out, local_pack)
    assert os.listdir(tmp_path) == ["from-url.shards"]


def test_local_source_to_a_url(ray_here: LocalRay, store: ObjectStore, source: Path, local_pack: Path,
                               tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/out/local-src.shards"
    result = pack_ray(source, url, task_files=TASK_FILES, shard_size=SHARD, progress=False,
                      storage_options=store.options)
    assert result["destination"] == url and result["pack_bytes"] == sum(
        RemoteStore(url, store.options).listing().values())
    _same_pack(_fetched(url, store, tmp_path), local_pack)
    names = _names(store, "out/local-src.shards")
    assert names == ["index.bin", "manifest.json"] + [f"shard-{k:05d}.bin" for k in range(len(names) - 2)]
    assert _names(store, "out/local-src.shards.partial") == []  # the staging prefix is gone


def test_url_to_url(ray_here: LocalRay, store: ObjectStore, source: Path, local_pack: Path, tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/out/both.shards"
    pack_ray(f"s3://{BUCKET}/images", url, task_files=TASK_FILES, shard_size=SHARD, progress=False,
             storage_options=store.options)
    _same_pack(_fetched(url, store, tmp_path), local_pack)
    with pytest.raises(PackloadError, match="exists; add --overwrite"):
        pack_ray(f"s3://{BUCKET}/images", url, task_files=TASK_FILES, shard_size=SHARD, progress=False,
                 storage_options=store.options)


def test_resume_after_a_failed_run_keeps_the_tasks_on_the_store(ray_here: LocalRay, store: ObjectStore,
                                                                 source: Path, local_pack: Path,
                                                                 tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/out/resumed.shards"
    ray_here.log.unlink(missing_ok=True)
    ray_here.marker.write_text("4")  # task 4 fails every attempt: the run fails
    try:
        with pytest.raises(PackloadError, match="Ray task 4 .* --resume"):
            pack_ray(source, url, task_files=TASK_FILES, shard_size=SHARD, progress=False, max_retries=1,
                     storage_options=store.options)
    finally:
        ray_here.marker.unlink(missing_ok=True)
    staged = _names(store, "out/resumed.shards.partial")
    assert RAY_RUN_NAME in staged and "task-00000/" + TASK_DONE_NAME in staged
    assert "task-00004/" + TASK_DONE_NAME not in staged
    assert MANIFEST_NAME not in _names(store, "out/resumed.shards")  # never looks finished
    with pytest.raises(PackloadError, match="unfinished pack is there; add --resume"):
        pack_ray(source, url, task_files=TASK_FILES, shard_size=SHARD, progress=False, storage_options=store.options)
    first_run = logged_tasks(ray_here.log)
    result = pack_ray(source, url, shard_size=SHARD, progress=False, resume=True, storage_options=store.options)
    again = logged_tasks(ray_here.log)[len(first_run):]
    assert 4 in again and result["ray"]["tasks_kept"] == result["ray"]["tasks"] - len(set(again)) > 0
    assert 0 not in again  # a task finished before is not run again
    _same_pack(_fetched(url, store, tmp_path), local_pack)
    assert _names(store, "out/resumed.shards.partial") == []


def _same_lmdb(url: str, store: ObjectStore, local_lmdb: Path, tmp_path: Path) -> None:
    fetched = _fetched(url, store, tmp_path)
    assert records_of(fetched) == records_of(local_lmdb)
    assert manifest_of(fetched) == manifest_of(local_lmdb)
    with PackReader(fetched) as a, PackReader(local_lmdb) as b:  # the same chunks: the same index
        assert a.index_bytes() == b.index_bytes()


@pytest.mark.parametrize("src", ["local", "url"])
def test_an_lmdb_pack_at_a_url(ray_here: LocalRay, store: ObjectStore, source: Path, local_lmdb: Path,
                               tmp_path: Path, src: str) -> None:
    url = f"s3://{BUCKET}/out/{src}-src.lmdb"
    origin = source if src == "local" else f"s3://{BUCKET}/images/"
    result = pack_ray(origin, url, task_files=TASK_FILES, shard_size=SHARD, progress=False,
                      storage_options=store.options)
    assert result["backend"] == "lmdb" and result["destination"] == url and result["ray"]["tasks"] > 5
    assert result["pack_bytes"] == RemoteStore(url, store.options).size() and result["ray"]["scan_tasks"] == 3
    _same_lmdb(url, store, local_lmdb, tmp_path)
    assert _names(store, f"out/{src}-src.lmdb.partial-tasks") == []  # the staging prefix is gone
    assert RemoteStore(url, store.options).kind() == "object"  # one object: the LMDB file


def test_an_lmdb_pack_at_a_url_is_replaced_only_with_overwrite(ray_here: LocalRay, store: ObjectStore,
                                                               source: Path, local_lmdb: Path,
                                                               tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/out/again.lmdb"
    RemoteStore(url, store.options).upload(local_lmdb, "")  # an older pack of packload's
    with pytest.raises(PackloadError, match="a pack is there; add --overwrite"):
        pack_ray(source, url, task_files=TASK_FILES, progress=False, storage_options=store.options)
    assert RemoteStore(url, store.options).read_object("") == local_lmdb.read_bytes()  # untouched
    pack_ray(source, url, task_files=TASK_FILES, progress=False, overwrite=True, storage_options=store.options)
    _same_lmdb(url, store, local_lmdb, tmp_path)
    mine = f"s3://{BUCKET}/out/mine.lmdb"
    RemoteStore(mine, store.options).write_bytes("", b"a user's own file")
    with pytest.raises(PackloadError, match="not a pack of packload's"):  # with --overwrite too
        pack_ray(source, mine, task_files=TASK_FILES, progress=False, overwrite=True, storage_options=store.options)
    assert RemoteStore(mine, store.options).read_object("") == b"a user's own file"


def test_an_lmdb_pack_at_a_url_resumes_from_the_store(ray_here: LocalRay, store: ObjectStore, source: Path,
                                                      local_lmdb: Path, tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/out/resumed.lmdb"
    ray_here.log.unlink(missing_ok=True)
    ray_here.marker.write_text("3")  # task 3 fails every attempt: the run fails
    try:
        with pytest.raises(PackloadError, match="Ray task 3 .* --resume"):
            pack_ray(source, url, task_files=TASK_FILES, progress=False, max_retries=1,
                     storage_options=store.options)
    finally:
        ray_here.marker.unlink(missing_ok=True)
    staged = _names(store, "out/resumed.lmdb.partial-tasks")
    assert RAY_RUN_NAME in staged and "task-00000/" + TASK_DONE_NAME in staged
    assert "task-00003/" + TASK_DONE_NAME not in staged
    assert RemoteStore(url, store.options).kind() is None  # nothing that looks like a pack
    with pytest.raises(PackloadError, match="unfinished pack is there; add --resume"):
        pack_ray(source, url, task_files=TASK_FILES, progress=False, storage_options=store.options)
    first_run = logged_tasks(ray_here.log)
    result = pack_ray(source, url, progress=False, resume=True, storage_options=store.options)
    again = logged_tasks(ray_here.log)[len(first_run):]
    assert 3 in again and 0 not in again  # a task finished before is not run again
    assert result["ray"]["tasks_kept"] == result["ray"]["tasks"] - len(set(again)) > 0
    _same_lmdb(url, store, local_lmdb, tmp_path)
    assert _names(store, "out/resumed.lmdb.partial-tasks") == []


@pytest.mark.parametrize(("src", "dst", "expected"), [
    ("s3://no-such-bucket-here/images/", "OUT", "no-such-bucket-here"),
    ("s3://rayurl/nothing-here/", "OUT", "nothing is stored under this prefix"),
    ("SRC", "s3://no-such-bucket-here/x.shards", "bucket does not exist"),
    ("SRC", "s3://no-such-bucket-here/x.lmdb", "bucket does not exist"),
    ("SRC", "s3://rayurl/x.lmdb.partial-tasks", "give the pack a name of its own"),
])
def test_bad_urls_fail_in_one_line(ray_here: LocalRay, store: ObjectStore, source: Path, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                   src: str, dst: str, expected: str) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", store.proxy.endpoint)
    argv = ["pack", str(source) if src == "SRC" else src, str(tmp_path / "o.shards") if dst == "OUT" else dst,
            "--engine", "ray", "--quiet"]
    assert main(argv) != 0
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_a_url_source_needs_the_ray_engine(store: ObjectStore, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pack", f"s3://{BUCKET}/images/", str(tmp_path / "o.shards"), "--quiet"]) != 0
    err = capsys.readouterr().err.strip()
    assert "--engine ray" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o.shards").exists()
