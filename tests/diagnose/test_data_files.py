"""The files a dataset reads and how much of them the page cache holds
(``packload.diagnose.data_files``), on real packs and folders: ``tune`` says from these whether the
data came from memory or from storage."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import Subset, TensorDataset

from packload import PackedImageFolder, pack
from packload.diagnose import page_cache
from packload.diagnose.data_files import cached_share, dataset_files
from packload.loaders.folder import FolderImages
from tests.image_factory import make_image_folder


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An image folder (two classes of three) and its packs as an LMDB file and as shards."""
    root = tmp_path_factory.mktemp("data_files")
    make_image_folder(root / "images", classes=("a", "b"), per_class=3, seed=5)
    for name in ("p.lmdb", "p.shards"):
        pack(root / "images", root / name, workers=1, progress=False)
    return root


def test_a_packs_files_are_its_lmdb_file_or_every_file_of_its_shards_folder(data: Path) -> None:
    assert dataset_files(PackedImageFolder(data / "p.lmdb")) == [str(data / "p.lmdb")]
    shards = dataset_files(PackedImageFolder(data / "p.shards"))
    on_disk = sorted(str(p) for p in (data / "p.shards").iterdir())
    assert shards == on_disk and any(Path(f).name.startswith("shard-") for f in shards)


def test_a_folders_files_are_its_images_in_the_datasets_order(data: Path) -> None:
    folder = FolderImages(data / "images")
    files = dataset_files(folder)
    assert files == [path for path, _ in folder.samples]
    assert sorted(files) == sorted(str(p) for p in (data / "images").rglob("img_*"))  # all six, nothing else
    assert len(files) == 6


def test_a_subset_reads_the_files_of_the_dataset_it_wraps(data: Path) -> None:
    """Through ``Subset`` (twice over, too) the inner dataset's files; a subset of a folder gives the
    folder's files, as it may read any of them."""
    lmdb = PackedImageFolder(data / "p.lmdb")
    assert dataset_files(Subset(Subset(lmdb, [0, 1, 2]), [1])) == [str(data / "p.lmdb")]
    folder = FolderImages(data / "images")
    assert dataset_files(Subset(folder, [0])) == dataset_files(folder)


class _OwnInner(TensorDataset):
    """A dataset whose ``dataset`` attribute is itself (as some wrappers name themselves)."""

    @property
    def dataset(self) -> _OwnInner:
        return self


def test_other_datasets_have_no_files() -> None:
    tensors = TensorDataset(torch.zeros(4, 2))
    assert dataset_files(tensors) is None
    assert dataset_files(Subset(tensors, [0, 1])) is None
    assert dataset_files(_OwnInner(torch.zeros(2, 2))) is None  # no endless recursion


def test_a_pack_at_a_url_has_no_local_files(data: Path, tmp_path: Path) -> None:
    pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[dev]')")
    pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")
    from tests.object_store import ObjectStore

    with ObjectStore() as store:
        store.make_bucket("bkt-data-files")  # moto keeps one store per process: a bucket of this file's own
        url = "s3://bkt-data-files/p.shards"
        pack(data / "images", url, progress=False, storage_options=store.options)
        remote = PackedImageFolder(url, storage_options=store.options, cache_dir=str(tmp_path / "cache"))
        assert len(remote) == 6 and dataset_files(remote) is None


def test_no_files_no_share() -> None:
    assert cached_share(None) is None
    assert cached_share([]) is None


def test_files_that_cannot_be_checked_give_no_share(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    assert cached_share([str(empty)]) is None  # no pages to count
    assert cached_share([str(tmp_path / "missing.bin")]) is None
    full = tmp_path / "full.bin"
    full.write_bytes(b"x" * 10_000)

    def no_mincore() -> None:
        raise OSError("no C library with mmap and mincore here")

    monkeypatch.setattr(page_cache, "_c", no_mincore)
    assert cached_share([str(full)]) is None


def test_the_share_says_whether_a_packs_pages_are_in_memory(data: Path) -> None:
    """A pack just read is all in the page cache (1.0); once evicted, the share says so, as ``tune``
    reads it before and after its search."""
    files = dataset_files(PackedImageFolder(data / "p.shards"))
    page_cache.warm(files)
    assert cached_share(files) == 1.0
    eviction = page_cache.evict(files)
    if not eviction.verified:
        pytest.skip(f"this filesystem kept the pages cached ({eviction.after}); nothing to check here")
    share = cached_share(files)
    assert share is not None and share <= 0.05
    page_cache.warm(files[:1])  # one file back in memory: the share counts its pages among all
    pages = [page_cache.resident_pages(f)[1] for f in files]
    assert cached_share(files) == pytest.approx(pages[0] / sum(pages), abs=0.05)
