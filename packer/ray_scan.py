"""``pack --engine ray``: the source's listing, run in Ray tasks rather than on the driver alone.

On a large source on a network disk, or a prefix of millions of keys, listing every file from one
machine is slow and serial. So the driver lists only the top level (``list_source_top``: the
class folders, and what it leaves out there), then the classes are cut into contiguous groups and
one Ray task per group lists its classes' files (``list_classes``) with the very function the
serial scan calls for each class (``list_class`` for a folder, ``list_class_url`` for a prefix).
The driver merges the listings in class order (``merge_listings``): the result equals
``scan_folder`` / ``scan_url``'s exactly, the same samples, classes and left-out list. A source
with no class folders (unlabelled) is one tree with nothing to split: it is scanned on the driver.
"""

from __future__ import annotations

import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from packload.core.display import plural
from packload.core.errors import PackloadError, UsageError
from packload.core.remote import RemoteStore, is_url
from packload.core.scan import (
    ClassListing,
    ScanResult,
    TopListing,
    list_class,
    list_top,
    merge_listings,
    scan_folder,
)
from packload.packer.ray_tasks import node_id, settle_after_failure
from packload.packer.remote_source import (
    NO_IMAGES_HINT,
    list_class_url,
    list_top_url,
    scan_url,
    url_errors,
)

SCAN_TASKS_PER_CPU = 2  # listing tasks per CPU of the cluster at most: balance without many tiny tasks
LIST_THREADS = 8  # class prefixes listed at once per task: each listing waits on the store, not on a CPU


def list_source_top(src: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> TopListing:
    """The top level of the source folder or prefix ``src`` (its errors, in one line, come from here,
    before any task starts)."""
    if is_url(src):
        url = str(src).rstrip("/")
        return list_top_url(url, storage_options)[0]
    return list_top(Path(src))


def class_groups(count: int, tasks: int) -> list[tuple[int, int]]:
    """``min(count, tasks)`` contiguous ``[start, stop)`` ranges of the ``count`` classes, of sizes
    that differ by one at most (the classes' sizes are not known before they are listed)."""
    groups = max(1, min(count, tasks))
    bounds = [k * count // groups for k in range(groups + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def check_source_seen(root: str) -> None:
    """Refuse at once (no retries) on a node that does not see the source folder: its classes would
    otherwise list as unreadable folders, and the pack would lose them."""
    if not is_url(root) and not Path(root).is_dir():
        raise UsageError(f"{root}: not found on node {socket.gethostname()}; --engine ray needs the source "
                         "on storage every node sees, at the same path")


def list_classes(root: str, names: list[str], storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """One Ray task: the listing of each class ``names`` of the source ``root`` (a folder, or a URL:
    None for a prefix with nothing stored under it), the node it ran on and the time it took."""
    started = time.perf_counter()
    check_source_seen(root)
    listings: list[ClassListing | None]
    if is_url(root):
        store = RemoteStore(root, storage_options)  # one connection for the task's listings
        with ThreadPoolExecutor(min(LIST_THREADS, len(names)), thread_name_prefix="packload-list") as pool:
            listings = list(pool.map(lambda name: list_class_url(store, name), names))
    else:
        listings = [list_class(root, name) for name in names]
    return {"listings": listings, "node": node_id(), "seconds": time.perf_counter() - started}


def scan_in_tasks(ray: Any, src: str | os.PathLike[str], top: TopListing, root: str, max_retries: int = 3,
                  storage_options: dict[str, Any] | None = None) -> tuple[ScanResult, dict[str, Any]]:
    """The scan of the source ``src`` (``root``: its folder's absolute path, or its URL) whose top
    level is ``top``, its classes listed in Ray tasks; with where it ran: ``scan_tasks`` (0: on the
    driver), ``scan_tasks_per_node`` and ``scan_s``."""
    started = time.perf_counter()
    if not top.classes:
        scan = scan_url(root, storage_options) if is_url(root) else scan_folder(Path(src))
        return scan, _where(started, [])
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    lister = ray.remote(num_cpus=1, max_retries=max_retries, retry_exceptions=[OSError],
                        scheduling_strategy="SPREAD")(list_classes)
    groups = class_groups(len(top.classes), SCAN_TASKS_PER_CPU * cpus)
    refs = [lister.remote(root, top.classes[a:b], storage_options) for a, b in groups]
    try:
        results = ray.get(refs)
    except Exception as exc:  # noqa: BLE001 - Ray wraps the task's error; reported in one line
        settle_after_failure(ray, refs, stop=False)  # listings are short: they end on their own
        raise _failure(exc, root, max_retries) from None
    listings = [listing for result in results for listing in result["listings"]]
    if is_url(root):
        # A prefix that holds nothing but a folder marker is no class (the serial scan never sees it).
        kept = [(name, listing) for name, listing in zip(top.classes, listings, strict=True) if listing is not None]
        if not kept:
            return scan_url(root, storage_options), _where(started, results)
        top = top._replace(classes=[name for name, _ in kept])
        with url_errors(root):
            return merge_listings(top, [listing for _, listing in kept], NO_IMAGES_HINT), _where(started, results)
    return merge_listings(top, listings), _where(started, results)


def _where(started: float, results: list[dict[str, Any]]) -> dict[str, Any]:
    nodes: dict[str, int] = {}
    for result in results:
        nodes[result["node"] or "unknown"] = nodes.get(result["node"] or "unknown", 0) + 1
    return {"scan_tasks": len(results), "scan_tasks_per_node": dict(sorted(nodes.items())),
            "scan_s": round(time.perf_counter() - started, 3)}


def _failure(exc: BaseException, root: str, retries: int) -> PackloadError:
    """The one-line error for a listing task that kept failing."""
    cause = getattr(exc, "cause", None) or exc
    if isinstance(cause, PackloadError) and not isinstance(cause, OSError):
        return type(cause)(str(cause))
    text = str(cause).strip().splitlines()[-1] if str(cause).strip() else type(cause).__name__
    return PackloadError(f"{root}: a Ray task listing the source's classes failed after {plural(retries, 'retry')} "
                         f"({type(cause).__name__}: {text}); nothing was packed; fix the cause and pack again")
