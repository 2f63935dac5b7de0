"""An ImageFolder tree on an object store as a pack's source: ``pack s3://bucket/images/ ...``.

``scan_url`` lists the objects under the prefix once and orders them as ``scan_folder`` orders a
local folder (classes: the first-level "folders", sorted; files in deeper ones belong to their
top-level class; folders by path, files by name within each; only the ImageFolder extensions;
hidden files and folders, and files outside the class folders, left out with the reason).
``fetched_stream`` fetches the objects of a range, many requests in flight, and checks and encodes
each as ``encode_file`` does a local file, in order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import repeat
from pathlib import Path
from typing import Any

from packload.core.errors import UsageError
from packload.core.remote import RemoteMissingError, RemoteStore
from packload.core.scan import IMG_EXTENSIONS, Sample, ScanResult, is_image_name
from packload.packer.encode import Encoded, EncodeOptions, Skipped, encode_data

FETCH_THREADS = 16  # object requests in flight per task: each waits on the network, not on a CPU
FETCH_AHEAD = 64  # objects fetched (or being fetched) ahead of the one being encoded


def source_name(url: str) -> str:
    """The source's name in the manifest: the prefix's last component, as a folder's name."""
    return url.rstrip("/").rsplit("/", 1)[-1]


def _walk_keys(keys: Iterable[str], ignored: list[dict[str, str]]) -> list[str]:
    """The image keys of ``keys`` (relative to the source's prefix) in ``scan_folder``'s order:
    folders sorted by path, files by name within each; what is left out goes to ``ignored``."""
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
    ignored.extend({"path": path, "reason": "hidden folder"} for path in hidden_folders)
    return [key for folder in sorted(by_folder) for key in sorted(by_folder[folder], key=lambda k: k.rsplit("/", 1)[-1])]


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
    ignored: list[dict[str, str]] = []
    for name in sorted(under):
        if name.startswith("."):
            ignored.append({"path": name, "reason": "hidden folder"})
    for name in sorted(top_files):
        if name.startswith("."):
            ignored.append({"path": name, "reason": "hidden file"})
    classes = [name for name in sorted(under) if not name.startswith(".")]
    samples: list[Sample] = []
    if classes:
        for label, name in enumerate(classes):
            samples.extend(map(Sample._make, zip(_walk_keys(under[name], ignored), repeat(label))))
        ignored.extend({"path": name, "reason": "file outside the class folders"}
                       for name in sorted(top_files) if not name.startswith("."))
    else:
        # The whole tree is walked, as scan_folder does: what is hidden at the top is listed again.
        samples = list(map(Sample._make, zip(_walk_keys(keys, ignored), repeat(-1))))
    if not samples:
        raise UsageError(f"{root}: no images found (extensions: {' '.join(IMG_EXTENSIONS)}); "
                         "give the prefix that holds one sub-folder of images per class")
    ignored.sort(key=lambda item: item["path"])
    return ScanResult(root=root, classes=classes, samples=samples, ignored=ignored)


def scan_url(url: str, storage_options: dict[str, Any] | None = None) -> ScanResult:
    """Scan the ImageFolder tree under the prefix ``url`` with one listing (see ``scan_keys``); its
    ``root`` is the prefix's name. One-line errors for a missing bucket or an empty prefix."""
    store = RemoteStore(url, storage_options)
    store.check_bucket()
    listing = store.listing_all()
    if not listing:
        raise UsageError(f"{url}: nothing is stored under this prefix; give the prefix that holds one "
                         "sub-folder of images per class (for example s3://bucket/images/)")
    try:
        return scan_keys(sorted(listing), Path(source_name(url)))
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
