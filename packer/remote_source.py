"""An ImageFolder tree on an object store as a pack's source: ``pack s3://bucket/images/ ...``.

``scan_url`` lists the objects under the prefix once and orders them as ``scan_folder`` orders a
local folder (classes: the first-level "folders", sorted; files in deeper ones belong to their
top-level class; folders by path, files by name within each; only the ImageFolder extensions;
hidden files and folders, and files outside the class folders, left out with the reason). The
Ray engine lists the first level on the driver (``list_top_url``) and each class prefix in a Ray
task (``list_class_url``), by the same rules (``list_class_keys``; see ``packer.ray_scan``).
``fetched_stream`` fetches the objects of a range, many requests in flight, and checks and encodes
each as ``encode_file`` does a local file, in order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from packload.core.errors import UsageError
from packload.core.remote import RemoteMissingError, RemoteStore
from packload.core.scan import ClassListing, Sample, ScanResult, TopListing, is_image_name, merge_listings
from packload.packer.encode import Encoded, EncodeOptions, Skipped, encode_data

FETCH_THREADS = 16  # object requests in flight per task: each waits on the network, not on a CPU
FETCH_AHEAD = 64  # objects fetched (or being fetched) ahead of the one being encoded


def source_name(url: str) -> str:
    """The source's name in the manifest: the prefix's last component, as a folder's name."""
    return url.rstrip("/").rsplit("/", 1)[-1]


def list_class_keys(keys: Iterable[str]) -> ClassListing:
    """The image keys of ``keys`` (relative to the source's prefix: one class's, or, unlabelled, the
    whole source's) in ``scan_folder``'s order: folders sorted by path, files by name within each;
    with what is left out, and why. The one place a class prefix's keys are sorted out."""
    ignored: list[dict[str, str]] = []
    by_folder: dict[str, list[str]] = {}
    hidden_folders: set[str] = set()
    for key in keys:
        parts = key.split("/")
        hidden = next((i for i, part in enumerate(parts[:-1]) if part.startswith(".")), None)
        if hidden is not None:  # a hidden folder is not walked: listed once, as scan_folder does
            hidden_folders.add("/".join(parts[: hidden + 1]))
            continue
        name = parts[-1]
        if name.startswith("."):
            ignored.append({"path": key, "reason": "hidden file"})
        elif not is_image_name(name):
            ignored.append({"path": key, "reason": "not an image extension"})
        else:
            by_folder.setdefault("/".join(parts[:-1]), []).append(key)
    ignored.extend({"path": path, "reason": "hidden folder"} for path in sorted(hidden_folders))
    files = [key for folder in sorted(by_folder) for key in sorted(by_folder[folder], key=lambda k: k.rsplit("/", 1)[-1])]
    return ClassListing(files, ignored)


def top_of_keys(root: Path, top_files: Iterable[str], top_folders: Iterable[str]) -> TopListing:
    """The top level of a tree whose first-level objects are ``top_files`` and whose first-level
    "folders" (prefixes holding at least one object) are ``top_folders``, as ``list_top`` makes a
    folder's: classes sorted, hidden entries and files beside the classes left out with the reason."""
    files, folders = sorted(top_files), sorted(top_folders)
    ignored = [{"path": name, "reason": "hidden folder"} for name in folders if name.startswith(".")]
    ignored += [{"path": name, "reason": "hidden file"} for name in files if name.startswith(".")]
    classes = [name for name in folders if not name.startswith(".")]
    outside = ([{"path": name, "reason": "file outside the class folders"} for name in files
                if not name.startswith(".")] if classes else [])
    return TopListing(root, classes, ignored, outside)


NO_IMAGES_HINT = "give the prefix that holds one sub-folder of images per class"


def scan_keys(keys: Iterable[str], root: Path) -> ScanResult:
    """``scan_folder``'s result for a tree whose files are ``keys`` (paths relative to ``root``,
    ``/``-separated): the same classes, samples in the same order, and the same left-out list."""
    keys = list(keys)
    top_files: set[str] = set()
    under: dict[str, list[str]] = {}
    for key in keys:
        head, sep, _ = key.partition("/")
        if sep:
            under.setdefault(head, []).append(key)
        else:
            top_files.add(head)
    top = top_of_keys(root, top_files, under)
    # Unlabelled, the whole tree is walked, as scan_folder does: what is hidden at the top is listed again.
    listings = [list_class_keys(under[name]) for name in top.classes] if top.classes else [list_class_keys(keys)]
    return merge_listings(top, listings, NO_IMAGES_HINT)


def list_top_url(url: str, storage_options: dict[str, Any] | None = None) -> tuple[TopListing, RemoteStore]:
    """The top level of the tree under the prefix ``url`` (one listing of its first level, not of
    the whole tree), and its store. One-line errors for a missing bucket or an empty prefix."""
    store = RemoteStore(url, storage_options)
    store.check_bucket()
    files, folders = store.listing_top()
    if not files and not folders:
        raise UsageError(f"{url}: nothing is stored under this prefix; give the prefix that holds one "
                         "sub-folder of images per class (for example s3://bucket/images/)")
    return top_of_keys(Path(source_name(url)), files, folders), store


def list_class_url(store: RemoteStore, name: str) -> ClassListing | None:
    """The keys of the class prefix ``name`` under the source's ``store``, sorted out as
    ``scan_keys`` does (keys relative to the source); None when nothing is stored under it (a
    folder marker only: no class)."""
    keys = store.listing_all(name)
    if not keys:
        return None
    return list_class_keys(f"{name}/{key}" for key in sorted(keys))


def scan_url(url: str, storage_options: dict[str, Any] | None = None) -> ScanResult:
    """Scan the ImageFolder tree under the prefix ``url`` with one listing (see ``scan_keys``); its
    ``root`` is the prefix's name. One-line errors for a missing bucket or an empty prefix."""
    store = RemoteStore(url, storage_options)
    store.check_bucket()
    listing = store.listing_all()
    if not listing:
        raise UsageError(f"{url}: nothing is stored under this prefix; give the prefix that holds one "
                         "sub-folder of images per class (for example s3://bucket/images/)")
    with url_errors(url):
        return scan_keys(sorted(listing), Path(source_name(url)))


@contextmanager
def url_errors(url: str) -> Iterator[None]:
    """A scan's one-line error names the URL rather than the prefix's name."""
    try:
        yield
    except UsageError as exc:
        raise UsageError(f"{url}: {str(exc).split(': ', 1)[1]}") from None


def _fetch_and_encode(store: RemoteStore, sample: Sample, options: EncodeOptions) -> Encoded | Skipped:
    try:
        data = store.read_object(sample.path)
    except RemoteMissingError:
        return Skipped(sample.path, "unreadable: the object is gone from the store since it was listed")
    return encode_data(sample, data, options)


def fetched_stream(url: str, samples: list[Sample], options: EncodeOptions,
                   storage_options: dict[str, Any] | None = None) -> Iterator[Encoded | Skipped]:
    """Every object of ``samples`` under ``url``, fetched (``FETCH_THREADS`` requests in flight, at
    most ``FETCH_AHEAD`` objects held), checked and encoded, in order."""
    store = RemoteStore(url, storage_options)
    pending: deque[Future[Encoded | Skipped]] = deque()
    upcoming = iter(samples)
    with ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="packload-fetch") as pool:
        try:
            for sample in upcoming:
                pending.append(pool.submit(_fetch_and_encode, store, sample, options))
                if len(pending) >= FETCH_AHEAD:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()
