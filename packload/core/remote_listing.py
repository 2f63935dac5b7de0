"""What a store's listing says of each object: its size, and its version as a read pinned to it
names it (S3's ETag, GCS's generation); and whether bytes read are that version, by their MD5."""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Any


def tag_of(item: dict[str, Any]) -> str | None:
    """The version of a listed object, as a pinned read names it: ``generation:N`` (GCS) or
    ``etag:"..."`` (S3 and others that give an ETag); None when the store gives neither."""
    generation = item.get("generation")
    if generation:
        return f"generation:{generation}"
    etag = item.get("ETag") or item.get("etag")
    return f"etag:{etag}" if etag else None


def content_matches_tag(tag: str | None, data: bytes, item: dict[str, Any] | None = None) -> bool | None:
    """Whether ``data`` are the bytes of the object version ``tag`` (listed with ``item``) by their
    MD5, where the store gives one (a single-part S3 upload's ETag, GCS's ``md5Hash``); None when
    it cannot tell."""
    md5 = hashlib.md5(data, usedforsecurity=False)
    if item and isinstance(item.get("md5Hash"), str):
        return base64.b64encode(md5.digest()).decode() == item["md5Hash"]
    if tag and tag.startswith("etag:"):
        etag = tag[5:].strip('"')
        if re.fullmatch(r"[0-9a-f]{32}", etag):
            return md5.hexdigest() == etag
    return None



def read_listing(found: list[dict[str, Any]]) -> tuple[dict[str, int], dict[str, str], dict[str, dict[str, Any]]]:
    """The objects of a listing's entries ``found`` (folders, and the keys ending in ``/`` that mark one,
    left out), each by its name: its size, its version (where the store gives one), and its entry as
    listed."""
    sizes: dict[str, int] = {}
    tags: dict[str, str] = {}
    listed: dict[str, dict[str, Any]] = {}
    for item in found:
        if item.get("type") == "directory" or item["name"].endswith("/"):  # a folder, or a folder's marker
            continue
        name = item["name"].rsplit("/", 1)[-1]
        sizes[name] = int(item.get("size") or 0)
        listed[name] = item
        tag = tag_of(item)
        if tag:
            tags[name] = tag
    return sizes, tags, listed


def read_top_listing(found: list[dict[str, Any]], root: str) -> tuple[dict[str, int], list[str]]:
    """The first level under ``root`` in a listing's entries ``found``: its objects (name -> size) and
    the names of its sub-prefixes ("folders"), sorted."""
    files: dict[str, int] = {}
    folders: list[str] = []
    for item in found:
        path = item["name"].rstrip("/")
        if path == root:  # a folder marker of the prefix itself
            continue
        name = path.rsplit("/", 1)[-1]
        if item.get("type") == "directory":
            folders.append(name)
        else:
            files[name] = int(item.get("size") or 0)
    return files, sorted(folders)
