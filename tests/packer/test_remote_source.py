"""A source at a URL: object keys ordered and filtered as ``scan_folder`` does a local folder, and
objects fetched and encoded in order (moto's S3 server on 127.0.0.1 for the fetching)."""

from __future__ import annotations

from pathlib import Path

import pytest

from packload.core.errors import UsageError
from packload.core.scan import scan_folder
from packload.packer.encode import Encoded, EncodeOptions, Skipped, encode_file
from packload.packer.remote_source import fetched_stream, scan_keys
from tests.image_factory import make_image_folder, write_broken_files, write_hidden_and_stray, write_image


def _keys(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def _odd_tree(root: Path) -> Path:
    """Classes with nested folders whose names sort differently as paths and as names (``sub``,
    ``sub-x``, ``sub/deeper``), hidden files and folders, other extensions, upper-case suffixes."""
    make_image_folder(root, classes=("b", "a", "c"), per_class=3)
    for rel in ("a/sub/1.jpg", "a/sub-x/0.png", "a/sub/deeper/2.jpg", "a/sub0/9.jpg", "a/Z.JPG", "c/.h/x.jpg",
                "c/sub/.h/y.jpg", "b/x/y/z/w.png"):
        write_image(root / rel, seed=len(rel))
    (root / "a" / "readme.md").write_text("no image\n")
    write_broken_files(root / "c")
    write_hidden_and_stray(root)
    return root


def test_keys_scan_as_the_folder_does(tmp_path: Path) -> None:
    root = _odd_tree(tmp_path / "images")
    local, remote = scan_folder(root), scan_keys(_keys(root), Path("images"))
    assert remote.classes == local.classes == ["a", "b", "c"]
    assert remote.samples == local.samples  # same paths, same labels, same order
    assert remote.ignored == local.ignored  # same left-out list, same reasons


def test_an_unlabelled_tree_scans_as_the_folder_does(tmp_path: Path) -> None:
    root = tmp_path / "flat"
    for rel in ("2.jpg", "1.png", ".hidden.jpg", "notes.txt", ".h/4.jpg"):
        write_image(root / rel, seed=3) if rel.endswith((".jpg", ".png")) else (root / rel).write_text("x")
    local, remote = scan_folder(root), scan_keys(_keys(root), Path("flat"))
    assert remote.classes == [] and remote.samples == local.samples and remote.ignored == local.ignored


def test_keys_without_images_are_refused_in_one_line() -> None:
    with pytest.raises(UsageError, match="no images found") as caught:
        scan_keys(["a/notes.txt", ".x.jpg"], Path("images"))
    assert "\n" not in str(caught.value)


def test_objects_are_fetched_and_encoded_in_order(tmp_path: Path) -> None:
    pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[dev]')")
    pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")
    from tests.object_store import ObjectStore  # noqa: PLC0415 - needs moto

    root = tmp_path / "images"
    make_image_folder(root, classes=("a", "b"), per_class=40)
    write_broken_files(root / "b")
    scan = scan_folder(root)
    options = EncodeOptions()
    with ObjectStore() as store:
        store.make_bucket("rsrc")
        fs = store.filesystem()
        for key in _keys(root):
            fs.pipe_file(f"rsrc/images/{key}", (root / key).read_bytes())
        gone = scan.samples[7].path
        fs.rm(f"rsrc/images/{gone}")  # deleted after the listing
        items = list(fetched_stream("s3://rsrc/images", scan.samples, options, store.options))
        fetched = {path.split("?", 1)[0] for method, path, _ in store.proxy.requests if method == "GET"}
    expected = [encode_file(str(root), sample, options) for sample in scan.samples]
    assert [item.path for item in items] == [sample.path for sample in scan.samples]
    assert isinstance(items[7], Skipped) and "gone from the store" in items[7].reason
    for got, want in zip(items[:7] + items[8:], expected[:7] + expected[8:], strict=True):
        assert type(got) is type(want)
        if isinstance(want, Encoded):
            assert (got.payload, got.label, got.width, got.height, got.crc32) == \
                (want.payload, want.label, want.width, want.height, want.crc32)
        else:
            assert got.reason == want.reason  # a broken object is skipped as the broken file is
    assert fetched >= {f"/rsrc/images/{sample.path}" for sample in scan.samples if sample.path != gone}
