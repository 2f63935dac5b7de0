"""An LMDB pack at a URL fetched whole into the cache folder (``packload.loaders.remote_lmdb``): its
entry named by the object's URL, size and version (a pack replaced at the URL is fetched again,
beside the old), fetched once while another fetch of it waits, refused before a byte is fetched
where it cannot fit the disk, and a fetch that fails leaving nothing behind. Against moto's S3
server on 127.0.0.1."""

from __future__ import annotations

import errno
import shutil
import threading
from pathlib import Path

import pytest

pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[dev]')")
pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")

from packload.core.errors import UsageError  # noqa: E402
from packload.core.remote import RemoteStore  # noqa: E402
from packload.loaders.read_cache import BlockCache  # noqa: E402
from packload.loaders.remote_lmdb import fetch_lmdb  # noqa: E402
from tests.remote_packs import filesystem, options, other_packs, store_with_bucket, upload  # noqa: E402

BUCKET = "bkt-lmdb"  # moto keeps one store per process: a bucket of this file's own
WAIT = 60  # seconds a test waits for its threads at most (a hung fetch fails it, not the run)


@pytest.fixture(scope="module")
def store():
    with store_with_bucket(BUCKET) as s:
        yield s


@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> dict[str, Path]:
    """Two LMDB packs of other images."""
    return other_packs(tmp_path_factory.mktemp("lmdb"), "lmdb", per_class=6)


def _cache(tmp_path: Path) -> BlockCache:
    return BlockCache(tmp_path / "cache", limit=1 << 24)


def _object_gets(store, tmp_path: Path) -> int:
    return sum(1 for method, path, _ in store.proxy.requests
               if method == "GET" and path.split("?")[0] == f"/{BUCKET}/{tmp_path.name}/p.lmdb")


def _leftovers(cache: BlockCache) -> list[str]:
    """Every file of the cache's pack folders (the marker and the writers' lock file aside)."""
    return sorted(str(p.relative_to(cache.folder)) for p in cache.folder.glob("*/*"))


def test_a_pack_replaced_at_the_url_is_fetched_again_beside_the_old(store, packs, tmp_path):
    url = upload(store, packs["a"], BUCKET, f"{tmp_path.name}/p.lmdb")
    first = Path(fetch_lmdb(RemoteStore(url, options(store)), _cache(tmp_path)))
    assert first.read_bytes() == packs["a"].read_bytes() and first.parent.name.startswith("lmdb-")
    assert Path(fetch_lmdb(RemoteStore(url, options(store)), _cache(tmp_path))) == first  # this version: kept
    upload(store, packs["b"], BUCKET, f"{tmp_path.name}/p.lmdb")
    second = Path(fetch_lmdb(RemoteStore(url, options(store)), _cache(tmp_path)))
    assert second.read_bytes() == packs["b"].read_bytes()
    assert second.parent != first.parent and first.read_bytes() == packs["a"].read_bytes()
    assert _object_gets(store, tmp_path) == 2  # one whole fetch of each version


def test_a_fetch_of_the_same_version_under_way_is_waited_for(store, packs, tmp_path):
    """A second fetch (another worker, another cache object on the same folder) waits on the first
    one's lock, then takes its file: the object is fetched once."""
    url = upload(store, packs["a"], BUCKET, f"{tmp_path.name}/p.lmdb")
    first, second = RemoteStore(url, options(store)), RemoteStore(url, options(store))
    downloading, finish, waiting = threading.Event(), threading.Event(), threading.Event()
    download = first.download

    def held_download(*args, **kwargs) -> None:
        downloading.set()
        assert finish.wait(WAIT)
        download(*args, **kwargs)

    first.download = held_download
    second.download = lambda *args, **kwargs: pytest.fail("the object was fetched twice")
    other = _cache(tmp_path)
    fetching = other.fetching

    def about_to_wait(pack: str, identity: str):  # the second fetch is past its look at the cache
        lock = fetching(pack, identity)
        waiting.set()
        return lock

    other.fetching = about_to_wait
    paths: dict[str, str] = {}
    threads = [threading.Thread(target=lambda: paths.update(first=fetch_lmdb(first, _cache(tmp_path))))]
    threads[0].start()
    assert downloading.wait(WAIT)
    threads.append(threading.Thread(target=lambda: paths.update(second=fetch_lmdb(second, other))))
    threads[1].start()
    assert waiting.wait(WAIT)
    finish.set()
    for thread in threads:
        thread.join(WAIT)
    assert paths["first"] == paths["second"] and Path(paths["first"]).read_bytes() == packs["a"].read_bytes()
    assert _object_gets(store, tmp_path) == 1


def test_a_pack_the_disk_has_no_room_for_is_refused_before_it_is_fetched(store, packs, tmp_path):
    url = upload(store, packs["a"], BUCKET, f"{tmp_path.name}/p.lmdb")
    cache = _cache(tmp_path)
    cache.free_bytes = lambda: 1000  # the cache folder's disk, nearly full
    with pytest.raises(UsageError) as info:
        fetch_lmdb(RemoteStore(url, options(store)), cache)
    size = packs["a"].stat().st_size
    assert str(info.value) == (f"{url}: an LMDB pack of {size:,} bytes is fetched whole into the cache folder "
                               f"{cache.folder}, whose disk has 1,000 bytes free; free space there, or give "
                               "cache_dir a folder on a larger disk")
    assert _object_gets(store, tmp_path) == 0 and _leftovers(cache) == []


@pytest.mark.parametrize("fault", [errno.ENOSPC, errno.EIO], ids=["disk full", "another error"])
def test_a_fetch_that_fails_leaves_nothing_in_the_cache(store, packs, tmp_path, fault):
    url = upload(store, packs["a"], BUCKET, f"{tmp_path.name}/p.lmdb")
    cache = _cache(tmp_path)
    remote = RemoteStore(url, options(store))
    download = remote.download

    def failing(name: str, size: int, fd: int, tag: str | None = None) -> None:
        download(name, size // 2, fd, tag)  # half of it written, then the fault
        raise OSError(fault, "the fault")

    remote.download = failing
    if fault == errno.ENOSPC:
        with pytest.raises(UsageError) as info:
            fetch_lmdb(remote, cache)
        assert str(info.value) == (f"{url}: the cache folder {cache.folder} ran out of space while the LMDB pack was "
                                   "fetched; free space there, or give cache_dir a folder on a larger disk")
    else:
        with pytest.raises(OSError, match="the fault") as raised:
            fetch_lmdb(remote, cache)
        assert raised.value.errno == errno.EIO  # the store's error as it came
    assert _leftovers(cache) == [] and cache.writing_bytes() == 0  # no partial file, no lock file


def test_a_folder_without_a_manifest_is_no_lmdb_pack(store, tmp_path):
    filesystem(store).pipe_file(f"{BUCKET}/{tmp_path.name}/mine/notes.txt", b"mine")
    url = f"s3://{BUCKET}/{tmp_path.name}/mine"
    with pytest.raises(UsageError) as info:
        fetch_lmdb(RemoteStore(url, options(store)), _cache(tmp_path))
    assert str(info.value) == f"{url}: a folder without a pack manifest; give a shards pack or an .lmdb object"


def test_a_file_where_the_packs_cache_folder_goes_is_refused_in_one_line(store, packs, tmp_path):
    url = upload(store, packs["a"], BUCKET, f"{tmp_path.name}/p.lmdb")
    cache = _cache(tmp_path)
    fetch_lmdb(RemoteStore(url, options(store)), cache)
    [folder] = [p for p in cache.folder.iterdir() if p.is_dir()]
    shutil.rmtree(folder)
    folder.write_bytes(b"the user's file")
    cache = _cache(tmp_path)  # another process's cache, which has not opened the folder before
    with pytest.raises(UsageError) as info:
        fetch_lmdb(RemoteStore(url, options(store)), cache)
    message = str(info.value)
    assert message.startswith(f"{url}: an LMDB pack at a URL is fetched whole into the cache folder, and that "
                              "cannot be used: ") and "\n" not in message
    assert message.endswith("; give cache_dir (or PACKLOAD_CACHE) a folder you can write to")
    assert folder.read_bytes() == b"the user's file"
