"""The source's listing on the driver alone against the listing in Ray tasks (``packer.ray_scan``).

    python benchmarks/bench_ray_scan.py [--classes 64] [--per-class 300] [--repeats 5] [--cpus 2]
                                        [--delay-ms 20] [--out ray-scan.json]

A tree of CLASSES class folders of PER_CLASS small files each (the scan reads no bytes), listed
(a) in a local folder, warm in the page cache: ``scan_folder`` against ``scan_in_tasks``, and (b)
under a prefix of moto's S3 server behind the proxy of ``tests/object_store.py``, which holds each
request DELAY_MS (a store's round trip): ``scan_url`` against ``scan_in_tasks``. Ray runs locally
with CPUS CPUs, started once beforehand as a cluster would be; the two ways run interleaved,
after one warm-up each, and every listing is checked equal to the serial one. Prints a JSON
report (also written to --out): seconds per listing, medians [min, max], and the ratio
serial / in tasks (above 1: the tasks are faster).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from packload.core.scan import ScanResult, scan_folder  # noqa: E402
from packload.packer.ray_scan import list_source_top, scan_in_tasks  # noqa: E402
from packload.packer.remote_source import scan_url  # noqa: E402

BUCKET = "bench-scan"


def make_tree(root: Path, classes: int, per_class: int) -> None:
    """CLASSES class folders of PER_CLASS files of a byte each, one in ten in a sub-folder."""
    for c in range(classes):
        for i in range(per_class):
            path = root / f"c{c:04d}" / ("sub" if i % 10 == 0 else "") / f"{i:05d}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x")


def _timed(fn: Callable[[], ScanResult]) -> tuple[float, ScanResult]:
    start = time.perf_counter()
    scan = fn()
    return time.perf_counter() - start, scan


def compare(serial: Callable[[], ScanResult], in_tasks: Callable[[], ScanResult], repeats: int) -> dict[str, Any]:
    """Seconds of each way, interleaved after one warm-up each; the listings checked equal."""
    times: dict[str, list[float]] = {"serial": [], "tasks": []}
    expected = serial()
    if in_tasks() != expected:
        raise AssertionError("the listing in tasks differs from the serial scan")
    for _ in range(repeats):
        for name, fn in (("serial", serial), ("tasks", in_tasks)):
            seconds, scan = _timed(fn)
            if scan != expected:
                raise AssertionError(f"{name}: the listing changed between runs")
            times[name].append(seconds)
    report: dict[str, Any] = {name: {"median": statistics.median(v), "min": min(v), "max": max(v)}
                              for name, v in times.items()}
    report["serial_over_tasks"] = report["serial"]["median"] / report["tasks"]["median"]
    report["files"] = len(expected.samples)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", type=int, default=64)
    parser.add_argument("--per-class", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    import ray  # noqa: PLC0415 - the ray extra

    from tests.object_store import FAKE_CREDENTIALS, ObjectStore  # noqa: PLC0415

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server logs every request otherwise
    report: dict[str, Any] = {"classes": args.classes, "per_class": args.per_class, "cpus": args.cpus,
                              "delay_ms": args.delay_ms}
    with tempfile.TemporaryDirectory() as tmp, ObjectStore(delay_s=args.delay_ms / 1000, in_memory=True) as store:
        src = Path(tmp) / "images"
        make_tree(src, args.classes, args.per_class)
        store.make_bucket(BUCKET)
        fs = store.filesystem()
        fs.put(str(src), f"{BUCKET}/images", recursive=True)
        os.environ.update(FAKE_CREDENTIALS)  # the Ray workers inherit them
        ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
        try:
            root = str(src.resolve())
            report["folder"] = compare(lambda: scan_folder(src),
                                       lambda: scan_in_tasks(ray, src, list_source_top(src), root)[0],
                                       args.repeats)
            url = f"s3://{BUCKET}/images"
            options = store.options
            report["url"] = compare(lambda: scan_url(url, options),
                                    lambda: scan_in_tasks(ray, url, list_source_top(url, options), url,
                                                          storage_options=options)[0],
                                    args.repeats)
        finally:
            ray.shutdown()
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
