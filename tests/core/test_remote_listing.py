"""What a store's listing says of each object (``packload.core.remote_listing``): its size, its version
as a pinned read names it, and whether bytes are that version by their MD5; read from real listings
of moto's S3 server (tests/object_store.py) and of fsspec's local filesystem, and from entries in the
shape gcsfs gives."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from typing import Any

import pytest

from packload.core.remote_listing import content_matches_tag, read_listing, read_top_listing, tag_of

BUCKET = "remote-listing"


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    """moto's S3 server with ``remote-listing/p/``: two objects, a folder marker of ``p`` itself (as a
    console's "create folder" leaves), and objects under three sub-prefixes."""
    pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[dev]')")
    pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")
    from tests.object_store import ObjectStore  # noqa: PLC0415 - only with the dev extra

    with ObjectStore() as store:
        store.make_bucket(BUCKET)
        fs = store.filesystem()
        fs.pipe({f"{BUCKET}/p/": b"", f"{BUCKET}/p/a.bin": b"hello", f"{BUCKET}/p/shard-00000.bin": b"x" * 1000,
                 f"{BUCKET}/p/sub/b.bin": b"yy", f"{BUCKET}/p/zz/c.bin": b"z", f"{BUCKET}/p/aa/d.bin": b"d"})
        yield fs


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


# -- versions ------------------------------------------------------------------------------------
def test_an_s3_objects_version_is_its_etag(s3: Any) -> None:
    item = s3.info(f"{BUCKET}/p/a.bin")
    assert tag_of(item) == f'etag:"{md5_hex(b"hello")}"'


def test_a_generation_wins_over_an_etag_and_either_case_of_etag_is_read() -> None:
    assert tag_of({"generation": "1712345678901234", "etag": "CNiu6bPv4oUDEAE="}) == "generation:1712345678901234"
    assert tag_of({"generation": "", "etag": "CNiu"}) == "etag:CNiu"  # no generation: the ETag
    assert tag_of({"ETag": '"abc"'}) == 'etag:"abc"' and tag_of({"name": "b/x", "size": 3}) is None


def test_an_s3_etag_tells_whether_bytes_are_its_version(s3: Any) -> None:
    item = s3.info(f"{BUCKET}/p/a.bin")
    tag = tag_of(item)
    assert content_matches_tag(tag, b"hello", item) is True
    assert content_matches_tag(tag, b"hellO", item) is False
    assert content_matches_tag(tag, b"hello") is True  # the tag alone is enough


def test_a_multipart_etag_or_a_generation_alone_cannot_tell() -> None:
    multipart = f'etag:"{md5_hex(b"part one")}-2"'  # S3's ETag of a two-part upload: no MD5 of the bytes
    assert content_matches_tag(multipart, b"part one") is None
    assert content_matches_tag("generation:17", b"data") is None and content_matches_tag(None, b"data") is None


def test_a_gcs_md5hash_is_read_before_the_tag() -> None:
    data = b"a GCS object"
    item = {"generation": "5", "md5Hash": base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()}
    assert content_matches_tag("generation:5", data, item) is True
    assert content_matches_tag("generation:5", data + b"!", item) is False
    # the item's MD5 decides even where the tag's would say otherwise
    assert content_matches_tag(f'etag:"{md5_hex(b"other")}"', data, item) is True
    assert content_matches_tag("generation:5", data, {"md5Hash": None}) is None  # not a string: not read


# -- listings ------------------------------------------------------------------------------------
def test_read_listing_of_a_real_s3_prefix(s3: Any) -> None:
    s3.invalidate_cache()
    sizes, tags, listed = read_listing(s3.ls(f"{BUCKET}/p", detail=True))
    # the objects directly under p/: not the sub-prefixes, not p's own folder marker
    assert sizes == {"a.bin": 5, "shard-00000.bin": 1000}
    assert tags == {"a.bin": f'etag:"{md5_hex(b"hello")}"', "shard-00000.bin": f'etag:"{md5_hex(b"x" * 1000)}"'}
    assert set(listed) == set(sizes) and listed["a.bin"]["name"] == f"{BUCKET}/p/a.bin"


def test_read_listing_of_a_local_folder_has_no_versions(tmp_path: Any) -> None:
    fsspec = pytest.importorskip("fsspec")
    (tmp_path / "one.bin").write_bytes(b"1" * 7)
    (tmp_path / "empty.bin").write_bytes(b"")
    (tmp_path / "folder").mkdir()
    sizes, tags, listed = read_listing(fsspec.filesystem("file").ls(str(tmp_path), detail=True))
    assert sizes == {"one.bin": 7, "empty.bin": 0} and tags == {} and set(listed) == {"one.bin", "empty.bin"}


def test_read_top_listing_of_a_real_s3_prefix(s3: Any) -> None:
    s3.invalidate_cache()
    files, folders = read_top_listing(s3.ls(f"{BUCKET}/p", detail=True), f"{BUCKET}/p")
    assert files == {"a.bin": 5, "shard-00000.bin": 1000} and folders == ["aa", "sub", "zz"]


def test_read_top_listing_takes_a_missing_size_as_zero() -> None:
    found = [{"name": "b/p/", "type": "directory"}, {"name": "b/p/x", "type": "file", "size": None},
             {"name": "b/p/d/", "type": "directory"}]
    assert read_top_listing(found, "b/p") == ({"x": 0}, ["d"])
