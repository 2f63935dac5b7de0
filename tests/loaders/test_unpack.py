"""``unpack`` on both backends: one distinct file per record (the collision rule, case folding,
the exact count), byte-identical round trips, no link followed at or below OUT, never into the
pack, and an interrupted unpack that leaves nothing looking finished."""

from __future__ import annotations

import io
import os
from pathlib import Path, PurePosixPath

import numpy as np
import pytest
from PIL import Image

import packload.loaders.unpack as unpack_module
from packload import PackReader
from packload.core.errors import PackFormatError, UsageError
from packload.loaders.unpack import Target, plan_targets, unpack
from packload.packer.encode import EncodeOptions
from packload.packer.pipeline import pack
from tests.image_factory import write_image
from tests.reliability.crafted import craft_pack, jpeg_bytes
from tests.reliability.packs import cli, one_line_error, records_of

BACKENDS = ["lmdb", "shards"]


def _source(root: Path, names: list[str]) -> Path:
    """An ImageFolder tree with one distinct image per relative path in ``names``."""
    for k, name in enumerate(names):
        write_image(root / name, size=(24 + k, 20), seed=k, fmt="JPEG" if Path(name).suffix.lower() in (
            ".jpg", ".jpeg") else "PNG")
    return root


def _pack(src: Path, dst: Path, encoding: str = "keep", **options: object) -> Path:
    pack(src, dst, options=EncodeOptions(encoding=encoding, **options), workers=1, progress=False)
    return dst


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _snapshot(root: Path) -> dict[str, tuple[str, bytes | str]]:
    """Everything under ``root``, links as their targets (to see that nothing changed there)."""
    out: dict[str, tuple[str, bytes | str]] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p))
        elif p.is_file():
            out[rel] = ("file", p.read_bytes())
        else:
            out[rel] = ("dir", "")
    return out


def _leftovers(parent: Path) -> list[str]:
    """Temporary folders and files an unpack left in or below ``parent``."""
    return sorted(p.name for p in parent.rglob("*") if p.name.endswith(".partial") or p.name.startswith(".packload-"))


def _error(args: list[str], *words: str) -> str:
    """Run ``packload ARGS``: it must fail with one line holding each of ``words``; that line."""
    code, err = cli(args)
    assert one_line_error(code, err) is None, err
    for word in words:
        assert word in err, err
    return err.strip()


@pytest.fixture()
def keep_packs(tmp_path: Path) -> dict[str, Path]:
    src = _source(tmp_path / "src", ["cat/a.jpg", "cat/b.png", "dog/c.JPEG", "dog/deep/d.png", "dog/e.png"])
    return {backend: _pack(src, tmp_path / f"k.{backend}") for backend in BACKENDS}


# -- what comes out --------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_keep_pack_round_trips_byte_for_byte(keep_packs: dict[str, Path], tmp_path: Path, backend: str) -> None:
    out = tmp_path / "nested" / "out"
    result = unpack(keep_packs[backend], out, progress=False)
    assert _files(out) == _files(tmp_path / "src")
    assert result["files"] == len(_files(out)) == 5
    assert result["bytes"] == sum(len(b) for b in _files(out).values())
    assert result["renamed"] == [] and result["out"] == str(out)
    assert _leftovers(tmp_path / "nested") == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_reencoded_suffix_collisions_get_distinct_files(tmp_path: Path, backend: str) -> None:
    names = [f"{c}/a{s}" for c in ("x", "y") for s in (".jpg", ".png", ".JPEG")]
    packed = _pack(_source(tmp_path / "src", names), tmp_path / f"p.{backend}", encoding="png")
    out = tmp_path / "out"
    code, err = cli(["unpack", str(packed), str(out)], stdout := io.StringIO())
    assert code == 0, err
    written = _files(out)
    assert sorted(written) == sorted(f"{c}/{n}" for c in ("x", "y") for n in ("a.png", "a.jpg.png", "a.JPEG.png"))
    stored = {path: payload for path, _, payload in records_of(packed)}
    for path, payload in stored.items():  # each record in its own file, with its own bytes
        name = path if path.endswith(".png") else path + ".png"
        assert written[name] == payload
    summary = stdout.getvalue()
    assert "unpacked 6 files" in summary and "4 files kept their whole name" in summary and ".png); " in summary
    result = unpack(packed, tmp_path / "again", progress=False)
    assert result["files"] == 6
    assert sorted(r["written_as"] for r in result["renamed"]) == sorted(
        f"{c}/a{s}.png" for c in ("x", "y") for s in (".jpg", ".JPEG"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_fitting_suffixes_are_kept_and_others_changed(tmp_path: Path, backend: str) -> None:
    packed = _pack(_source(tmp_path / "src", ["n/x.JPEG", "n/y.png", "n/z.jpg"]), tmp_path / f"j.{backend}",
                   encoding="jpeg")
    result = unpack(packed, tmp_path / "out", progress=False)
    assert sorted(_files(tmp_path / "out")) == ["n/x.JPEG", "n/y.jpg", "n/z.jpg"]
    assert result["files"] == 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_raw_pack_unpacks_as_png_with_the_same_pixels(tmp_path: Path, backend: str) -> None:
    packed = _pack(_source(tmp_path / "src", ["a/p.png", "a/q.jpg"]), tmp_path / f"r.{backend}",
                   encoding="raw", size=(8, 8))
    result = unpack(packed, tmp_path / "out", progress=False)
    assert result["files"] == 2 and sorted(_files(tmp_path / "out")) == ["a/p.png", "a/q.png"]
    with PackReader(packed) as reader:
        for i in range(reader.records):
            name = Path(reader.path_of(i)).with_suffix(".png").name
            pixels = np.asarray(Image.open(tmp_path / "out" / "a" / name).convert("RGB"))
            assert pixels.tobytes() == bytes(reader.payload(i))


def test_the_rule_itself() -> None:
    """The collision rule on names alone: only suffix changes that meet another name are renamed."""
    assert plan_targets(["a.jpg", "b.jpg"], ["PNG", "PNG"]) == [Target(PurePosixPath("a.png")),
                                                                Target(PurePosixPath("b.png"))]
    assert plan_targets(["a.jpg", "a.png"], None) == [Target(PurePosixPath("a.jpg")), Target(PurePosixPath("a.png"))]
    swapped = plan_targets(["s.png", "s.jpg"], ["JPEG", "PNG"])  # never named after the other's original
    assert [str(t.path) for t in swapped] == ["s.png.jpg", "s.jpg.png"] and all(t.renamed for t in swapped)
    with pytest.raises(PackFormatError, match="both be written to 'a.jpg.png'"):
        plan_targets(["a.jpg", "a.png", "a.jpg.png"], ["PNG", "PNG", "PNG"])
    with pytest.raises(UsageError, match="ignores case"):
        plan_targets(["A.png", "a.png"], None, fold_case=True)
    folded = plan_targets(["A.jpg", "a.png"], ["PNG", "PNG"], fold_case=True)
    assert [str(t.path) for t in folded] == ["A.jpg.png", "a.png"]


# -- hostile names ---------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("paths", [["a/x.jpg", "a/x.jpg"], ["a/x", "a/x/y.jpg"]], ids=["same path", "file and folder"])
def test_records_that_still_collide_are_refused_before_writing(tmp_path: Path, backend: str,
                                                               paths: list[str]) -> None:
    packed = craft_pack(tmp_path / f"h.{backend}", [(p, 0, jpeg_bytes(seed=k)) for k, p in enumerate(paths)])
    out = tmp_path / "out"
    _error(["unpack", "--quiet", str(packed), str(out)], "the pack is damaged or crafted", repr(paths[0]))
    assert not out.exists() and _leftovers(tmp_path) == []
    with pytest.raises(PackFormatError):
        unpack(packed, out, progress=False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_case_only_differences(tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    packed = craft_pack(tmp_path / f"c.{backend}", [("a/A.jpg", 0, jpeg_bytes(seed=1)), ("a/a.jpg", 0, jpeg_bytes())])
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        folds = unpack_module._folds_case(fd)
    finally:
        os.close(fd)
    if not folds:  # the usual, case-sensitive folder: two files
        assert unpack(packed, tmp_path / "sensitive", progress=False)["files"] == 2
        assert len(_files(tmp_path / "sensitive")) == 2
    monkeypatch.setattr(unpack_module, "_folds_case", lambda fd: True)
    out = tmp_path / "folding"
    _error(["unpack", "--quiet", str(packed), str(out)], "ignores case", "'a/A.jpg'", "'a/a.jpg'")
    assert not out.exists() and _leftovers(tmp_path) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_case_folding_renames_a_changed_suffix(tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    packed = _pack(_source(tmp_path / "src", ["a/X.jpg", "a/x.png"]), tmp_path / f"f.{backend}", encoding="png")
    monkeypatch.setattr(unpack_module, "_folds_case", lambda fd: True)
    result = unpack(packed, tmp_path / "out", progress=False)
    assert sorted(_files(tmp_path / "out")) == ["a/X.jpg.png", "a/x.png"]
    assert result["renamed"] == [{"path": "a/X.jpg", "written_as": "a/X.jpg.png"}]


def test_a_name_the_plan_missed_is_never_overwritten(keep_packs: dict[str, Path], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The second guard: a later record landing on a file this unpack wrote is an error."""
    real = unpack_module.write_replacing
    monkeypatch.setattr(unpack_module, "write_replacing", lambda fd, name, *rest: real(fd, "same.png", *rest))
    out = tmp_path / "out"
    _error(["unpack", "--quiet", str(keep_packs["shards"]), str(out)], "two records map to this one file")
    assert not out.exists() and _leftovers(tmp_path) == []


# -- links -----------------------------------------------------------------------------------
@pytest.fixture()
def victim(tmp_path: Path) -> Path:
    root = tmp_path / "victim"
    (root / "cat").mkdir(parents=True)
    (root / "cat" / "a.jpg").write_bytes(b"victim's own a.jpg")
    (root / "secret.txt").write_bytes(b"victim's secret")
    return root


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("overwrite", [False, True])
def test_out_itself_a_link_is_refused(keep_packs: dict[str, Path], tmp_path: Path, victim: Path, backend: str,
                                      overwrite: bool) -> None:
    before = _snapshot(victim)
    for target in (victim, victim / "cat", victim / "secret.txt", tmp_path / "dangling"):
        link = tmp_path / f"link-{target.name}"
        link.symlink_to(target)
        flags = ["--overwrite"] if overwrite else []
        _error(["unpack", "--quiet", *flags, str(keep_packs[backend]), str(link)], str(link), "symbolic link")
        assert link.is_symlink() and not (tmp_path / "dangling").exists()
    assert _snapshot(victim) == before


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where", ["cat", "dog/deep", "dog"])
def test_a_folder_link_below_out_is_refused(keep_packs: dict[str, Path], tmp_path: Path, victim: Path,
                                            backend: str, where: str) -> None:
    out = tmp_path / "out"
    (out / where).parent.mkdir(parents=True, exist_ok=True)
    (out / where).symlink_to(victim / "cat", target_is_directory=True)
    before = _snapshot(victim)
    _error(["unpack", "--quiet", str(keep_packs[backend]), str(out)], "not empty", "--overwrite")
    _error(["unpack", "--quiet", "--overwrite", str(keep_packs[backend]), str(out)],
           str(out / where), "symbolic link", "remove it")
    assert _snapshot(victim) == before
    assert (out / where).is_symlink() and _leftovers(tmp_path) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_file_links_below_out_are_replaced_not_followed(keep_packs: dict[str, Path], tmp_path: Path,
                                                        victim: Path, backend: str) -> None:
    out = tmp_path / "out"
    (out / "cat").mkdir(parents=True)
    (out / "dog" / "deep").mkdir(parents=True)
    (out / "cat" / "a.jpg").symlink_to(victim / "cat" / "a.jpg")
    (out / "dog" / "deep" / "d.png").symlink_to(victim / "secret.txt")
    (out / "dog" / "e.png").symlink_to(victim / "secret.txt")
    (out / "mine.txt").write_bytes(b"kept")
    before = _snapshot(victim)
    result = unpack(keep_packs[backend], out, overwrite=True, progress=False)
    assert _snapshot(victim) == before
    assert not any(p.is_symlink() for p in out.rglob("*"))
    expected = dict(_files(tmp_path / "src"), **{"mine.txt": b"kept"})
    assert _files(out) == expected and result["files"] == 5
    assert _leftovers(out) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_components_that_are_not_folders(keep_packs: dict[str, Path], tmp_path: Path, backend: str) -> None:
    out = tmp_path / "out"
    (out / "dog").mkdir(parents=True)
    (out / "dog" / "deep").write_bytes(b"a file where a folder goes")
    _error(["unpack", "--quiet", "--overwrite", str(keep_packs[backend]), str(out)],
           str(out / "dog" / "deep"), "not a folder")
    assert (out / "dog" / "deep").read_bytes() == b"a file where a folder goes"
    (out / "dog" / "deep").unlink()
    (out / "dog" / "e.png").unlink()  # written before the unpack reached dog/deep
    (out / "dog" / "e.png").mkdir()
    _error(["unpack", "--quiet", "--overwrite", str(keep_packs[backend]), str(out)], str(out / "dog" / "e.png"),
           "is a folder")
    assert _leftovers(out) == []


# -- --overwrite and the pack ----------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_overwrite_replaces_same_named_files_only(keep_packs: dict[str, Path], tmp_path: Path, backend: str) -> None:
    out = tmp_path / "out"
    (out / "cat").mkdir(parents=True)
    (out / "cat" / "a.jpg").write_bytes(b"old")
    (out / "cat" / "other.txt").write_bytes(b"other")
    result = unpack(keep_packs[backend], out, overwrite=True, progress=False)
    assert _files(out) == dict(_files(tmp_path / "src"), **{"cat/other.txt": b"other"})
    assert result["files"] == 5


@pytest.mark.parametrize("backend", BACKENDS)
def test_never_into_the_pack(keep_packs: dict[str, Path], tmp_path: Path, backend: str) -> None:
    packed = keep_packs[backend]
    records = records_of(packed)
    link = tmp_path / "alias"
    link.symlink_to(tmp_path, target_is_directory=True)  # the pack's folder by another name
    outside = "unpack into a folder outside the pack"
    cases = [(packed, "not a folder" if backend == "lmdb" else outside), (tmp_path, outside),
             (link, "symbolic link")]
    if backend == "shards":
        (packed / "inside").mkdir()
        cases += [(packed / "inside", outside), (packed / "new" / "deeper", outside),
                  (link / packed.name / "sub", outside)]
    for out, expected in cases:
        _error(["unpack", "--quiet", "--overwrite", str(packed), str(out)], str(out), expected)
    assert records_of(packed) == records
    if backend == "shards":
        assert not (packed / "new").exists() and list((packed / "inside").iterdir()) == []


def test_out_an_existing_file(keep_packs: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"x")
    for flags in ([], ["--overwrite"]):
        _error(["unpack", *flags, str(keep_packs["lmdb"]), str(tmp_path / "file")], "not a folder")
    assert (tmp_path / "file").read_bytes() == b"x"


# -- interrupted -----------------------------------------------------------------------------
def _damage_payload(packed: Path, record: int) -> None:
    """Flip a byte in the middle of record ``record``'s stored bytes: in every copy of them, since an
    LMDB file can keep stale copies of a chunk in free pages (written before a checkpoint)."""
    with PackReader(packed) as reader:
        payload = bytes(reader.payload(record))
    found = 0
    for file in ([packed] if packed.is_file() else sorted(packed.glob("shard-*"))):
        data = bytearray(file.read_bytes())
        at = data.find(payload)
        while at >= 0:
            data[at + len(payload) // 2] ^= 0xFF
            found += 1
            at = data.find(payload, at + len(payload))
        file.write_bytes(bytes(data))
    assert found, "payload not found"


@pytest.mark.parametrize("backend", BACKENDS)
def test_damaged_record_leaves_no_out(keep_packs: dict[str, Path], tmp_path: Path, backend: str) -> None:
    packed = keep_packs[backend]
    _damage_payload(packed, 3)
    out = tmp_path / "parent" / "out"
    _error(["unpack", "--quiet", str(packed), str(out)], "checksum mismatch")
    assert not out.exists() and _leftovers(tmp_path / "parent") == []
    empty = tmp_path / "empty"
    empty.mkdir()
    _error(["unpack", "--quiet", str(packed), str(empty)], "checksum mismatch")
    assert list(empty.iterdir()) == []  # emptied again: it was empty before
    full = tmp_path / "full"
    full.mkdir()
    (full / "mine.txt").write_bytes(b"mine")
    _error(["unpack", "--quiet", "--overwrite", str(packed), str(full)], "checksum mismatch")
    assert (full / "mine.txt").read_bytes() == b"mine" and _leftovers(full) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_interrupt_leaves_no_out(keep_packs: dict[str, Path], tmp_path: Path, backend: str,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    real = unpack_module.write_replacing
    calls = []

    def interrupted(*args: object) -> None:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(unpack_module, "write_replacing", interrupted)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        unpack(keep_packs[backend], out, progress=False)
    assert not out.exists() and _leftovers(tmp_path) == []
