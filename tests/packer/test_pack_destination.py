"""``PackDestination``: the one sequence of checks, lock, unfinished pack and publish that ``pack``,
``merge`` and the Ray engine share, tested on its own with packs the tests write."""

from __future__ import annotations

from pathlib import Path

import pytest

from packload import merge, pack
from packload.core.errors import UsageError
from packload.loaders.read import PackReader
from packload.packer.pack_destination import PackDestination
from tests.image_factory import make_image_folder


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("dest") / "src"
    make_image_folder(src, classes=("a", "b"), per_class=3, seed=11)
    return src


def test_checks_before_anything_is_written(images: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="source folder"):
        PackDestination(images / "inside.shards", [images], "the source folder")
    with pytest.raises(UsageError):
        PackDestination(tmp_path / "no_such_folder" / "out.shards")
    assert sorted(tmp_path.iterdir()) == []  # nothing made, not even a lock file


def test_the_lock_refuses_a_second_writer_and_is_gone_after(tmp_path: Path) -> None:
    dst = tmp_path / "out.shards"
    with PackDestination(dst):
        with pytest.raises(UsageError, match="is writing"), PackDestination(dst):
            pass
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    with PackDestination(dst):  # free again
        pass


def test_an_existing_pack_needs_overwrite_and_a_refusal_lets_go_of_the_lock(images: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out.shards"
    pack(images, dst, progress=False)
    with pytest.raises(UsageError, match="--overwrite"), PackDestination(dst):
        pass
    with PackDestination(dst, overwrite=True):  # the refusal above released the lock
        pass
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("a user's folder")
    with pytest.raises(UsageError, match="not a pack"), PackDestination(tmp_path / "mine", overwrite=True):
        pass
    assert (tmp_path / "mine" / "notes.txt").read_text() == "a user's folder"


def test_leftover_discard_and_publish(images: Path, tmp_path: Path) -> None:
    """An unfinished pack of ours is recognised and removed; anything else at the partial name is
    refused and kept; publish replaces an old pack only with the finished one."""
    made = tmp_path / "made.shards"
    pack(images, made, progress=False)
    dst = tmp_path / "out.shards"
    with PackDestination(dst) as destination:
        assert destination.partial == tmp_path / "out.shards.partial"
        assert not destination.leftover()
        made.rename(destination.partial)  # a finished pack where the unfinished one goes
        assert destination.leftover()
        destination.publish()
    assert PackReader(dst).records == 6 and not (tmp_path / "out.shards.partial").exists()

    with PackDestination(dst, overwrite=True) as destination:
        destination.partial.mkdir()
        (destination.partial / "holiday.jpg").write_bytes(b"not ours")
        with pytest.raises(UsageError, match="left alone"):
            destination.leftover()
        assert (destination.partial / "holiday.jpg").read_bytes() == b"not ours"
        (destination.partial / "holiday.jpg").unlink()
        destination.partial.rmdir()
        pack(images, tmp_path / "again.shards", progress=False)
        (tmp_path / "again.shards").rename(destination.partial)
        assert destination.leftover()
        destination.discard()
        assert not destination.partial.exists()
        destination.discard()  # nothing there: nothing to do
    assert PackReader(dst).records == 6  # the old pack, untouched by a run that published nothing


def test_pack_and_merge_refuse_the_same_way(images: Path, tmp_path: Path) -> None:
    """Both writers go through it: a pack's destination inside its source, a merge's equal to an
    input, each refused before anything is written."""
    with pytest.raises(UsageError, match="source folder"):
        pack(images, images / "in.shards", progress=False)
    one = tmp_path / "one.shards"
    pack(images, one, progress=False)
    with pytest.raises(UsageError, match="input pack"):
        merge(one, [one], overwrite=True, progress=False)
    assert not (images / "in.shards").exists() and PackReader(one).records == 6
