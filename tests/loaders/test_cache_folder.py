"""Where the block cache lives (``packload.loaders.cache_folder``): packload's own ``packload-blocks``
folder inside the cache folder given, made and marked on first use, a linked ``cache_dir`` resolved
once, the pack folders opened without following links, and whatever stands where the folder or
its marker belongs refused in one line that names it and what to do."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from packload.loaders.cache_folder import (
    CACHE_SUBFOLDER,
    MARKER,
    MARKER_NAME,
    PACK_FOLDER,
    CacheFolder,
    CacheUnusableError,
    default_cache_dir,
    pack_folder_name,
)
from tests.no_hang import within

P = pack_folder_name("pack", "a manifest")
Q = pack_folder_name("lmdb", "s3://bkt/p.lmdb\x00100\x00etag")


def test_the_default_folder_falls_back_to_the_home_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PACKLOAD_CACHE", "")  # empty: as if unset
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "packload"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "packload"


def test_pack_folder_names_are_of_one_form_per_kind_and_identity():
    names = {pack_folder_name(kind, identity) for kind in ("pack", "lmdb")
             for identity in ("a", "b", "a\x00b", "ab\x00", "\udcff")}  # a lone surrogate too (a file name's)
    assert len(names) == 10 and all(PACK_FOLDER.fullmatch(name) for name in names)
    assert pack_folder_name("pack", "a") == pack_folder_name("pack", "a") and P.startswith("pack-")
    assert Q.startswith("lmdb-")
    with pytest.raises(ValueError, match="kind 'shards': pack or lmdb"):
        pack_folder_name("shards", "a")


def test_the_folder_is_made_and_marked_on_first_use(tmp_path):
    place = CacheFolder(tmp_path / "new" / "deeper")
    assert place.path == tmp_path / "new" / "deeper" / CACHE_SUBFOLDER and not (tmp_path / "new").exists()
    assert place.problem() is None
    assert (place.path / MARKER_NAME).read_bytes() == MARKER
    assert place.fd() == place.fd()  # opened once, kept
    empty = tmp_path / "empty"
    (empty / CACHE_SUBFOLDER).mkdir(parents=True)  # there, with nothing in it: ours to mark
    assert CacheFolder(empty).problem() is None
    assert (empty / CACHE_SUBFOLDER / MARKER_NAME).read_bytes() == MARKER
    place.close()


def test_a_linked_cache_dir_is_resolved_once(tmp_path):
    """A ``cache_dir`` that is a link (to a larger disk) is followed when the cache is opened; the
    link pointed elsewhere later does not move the cache."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    link = tmp_path / "link"
    link.symlink_to(first, target_is_directory=True)
    place = CacheFolder(link)
    assert place.path == first.resolve() / CACHE_SUBFOLDER and place.problem() is None
    link.unlink()
    link.symlink_to(second, target_is_directory=True)
    assert place.pack_fd(P, create=True) is not None
    assert (first / CACHE_SUBFOLDER / P).is_dir() and list(second.iterdir()) == []
    place.close()


def _subfolder_is_a_file(folder: Path) -> None:
    (folder / CACHE_SUBFOLDER).write_bytes(b"someone's file")


def _marker_is_a_link(folder: Path) -> None:
    (folder / "elsewhere").write_bytes(MARKER)  # the right bytes, but not through a link
    (folder / CACHE_SUBFOLDER).mkdir()
    (folder / CACHE_SUBFOLDER / MARKER_NAME).symlink_to(folder / "elsewhere")


def _marker_is_a_folder(folder: Path) -> None:
    (folder / CACHE_SUBFOLDER / MARKER_NAME).mkdir(parents=True)


def _marker_is_a_fifo(folder: Path) -> None:
    (folder / CACHE_SUBFOLDER).mkdir()
    os.mkfifo(folder / CACHE_SUBFOLDER / MARKER_NAME)


@pytest.mark.parametrize(("plant", "says"), [
    (_subfolder_is_a_file, f"{CACHE_SUBFOLDER} is a symbolic link or a file, not packload's cache folder; move it "
                           "away, or give another cache_dir"),
    (_marker_is_a_link, f"{CACHE_SUBFOLDER}/{MARKER_NAME} cannot be read ("),
    (_marker_is_a_folder, f"{CACHE_SUBFOLDER}/{MARKER_NAME} cannot be read ("),
    (_marker_is_a_fifo, f"{CACHE_SUBFOLDER}/{MARKER_NAME} is not packload's marker"),
], ids=["subfolder a file", "marker a link", "marker a folder", "marker a fifo"])
def test_what_stands_where_the_folder_or_its_marker_belongs_is_named(tmp_path, plant, says):
    """Never used, never an error of another kind (a reader opening the cache then fails on its
    own words, or hangs on a FIFO): ``CacheUnusableError``, one line naming the file and the fix."""
    plant(tmp_path)
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    place = CacheFolder(tmp_path)
    with within(5):
        problem = place.problem()
        with pytest.raises(CacheUnusableError) as info:
            place.fd()
    assert problem == str(info.value) and says in problem and "\n" not in problem
    assert str(tmp_path) in problem and "cache_dir" in problem
    with within(5):
        assert place.pack_fd(P, create=True) is None and place.pack_folders() == []
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before  # nothing made there


def test_pack_folders_are_made_and_opened_never_through_a_link(tmp_path):
    place = CacheFolder(tmp_path)
    with pytest.raises(ValueError, match="'mine': not a cache folder's name"):
        place.pack_fd("mine", create=True)
    with pytest.raises(ValueError, match="not a cache folder's name"):
        place.pack_fd("../" + P, create=True)
    assert place.pack_fd(P, create=False) is None and not (place.path / P).exists()  # not made when only looked for
    made = place.pack_fd(P, create=True)
    assert made is not None and (place.path / P).is_dir() and place.pack_fd(P, create=False) == made
    victim = tmp_path / "victim"
    victim.mkdir()
    (place.path / Q).symlink_to(victim, target_is_directory=True)
    assert place.pack_fd(Q, create=True) is None and place.pack_fd(Q, create=False) is None
    other = pack_folder_name("pack", "a file in the way")
    (place.path / other).write_bytes(b"x")
    assert place.pack_fd(other, create=True) is None
    assert list(victim.iterdir()) == []
    place.close()


def test_the_pack_folders_are_the_real_folders_of_the_names_it_gives(tmp_path):
    place = CacheFolder(tmp_path)
    opened = {name: place.pack_fd(name, create=True) for name in (P, Q)}
    (tmp_path / "victim").mkdir()
    (place.path / pack_folder_name("pack", "linked")).symlink_to(tmp_path / "victim", target_is_directory=True)
    (place.path / pack_folder_name("pack", "a file")).write_bytes(b"")
    for name in ("mine", "pack-" + "0" * 31, "pack-" + "A" * 32, "blocks-" + "0" * 32):
        (place.path / name).mkdir()
    assert sorted(place.pack_folders()) == sorted(opened.items())
    place.close()


def test_close_lets_go_of_every_descriptor_and_they_are_opened_again_on_use(tmp_path):
    place = CacheFolder(tmp_path)
    held = [place.fd(), place.pack_fd(P, create=True)]
    place.close()
    for fd in held:
        with pytest.raises(OSError):
            os.fstat(fd)
    place.close()  # twice: nothing left to let go of
    again = place.pack_fd(P, create=False)
    assert again is not None and os.path.samestat(os.fstat(again), os.stat(place.path / P))
    place.close()


def test_threads_opening_one_pack_folder_share_its_descriptor(tmp_path):
    place = CacheFolder(tmp_path)
    place.fd()
    start = threading.Barrier(8)
    got: list[int | None] = []

    def open_it() -> None:
        start.wait()
        got.append(place.pack_fd(P, create=True))

    threads = [threading.Thread(target=open_it) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(got) == 8 and len(set(got)) == 1 and got[0] is not None
    place.close()
