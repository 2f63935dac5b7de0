"""The source listed in Ray tasks (``packer.ray_scan``): on odd trees, local and at a URL (moto's S3
server), the scan equals ``scan_folder`` / ``scan_url`` exactly (classes, samples in order, the
left-out list with reasons); the listing ran in Ray's workers (the task log); an unlabelled tree is
scanned on the driver; a listing task that keeps failing fails the pack in one line."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from packload import PackloadError, pack, pack_ray
from packload.core.errors import UsageError
from packload.core.scan import scan_folder
from packload.packer.ray_scan import check_source_seen, class_groups, list_source_top, scan_in_tasks
from tests.image_factory import write_image
from tests.packer.test_ray_engine import manifest_of, records_of
from tests.ray_faults import logged_scans
from tests.ray_local import LocalRay, local_ray  # noqa: F401 - a fixture

BUCKET = "rayscan"


@pytest.fixture(scope="module")
def credentials() -> Iterator[None]:
    """moto's fake credentials in the environment before Ray starts, so its workers inherit them."""
    from tests.object_store import FAKE_CREDENTIALS

    saved = {key: os.environ.get(key) for key in FAKE_CREDENTIALS}
    os.environ.update(FAKE_CREDENTIALS)
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="module")
def ray_here(credentials: None, local_ray: LocalRay) -> LocalRay:  # noqa: F811 - the fixture imported above
    return local_ray


def _odd_tree(root: Path) -> Path:
    """Classes with nested folders, an empty class, hidden entries, a FIFO and a link to /dev/zero
    named .jpg, a symlink loop, a broken link, a name that is not UTF-8, a linked class folder, files
    outside the classes."""
    for k, name in enumerate(["ant/a.jpg", "ant/B.PNG", "ant/deep/c.jpg", "ant/deep/deeper/d.webp",
                              "ant/.hidden.jpg", "ant/.cache/e.jpg", "cow/1.jpg", "cow/sub/2.jpg", ".git/y.jpg",
                              "stray.jpg", "elsewhere/dogs/x.jpg"]):
        write_image(root / name, fmt="PNG", seed=k)
    (root / "bee").mkdir()  # an empty class: still a class
    (root / "ant" / "notes.txt").write_text("not an image")
    os.mkfifo(root / "ant" / "pipe.jpg")
    (root / "ant" / "zero.jpg").symlink_to("/dev/zero")
    (root / "ant" / "loop").symlink_to(root / "ant")
    (root / "cow" / "gone.jpg").symlink_to(root / "nowhere.jpg")
    with open(os.path.join(os.fsencode(root / "cow"), b"\xff.jpg"), "wb") as f:
        f.write((root / "cow" / "1.jpg").read_bytes())
    (root / ".DS_Store").write_bytes(b"x")
    (root / "dog").symlink_to(root / "elsewhere" / "dogs")
    return root


def _scanned_in_tasks(src: Path | str, options: dict | None = None):
    import ray

    top = list_source_top(src, options)
    root = str(src).rstrip("/") if isinstance(src, str) else str(top.root.resolve())
    return scan_in_tasks(ray, src, top, root, max_retries=1, storage_options=options)


def test_class_groups_cover_the_classes_in_order() -> None:
    assert class_groups(10, 4) == [(0, 2), (2, 5), (5, 7), (7, 10)]
    assert class_groups(3, 8) == [(0, 1), (1, 2), (2, 3)]
    assert class_groups(1, 1) == [(0, 1)]


def test_a_node_that_does_not_see_the_source_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not found on node .* every node sees"):
        check_source_seen(str(tmp_path / "missing"))
    check_source_seen(str(tmp_path))  # seen: no error


def test_odd_tree_scans_in_tasks_as_the_folder_scan(ray_here: LocalRay, tmp_path: Path) -> None:
    src = _odd_tree(tmp_path / "images")
    ray_here.log.unlink(missing_ok=True)
    scan, where = _scanned_in_tasks(src)
    serial = scan_folder(src)
    assert scan == serial  # root, classes, samples in order, ignored with reasons
    assert scan.classes == ["ant", "bee", "cow", "dog", "elsewhere"] and len(scan.samples) > 5
    reasons = {item["path"]: item["reason"] for item in scan.ignored}
    assert "FIFO" in reasons["ant/pipe.jpg"] and "device" in reasons["ant/zero.jpg"]
    assert reasons["ant/loop"].startswith("symlink loop") and reasons[".git"] == "hidden folder"
    assert "cow/gone.jpg" in [s.path for s in scan.samples]  # a broken link is kept: reading it names it
    assert sorted(logged_scans(ray_here.log)) == scan.classes  # each class listed once, in a Ray worker
    assert where["scan_tasks"] == 4 and sum(where["scan_tasks_per_node"].values()) == 4  # 2 CPUs, 2 per CPU


def test_an_unlabelled_folder_is_scanned_on_the_driver(ray_here: LocalRay, tmp_path: Path) -> None:
    for k, name in enumerate(["b.png", "a.jpg", "sub/c.jpg", ".hidden.jpg"]):
        write_image(tmp_path / "flat" / name, fmt="PNG", seed=k)
    (tmp_path / "flat" / "sub").rename(tmp_path / "flat" / ".sub")  # no class folder left
    ray_here.log.unlink(missing_ok=True)
    scan, where = _scanned_in_tasks(tmp_path / "flat")
    assert scan == scan_folder(tmp_path / "flat") and not scan.labelled
    assert where["scan_tasks"] == 0 and logged_scans(ray_here.log) == []


def test_a_source_without_images_is_refused_as_the_serial_scan(ray_here: LocalRay, tmp_path: Path) -> None:
    (tmp_path / "empty" / "ant").mkdir(parents=True)
    (tmp_path / "empty" / "ant" / "notes.txt").write_text("x")
    with pytest.raises(UsageError, match="no images found") as serial:
        scan_folder(tmp_path / "empty")
    with pytest.raises(UsageError, match="no images found") as in_tasks:
        _scanned_in_tasks(tmp_path / "empty")
    assert str(in_tasks.value) == str(serial.value)


def test_a_failing_listing_task_fails_the_pack_in_one_line(ray_here: LocalRay, tmp_path: Path) -> None:
    src = _odd_tree(tmp_path / "images")
    ray_here.marker.write_text("scan")
    try:
        with pytest.raises(PackloadError, match="listing the source's classes failed after 1 retry .*injected"):
            pack_ray(src, tmp_path / "out.shards", task_files=4, progress=False, max_retries=1)
    finally:
        ray_here.marker.unlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]  # nothing left behind


def test_the_pack_of_an_odd_tree_equals_a_local_pack(ray_here: LocalRay, tmp_path: Path) -> None:
    src = _odd_tree(tmp_path / "images")
    pack(src, tmp_path / "local.lmdb", workers=1, progress=False)
    result = pack_ray(src, tmp_path / "ray.lmdb", task_files=3, progress=False)
    assert result["ray"]["scan_tasks"] == 4 and result["records"] == len(records_of(tmp_path / "local.lmdb"))
    assert records_of(tmp_path / "ray.lmdb") == records_of(tmp_path / "local.lmdb")
    assert manifest_of(tmp_path / "ray.lmdb") == manifest_of(tmp_path / "local.lmdb")  # same ignored list


# At a URL ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def store(ray_here: LocalRay):
    pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[dev]')")
    pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")
    from tests.object_store import ObjectStore

    with ObjectStore() as s:
        s.make_bucket(BUCKET)
        yield s


def _put(store, keys: dict[str, bytes]) -> None:
    fs = store.filesystem()
    for key, data in keys.items():
        if key.endswith("/"):  # a folder marker: an empty object whose key ends in "/"
            fs.call_s3("put_object", Bucket=BUCKET, Key=key, Body=b"")
        else:
            fs.pipe_file(f"{BUCKET}/{key}", data)


def test_odd_prefix_scans_in_tasks_as_the_url_scan(ray_here: LocalRay, store, tmp_path: Path) -> None:
    from packload.packer.remote_source import scan_url

    image = write_image(tmp_path / "x.png", fmt="PNG").read_bytes()
    _put(store, {f"odd/{key}": image for key in [
        "ant/a.jpg", "ant/B.PNG", "ant/deep/c.jpg", "ant/deep/.x/f.jpg", "ant/.hidden.jpg", "ant/.cache/e.jpg",
        "ant/notes.txt", "bee/only.txt", "cow/1.jpg", "cow/sub/deeper/2.jpg", ".git/y.jpg", "stray.jpg",
        ".DS_Store", "marked/", "cow/sub/"]})
    url = f"s3://{BUCKET}/odd/"
    ray_here.log.unlink(missing_ok=True)
    scan, where = _scanned_in_tasks(url, store.options)
    serial = scan_url(url.rstrip("/"), store.options)
    assert scan == serial
    assert scan.classes == ["ant", "bee", "cow"]  # "marked/" is a folder marker only: no class
    assert {item["path"] for item in scan.ignored} >= {"ant/deep/.x", "ant/.cache", ".git", "stray.jpg",
                                                        "bee/only.txt"}
    assert where["scan_tasks"] == 4 and sorted(logged_scans(ray_here.log)) == ["ant", "bee", "cow", "marked"]


def test_an_unlabelled_prefix_is_scanned_on_the_driver(ray_here: LocalRay, store, tmp_path: Path) -> None:
    from packload.packer.remote_source import scan_url

    _put(store, {"flat/a.jpg": b"a", "flat/b.png": b"b", "flat/.c.jpg": b"c"})
    scan, where = _scanned_in_tasks(f"s3://{BUCKET}/flat", store.options)
    assert scan == scan_url(f"s3://{BUCKET}/flat", store.options) and where["scan_tasks"] == 0


def test_a_prefix_without_images_is_refused_in_one_line(ray_here: LocalRay, store) -> None:
    _put(store, {"noimg/ant/a.txt": b"a"})
    with pytest.raises(UsageError, match=f"s3://{BUCKET}/noimg: no images found.*give the prefix"):
        _scanned_in_tasks(f"s3://{BUCKET}/noimg", store.options)


def test_the_top_listing_gives_objects_and_prefixes_of_the_first_level(store) -> None:
    from packload.core.remote import RemoteStore

    _put(store, {"top/a.jpg": b"12", "top/ant/x.jpg": b"1", "top/ant/deep/y.jpg": b"1", "top/.git/z": b"1",
                 "top/": b"", "top/marked/": b""})
    files, folders = RemoteStore(f"s3://{BUCKET}/top/", store.options).listing_top()
    assert files == {"a.jpg": 2} and folders == [".git", "ant", "marked"]  # the prefix's own marker left out
    assert RemoteStore(f"s3://{BUCKET}/nothing-here", store.options).listing_top() == ({}, [])
