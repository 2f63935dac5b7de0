"""``--overwrite`` replaces only a pack, and nothing a command writes may be or hold its input.

Every refusal is one line on stderr, with a non-zero exit, and leaves what was there exactly as
it was: a user's folder, a user's own LMDB database, a link, the source and its siblings.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import lmdb
import pytest

from packload import UsageError, pack_ray
from packload.loaders.verify import verify
from packload.packer.destination import not_a_pack
from tests.image_factory import make_image_folder
from tests.reliability.packs import cli, one_line_error

NO_RAY = "the --engine ray half needs Ray (pip install -e '.[ray]'); the local half passed"


def skip_without_ray() -> None:
    """Skip the rest of a test (its --engine ray half) where Ray is not installed."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip(NO_RAY)

BACKENDS = ["lmdb", "shards"]


def tree(root: Path) -> dict[str, bytes | str]:
    """Everything under ``root`` (itself included): file bytes, link targets, folders."""
    out: dict[str, bytes | str] = {}
    paths = [root, *root.rglob("*")] if root.is_dir() and not root.is_symlink() else [root]
    for path in paths:
        key = str(path.relative_to(root.parent))
        if path.is_symlink():
            out[key] = "link -> " + os.readlink(path)
        elif path.is_dir():
            out[key] = "folder"
        else:
            out[key] = path.read_bytes()
    return out


def refused(args: list[str], *words: str, code: int = 2) -> str:
    """Run ``packload ARGS``: it must fail with one line holding ``words``; returns the line."""
    got, err = cli(args)
    problem = one_line_error(got, err)
    assert problem is None, problem
    assert got == code, err
    for word in words:
        assert word in err, err
    return err.strip()


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dest-src") / "images"
    make_image_folder(root, classes=("cat", "dog"), per_class=3, seed=4)
    return root


def user_folder(path: Path) -> Path:
    (path / "chapters").mkdir(parents=True)
    (path / "thesis.tex").write_text("four years of work\n")
    (path / "chapters" / "one.tex").write_text("intro\n")
    return path


def user_lmdb(path: Path) -> Path:
    """Someone else's LMDB database (no key of packload's)."""
    env = lmdb.open(str(path), subdir=False, map_size=1 << 20)
    with env.begin(write=True) as txn:
        txn.put(b"user-key", b"precious value")
    env.close()
    Path(str(path) + "-lock").unlink(missing_ok=True)
    return path


@pytest.mark.parametrize("backend", BACKENDS)
def test_overwrite_refuses_a_users_folder(images: Path, tmp_path: Path, backend: str) -> None:
    victim = user_folder(tmp_path / "victim")
    before = tree(victim)
    line = refused(["pack", str(images), str(victim), "--format", backend, "--overwrite", "--quiet"],
                   str(victim), "not a pack", "remove it yourself")
    assert "thesis.tex" in line or "chapters" in line  # says what is there that no pack holds
    assert tree(victim) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim"]  # no lock file, no .partial left
    skip_without_ray()
    with pytest.raises(UsageError, match="not a pack"):  # pack --engine ray: refused before Ray starts
        pack_ray(images, victim, backend=backend, overwrite=True, progress=False)
    assert tree(victim) == before


@pytest.mark.parametrize("backend", BACKENDS)
def test_overwrite_refuses_a_destination_that_holds_the_source(tmp_path: Path, backend: str) -> None:
    root = tmp_path / "root"
    make_image_folder(root / "a", classes=("x",), per_class=2, seed=1)
    make_image_folder(root / "b", classes=("y",), per_class=2, seed=2)
    before = tree(root)
    refused(["pack", str(root / "a"), str(root), "--format", backend, "--overwrite", "--quiet"],
            "holds the source folder")
    assert tree(root) == before
    skip_without_ray()
    with pytest.raises(UsageError, match="holds the source folder"):  # and pack --engine ray, before Ray starts
        pack_ray(root / "a", root, backend=backend, overwrite=True, progress=False)
    assert tree(root) == before


@pytest.mark.parametrize("backend", BACKENDS)
def test_destination_inside_or_equal_to_the_source(images: Path, backend: str) -> None:
    before = tree(images)
    refused(["pack", str(images), str(images / "cat" / f"x.{backend}"), "--quiet"], "inside the source")
    refused(["pack", str(images), str(images), "--format", backend, "--overwrite", "--quiet"],
            "is the source folder")
    refused(["pack", str(images / "cat"), str(images), "--format", backend, "--overwrite", "--quiet"],
            "holds the source folder")
    assert tree(images) == before


@pytest.mark.parametrize("dest", [".", "..", "/", "sub/..", "./"])
def test_destinations_without_a_name(images: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     dest: str) -> None:
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    monkeypatch.chdir(work)
    before = tree(tmp_path)
    refused(["pack", str(images), dest, "--overwrite", "--quiet"], "name of its own")
    refused(["merge", dest, str(images), "--overwrite", "--quiet"], "name of its own")
    assert tree(tmp_path) == before


def test_relative_paths_are_compared_as_real_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    make_image_folder(root / "a", classes=("x",), per_class=2, seed=1)
    monkeypatch.chdir(root / "a")
    before = tree(root)
    refused(["pack", ".", "..", "--overwrite", "--quiet"], "name of its own")
    refused(["pack", ".", "../../root", "--overwrite", "--quiet"], "holds the source folder")
    refused(["pack", "../a", "../a/y.shards", "--quiet"], "inside the source")
    assert tree(root) == before


@pytest.mark.parametrize("backend", BACKENDS)
def test_links_do_not_hide_the_source(images: Path, tmp_path: Path, backend: str) -> None:
    before = tree(images)
    to_source = tmp_path / f"link.{backend}"
    to_source.symlink_to(images)
    refused(["pack", str(images), str(to_source), "--overwrite", "--quiet"], "symbolic link")
    refused(["pack", str(images), str(to_source), "--quiet"], "already exists")
    assert os.readlink(to_source) == str(images) and tree(images) == before
    # the destination's folder is a link into the source
    into = tmp_path / "into"
    into.symlink_to(images / "cat")
    refused(["pack", str(images), str(into / f"x.{backend}"), "--quiet"], "inside the source")
    # the source is reached through a link, the destination is the folder that holds it
    (tmp_path / "root").mkdir()
    make_image_folder(tmp_path / "root" / "data", classes=("z",), per_class=2, seed=3)
    (tmp_path / "via").symlink_to(tmp_path / "root" / "data")
    root_before = tree(tmp_path / "root")
    refused(["pack", str(tmp_path / "via"), str(tmp_path / "root"), "--format", backend, "--overwrite", "--quiet"],
            "holds the source folder")
    assert tree(tmp_path / "root") == root_before and tree(images) == before


def test_a_link_to_a_pack_is_not_replaced(images: Path, tmp_path: Path) -> None:
    real = tmp_path / "real.lmdb"
    assert cli(["pack", str(images), str(real), "--quiet"])[0] == 0
    link = tmp_path / "link.lmdb"
    link.symlink_to(real)
    before = tree(real)
    refused(["pack", str(images), str(link), "--overwrite", "--quiet"], "symbolic link", str(real))
    assert link.is_symlink() and tree(real) == before


def test_a_users_lmdb_database_is_not_replaced(images: Path, tmp_path: Path) -> None:
    db = user_lmdb(tmp_path / "mine.lmdb")
    before = db.read_bytes()
    assert not_a_pack(db)
    refused(["pack", str(images), str(db), "--overwrite", "--quiet"], "not a pack", "#manifest")
    assert db.read_bytes() == before
    for name, data in (("empty.lmdb", b""), ("text.lmdb", b"just some notes\n" * 10)):
        (tmp_path / name).write_bytes(data)
        refused(["pack", str(images), str(tmp_path / name), "--overwrite", "--quiet"], "not a pack")
        assert (tmp_path / name).read_bytes() == data


def test_a_pack_folder_with_a_users_file_in_it_is_not_replaced(images: Path, tmp_path: Path) -> None:
    dst = tmp_path / "p.shards"
    assert cli(["pack", str(images), str(dst), "--quiet"])[0] == 0
    (dst / "notes.txt").write_text("mine\n")
    before = tree(dst)
    refused(["pack", str(images), str(dst), "--overwrite", "--quiet"], "notes.txt", "not a pack")
    assert tree(dst) == before
    (dst / "notes.txt").unlink()
    (dst / "manifest.json").write_text('{"format": "someone else"}')
    refused(["pack", str(images), str(dst), "--overwrite", "--quiet"], "manifest.json", "not a pack")


@pytest.mark.parametrize("old", BACKENDS)
@pytest.mark.parametrize("new", BACKENDS)
def test_overwrite_replaces_a_pack(images: Path, tmp_path: Path, old: str, new: str) -> None:
    dst = tmp_path / "data"
    assert cli(["pack", str(images), str(dst), "--format", old, "--quiet"])[0] == 0
    assert not_a_pack(dst) is None
    assert cli(["pack", str(images), str(dst), "--format", new, "--overwrite", "--quiet"])[0] == 0
    assert verify(dst, progress=False)["ok"] and dst.is_dir() == (new == "shards")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # the old pack, the lock file: gone


@pytest.mark.parametrize("backend", BACKENDS)
def test_something_else_at_the_partial_name_is_left_alone(images: Path, tmp_path: Path, backend: str) -> None:
    dst = tmp_path / f"x.{backend}"
    partial = user_folder(tmp_path / f"x.{backend}.partial")
    before = tree(partial)
    for flag in ("--overwrite", "--resume"):
        refused(["pack", str(images), str(dst), flag, "--quiet"], str(partial), "not an unfinished pack")
    assert tree(partial) == before and not dst.exists()


@pytest.mark.parametrize("backend", BACKENDS)
def test_merge_overwrite_replaces_only_a_pack(images: Path, tmp_path: Path, backend: str) -> None:
    one, two = tmp_path / "one.shards", tmp_path / "two.lmdb"
    for path in (one, two):
        assert cli(["pack", str(images), str(path), "--quiet"])[0] == 0
    victim = user_folder(tmp_path / "victim")
    before = tree(victim)
    refused(["merge", str(victim), str(one), "--format", backend, "--overwrite", "--quiet"], "not a pack")
    assert tree(victim) == before
    db = user_lmdb(tmp_path / "db.lmdb")
    data = db.read_bytes()
    refused(["merge", str(db), str(one), "--overwrite", "--quiet"], "not a pack")
    assert db.read_bytes() == data
    # OUT is an input, lies inside one, or holds them
    refused(["merge", str(one), str(one), str(two), "--overwrite", "--quiet"], "is the input pack")
    refused(["merge", str(one / "m"), str(one), "--quiet"], "inside the input pack")
    refused(["merge", str(tmp_path), str(one), "--format", backend, "--overwrite", "--quiet"], "holds the input pack")
    out = tmp_path / f"m.{backend}"
    assert cli(["merge", str(out), str(one), str(two), "--quiet"])[0] == 0
    assert cli(["merge", str(out), str(two), "--overwrite", "--quiet"])[0] == 0
    assert verify(out, progress=False)["ok"]


@pytest.mark.skipif(not os.access("/proc", os.W_OK), reason="needs /proc to look writable (as it does to root)")
@pytest.mark.parametrize("name", ["x.lmdb", "x.shards"])
@pytest.mark.parametrize("command", ["pack", "merge"])
def test_a_destination_that_cannot_be_created(images: Path, tmp_path: Path, name: str, command: str) -> None:
    dst = Path("/proc") / name
    args = ["pack", str(images), str(dst)] if command == "pack" else ["merge", str(dst), str(tmp_path / "in.shards")]
    if command == "merge":
        assert cli(["pack", str(images), str(tmp_path / "in.shards"), "--quiet"])[0] == 0
    line = refused([*args, "--quiet"], str(dst), "virtual file system (proc)", "choose a destination", code=2)
    assert "Traceback" not in line


def test_what_counts_as_a_pack(images: Path, tmp_path: Path) -> None:
    shards, lmdb_pack = tmp_path / "a.shards", tmp_path / "a.lmdb"
    for path in (shards, lmdb_pack):
        assert cli(["pack", str(images), str(path), "--quiet"])[0] == 0
        assert not_a_pack(path) is None
    (tmp_path / "empty").mkdir()
    assert "no manifest.json" in not_a_pack(tmp_path / "empty")
    assert not_a_pack(tmp_path / "empty", partial=True) is None  # an unfinished pack killed at once
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "shard-00000.bin")
    assert not_a_pack(tmp_path / "fifo", partial=True)
    os.mkfifo(tmp_path / "pipe.lmdb")
    assert "not a regular file" in not_a_pack(tmp_path / "pipe.lmdb")


@pytest.mark.skipif(not os.access("/proc", os.W_OK), reason="needs /proc to look writable (as it does to root)")
@pytest.mark.parametrize("name", ["x.lmdb", "x.shards"])
def test_a_partial_that_cannot_be_created(images: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Past the lock file (made a no-op here), creating DEST.partial fails too: one line, LMDB's too."""
    from types import SimpleNamespace

    import packload.packer.pack_destination as pack_destination

    monkeypatch.setattr(pack_destination, "DestinationLock",
                        lambda dst: SimpleNamespace(acquire=lambda: None, release=lambda: None))
    monkeypatch.setattr(pack_destination, "check_parent", lambda dst: None)
    line = refused(["pack", str(images), f"/proc/{name}", "--quiet"], f"/proc/{name}.partial",
                   "virtual file system (proc)", "choose a destination", code=1)
    assert "Traceback" not in line


def test_a_bind_mount_does_not_hide_the_source(tmp_path: Path) -> None:
    """The same folder under two names that no link explains: compared as files, not only as paths."""
    import subprocess

    root = tmp_path / "root"
    make_image_folder(root / "a", classes=("x",), per_class=2, seed=1)
    (tmp_path / "mnt").mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "--bind", str(root), str(tmp_path / "mnt")],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs a bind mount (root)")
    try:
        before = tree(root)
        refused(["pack", str(root / "a"), str(tmp_path / "mnt"), "--format", "shards", "--overwrite", "--quiet"],
                "holds the source folder")
        refused(["pack", str(root / "a"), str(tmp_path / "mnt" / "a" / "x.lmdb"), "--quiet"], "inside the source")
        refused(["pack", str(tmp_path / "mnt" / "a"), str(root / "a"), "--format", "lmdb", "--overwrite", "--quiet"],
                "is the source folder")
        assert tree(root) == before
    finally:
        subprocess.run(["umount", str(tmp_path / "mnt")], check=False)


def test_an_lmdb_file_open_in_this_process_is_still_recognised(images: Path, tmp_path: Path) -> None:
    """py-lmdb will not open a file twice in one process: the pack a dataset here still reads is
    recognised from its pages, and so is someone else's database that this process has open."""
    from packload.loaders.read import PackReader

    dst = tmp_path / "p.lmdb"
    assert cli(["pack", str(images), str(dst), "--quiet"])[0] == 0
    with PackReader(dst) as reader:
        assert not_a_pack(dst) is None
        payloads = [bytes(reader.payload(i, verify=True)) for i in range(reader.records)]
        assert cli(["pack", str(images), str(dst), "--overwrite", "--quiet"])[0] == 0
        assert reader.records == 6  # the pack it opened, read on, every payload passing its CRC
        assert [bytes(reader.payload(i, verify=True)) for i in range(reader.records)] == payloads
    db = user_lmdb(tmp_path / "mine.lmdb")
    env = lmdb.open(str(db), subdir=False, readonly=True, lock=False)
    try:
        assert "#manifest" in not_a_pack(db)
    finally:
        env.close()
