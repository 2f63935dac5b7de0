"""``loaders.no_follow_writes`` on real folders, files and links: folders opened one component at a
time through their parent (a link planted in the path is refused, or cannot be followed once the
folder is open), files written under a temporary name and renamed over the final one (a link or a
hard link there is replaced, never written through; nothing is left under a temporary name).
(``unpack``'s use of them is tested in test_unpack.py.)"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from packload.core.errors import UsageError, WriteError
from packload.loaders.no_follow_writes import DIR_FLAGS, FolderChain, open_dir, write_replacing


@pytest.fixture
def out(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """An output folder and a descriptor of it."""
    folder = tmp_path / "out"
    folder.mkdir()
    fd = os.open(folder, DIR_FLAGS)
    yield folder, fd
    os.close(fd)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """Files outside the output folder that a followed link would overwrite."""
    root = tmp_path / "victim"
    (root / "cat").mkdir(parents=True)
    (root / "secret.txt").write_bytes(b"victim's secret")
    return root


def everything(root: Path) -> dict[str, bytes | str]:
    """Every file (its bytes), folder ("dir") and link ("-> target") below ``root``."""
    seen: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        seen[name] = f"-> {os.readlink(path)}" if path.is_symlink() else "dir" if path.is_dir() else path.read_bytes()
    return seen


def message(error: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(error.value)
    assert "\n" not in text, text
    return text


def test_open_dir_creates_a_missing_folder_and_opens_an_existing_one(out: tuple[Path, int]) -> None:
    folder, fd = out
    made = open_dir(fd, "cat", folder / "cat")
    try:
        assert (folder / "cat").is_dir() and os.path.samestat(os.fstat(made), os.stat(folder / "cat"))
    finally:
        os.close(made)
    again = open_dir(fd, "cat", folder / "cat")
    os.close(again)
    assert everything(folder) == {"cat": "dir"}


@pytest.mark.parametrize("target", ["victim/cat", "victim/secret.txt", "nowhere"])
def test_a_link_where_a_folder_goes_is_refused(out: tuple[Path, int], victim: Path, target: str) -> None:
    """A link to a folder, to a file or to nothing: refused naming the path and the fix; the link and
    what it points at are left as they were (a dangling link's target is not created)."""
    folder, fd = out
    (folder / "cat").symlink_to(victim.parent / target)
    before = everything(victim)
    with pytest.raises(UsageError) as caught:
        open_dir(fd, "cat", folder / "cat")
    assert message(caught) == (f"{folder / 'cat'}: is a symbolic link, and a record needs a folder there; remove it, "
                               "or unpack into a new folder")
    assert everything(victim) == before and not (victim.parent / "nowhere").exists()
    assert (folder / "cat").is_symlink()


def test_a_file_where_a_folder_goes_is_refused(out: tuple[Path, int]) -> None:
    folder, fd = out
    (folder / "cat").write_bytes(b"a file")
    with pytest.raises(UsageError) as caught:
        open_dir(fd, "cat", folder / "cat")
    assert message(caught) == (f"{folder / 'cat'}: exists and is not a folder, and a record needs a folder there; "
                               "remove it, or unpack into a new folder")
    assert (folder / "cat").read_bytes() == b"a file"


def test_a_folder_that_cannot_be_created_is_a_write_error(tmp_path: Path) -> None:
    """No folder can be made in a parent removed after it was opened (ENOENT: a failure that no
    permission check can waive, as it would for root)."""
    gone = tmp_path / "gone"
    gone.mkdir()
    fd = os.open(gone, DIR_FLAGS)
    try:
        gone.rmdir()
        with pytest.raises(WriteError) as caught:
            open_dir(fd, "cat", gone / "cat")
    finally:
        os.close(fd)
    assert message(caught).startswith(f"{gone / 'cat'}: could not create it (")
    assert message(caught).endswith("); fix permissions, or unpack into another folder")


def test_the_chain_keeps_open_only_the_current_folders(out: tuple[Path, int]) -> None:
    """Records come grouped by folder: entering a folder closes those below the common part, keeps
    that part open, and opens the rest; close() closes them all and never the root."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("counting open descriptors needs /proc")
    folder, fd = out
    chain = FolderChain(fd, folder)

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    base = open_fds()
    assert chain.enter(()) == fd and open_fds() == base
    deep = chain.enter(("a", "b", "c"))
    assert open_fds() == base + 3 and os.path.samestat(os.fstat(deep), os.stat(folder / "a" / "b" / "c"))
    side = chain.enter(("a", "x"))
    assert open_fds() == base + 2 and os.path.samestat(os.fstat(side), os.stat(folder / "a" / "x"))
    assert chain.enter(()) == fd and open_fds() == base
    chain.enter(("d",))
    chain.close()
    assert open_fds() == base
    os.fstat(fd)  # the root stays open (a closed one would raise EBADF)
    assert everything(folder) == {"a": "dir", "a/b": "dir", "a/b/c": "dir", "a/x": "dir", "d": "dir"}


def test_an_open_folder_swapped_for_a_link_is_not_followed(out: tuple[Path, int], victim: Path) -> None:
    """Once ``a`` is open, the chain goes on through its descriptor: ``a`` moved away and a link to
    another folder planted at its name changes nothing about where the next folders are made."""
    folder, fd = out
    chain = FolderChain(fd, folder)
    chain.enter(("a", "b"))
    (folder / "a").rename(folder / "moved")
    (folder / "a").symlink_to(victim / "cat", target_is_directory=True)
    before = everything(victim)
    written: set[tuple[int, int]] = set()
    write_replacing(chain.enter(("a", "c")), "x.jpg", memoryview(b"record"), folder / "a" / "c" / "x.jpg", written)
    chain.close()
    assert everything(victim) == before
    assert (folder / "moved" / "c" / "x.jpg").read_bytes() == b"record"


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "file"])
def test_a_file_at_the_name_is_replaced_not_written_through(out: tuple[Path, int], victim: Path, kind: str) -> None:
    """A link (soft or hard) to the victim's file, or an old file, at the final name: replaced by a
    new file holding the record; the victim keeps its bytes; no temporary file is left."""
    folder, fd = out
    name = folder / "a.jpg"
    if kind == "symlink":
        name.symlink_to(victim / "secret.txt")
    elif kind == "hardlink":
        os.link(victim / "secret.txt", name)
    else:
        name.write_bytes(b"an older, longer file than the record")
    written: set[tuple[int, int]] = set()
    write_replacing(fd, "a.jpg", memoryview(b"record"), name, written)
    assert (victim / "secret.txt").read_bytes() == b"victim's secret"
    assert everything(folder) == {"a.jpg": b"record"}
    st = os.stat(name, follow_symlinks=False)
    assert written == {(st.st_dev, st.st_ino)} and st.st_nlink == 1


def test_a_file_this_unpack_wrote_is_never_replaced(out: tuple[Path, int]) -> None:
    """Two records landing on one file (a case-folding file system) would lose the first: refused,
    the first record kept, no temporary file left; another name still writes."""
    folder, fd = out
    written: set[tuple[int, int]] = set()
    write_replacing(fd, "A.jpg", memoryview(b"first"), folder / "A.jpg", written)
    os.link(folder / "A.jpg", folder / "a.jpg")  # what a case-folding file system makes of "a.jpg"
    with pytest.raises(UsageError) as caught:
        write_replacing(fd, "a.jpg", memoryview(b"second"), folder / "a.jpg", written)
    assert message(caught) == (f"{folder / 'a.jpg'}: two records map to this one file on this file system (it does "
                               "not tell their names apart); unpack onto another file system")
    assert everything(folder) == {"A.jpg": b"first", "a.jpg": b"first"}
    write_replacing(fd, "b.jpg", memoryview(b"third"), folder / "b.jpg", written)
    assert len(written) == 2 and (folder / "b.jpg").read_bytes() == b"third"


def test_a_folder_at_the_name_is_left_alone(out: tuple[Path, int]) -> None:
    folder, fd = out
    (folder / "a.jpg").mkdir()
    (folder / "a.jpg" / "mine").write_bytes(b"mine")
    written: set[tuple[int, int]] = set()
    with pytest.raises(UsageError) as caught:
        write_replacing(fd, "a.jpg", memoryview(b"record"), folder / "a.jpg", written)
    assert message(caught) == (f"{folder / 'a.jpg'}: is a folder, and a record is a file of that name; remove it, "
                               "or unpack into a new folder")
    assert everything(folder) == {"a.jpg": "dir", "a.jpg/mine": b"mine"} and written == set()


def test_a_failed_write_leaves_the_old_file_and_no_temporary(out: tuple[Path, int]) -> None:
    """A name too long for the file system fails once the data is in the temporary file (at the
    final name's lookup): a one-line WriteError naming the file; the folder is as it was."""
    folder, fd = out
    long = "x" * 300  # past NAME_MAX (255) on the usual file systems
    (folder / "kept.jpg").write_bytes(b"kept")
    written: set[tuple[int, int]] = set()
    with pytest.raises(WriteError) as caught:
        write_replacing(fd, long, memoryview(b"record" * 1000), folder / long, written)
    assert message(caught).startswith(f"{folder / long}: could not write it (")
    assert message(caught).endswith("); free space or fix permissions, or unpack into another folder")
    assert everything(folder) == {"kept.jpg": b"kept"} and written == set()
