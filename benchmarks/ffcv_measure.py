"""Measure FFCV on the benchmark datasets: write times, file sizes and read rates (issue #10's table).

Run with the peer venv's python (FFCV installed there; see BENCHMARKS.md)::

    .venv-peers/bin/python benchmarks/ffcv_measure.py --data bench-data --out bench-results/ffcv

Cases (batch 64, 2 workers, warm page cache: each file is read right after it is written):

* ``cifar``: the 50,000 32x32 PNGs written in ``raw`` mode, read sequential and random, no crop.
* ``imagenet``: the 20,000 JPEGs written in ``jpg`` mode (max_resolution 256, quality 90) and in
  ``raw`` mode (max_resolution 256), each read sequentially through ``CenterCropRGBImageDecoder``
  to 224x224.

Each write is repeated ``--write-repeats`` times (median); each read runs in a fresh forked process
(so every read pays numba's JIT in its first epoch, reported apart) for 1 warm-up + ``--epochs``
epochs (median images/s). The ``.beton`` files go to ``--work`` (default ``bench-results/ffcv-work``,
deleted afterwards unless ``--keep``), never into the data folder. Prints the results as JSON and
writes ``ffcv.json`` and ``ffcv.md`` to ``--out``. It takes a few minutes; on a shared machine
serialise it with other benchmarks (for example under ``flock``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import ffcv_peer  # noqa: E402

# (dataset, write settings, reads) per case; read settings are ffcv_peer.read's keywords.
CASES: list[dict[str, Any]] = [
    {"name": "cifar raw", "data": "cifar", "write": {"mode": "raw"},
     "reads": [{"order": "sequential", "crop": None}, {"order": "random", "crop": None}]},
    {"name": "imagenet jpg 256 q90", "data": "imagenet",
     "write": {"mode": "jpg", "max_resolution": 256, "quality": 90},
     "reads": [{"order": "sequential", "crop": 224}]},
    {"name": "imagenet raw 256", "data": "imagenet", "write": {"mode": "raw", "max_resolution": 256},
     "reads": [{"order": "sequential", "crop": 224}]},
]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks/ffcv_measure.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=ROOT / "bench-data", help="folder holding cifar/ and imagenet/")
    p.add_argument("--work", type=Path, default=ROOT / "bench-results" / "ffcv-work",
                   help="scratch folder for the .beton files")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "ffcv", help="results folder")
    p.add_argument("--only", default="cifar,imagenet", help="comma-separated datasets to run")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2, help="FFCV loader threads")
    p.add_argument("--write-workers", type=int, default=None, help="DatasetWriter processes (default: CPUs)")
    p.add_argument("--write-repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=0,
                   help="measured epochs after the warm-up (default: 20 for cifar, 5 for imagenet)")
    p.add_argument("--keep", action="store_true", help="keep the .beton files in --work")
    return p


def _child(conn: Any, fn: Callable[..., dict[str, Any]], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Body of the process ``_in_child`` starts: send back ``fn``'s result or its error."""
    try:
        conn.send(("ok", fn(*args, **kwargs)))
    except BaseException as exc:  # report everything to the parent, then exit
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def _in_child(fn: Callable[..., dict[str, Any]], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Run ``fn`` in a fresh forked, non-daemonic process (fresh numba state; may fork its own workers)."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, fn, args, kwargs))
    proc.start()
    child.close()
    try:
        status, value = parent.recv()
    except EOFError:
        status, value = "error", "child process died without a result"
    proc.join()
    if status != "ok":
        raise RuntimeError(f"{getattr(fn, '__name__', fn)}: {value} (exit code {proc.exitcode})")
    return value


def _pixel_check(source: Path, beton: Path, count: int = 8) -> dict[str, Any]:
    """For a ``raw`` write without resizing: FFCV's first records equal PIL's decode of the files."""
    import numpy as np
    from PIL import Image

    items = ffcv_peer.samples(source)[:count]
    images, labels = ffcv_peer.pixels(beton, list(range(len(items))))
    same = all(
        np.array_equal(np.asarray(Image.open(p).convert("RGB")), img) and int(label) == lab
        for (p, lab), img, label in zip(items, images, labels, strict=True)
    )
    return {"records": len(items), "pixels_and_labels_equal": bool(same)}


def _source_bytes(folder: Path) -> int:
    return sum(os.path.getsize(p) for p, _ in ffcv_peer.samples(folder))


def _versions() -> dict[str, str | None]:
    import cv2
    import numba
    import numpy
    import torch

    return {"python": platform.python_version(), "ffcv": ffcv_peer.version(), "numba": numba.__version__,
            "numpy": numpy.__version__, "opencv-python": cv2.__version__, "torch": torch.__version__}


def run_case(case: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Write one case ``--write-repeats`` times, then read the last file with each read setting."""
    source = args.data / case["data"]
    beton = args.work / f"{case['name'].replace(' ', '-')}.beton"
    writes = []
    for _ in range(args.write_repeats):
        beton.unlink(missing_ok=True)
        writes.append(_in_child(ffcv_peer.write, source, beton, workers=args.write_workers, **case["write"]))
        print(f"  write {case['name']}: {writes[-1]['seconds']:.2f} s", file=sys.stderr, flush=True)
    src_bytes = _source_bytes(source)
    result: dict[str, Any] = {
        "name": case["name"], "data": case["data"], "write_settings": case["write"],
        "source_bytes": src_bytes, "samples": writes[-1]["samples"],
        "write_s": statistics.median(w["seconds"] for w in writes),
        "write_s_fsync": statistics.median(w["seconds_fsync"] for w in writes),
        "beton_bytes": writes[-1]["bytes"], "size_vs_source": writes[-1]["bytes"] / src_bytes,
        "writes": writes, "reads": [],
    }
    if case["write"]["mode"] == "raw" and case["write"].get("max_resolution") is None:
        result["pixel_check"] = _in_child(_pixel_check, source, beton)
    epochs = args.epochs or (20 if case["data"] == "cifar" else 5)
    for settings in case["reads"]:
        r = _in_child(ffcv_peer.read, beton, batch_size=args.batch_size, workers=args.workers,
                      epochs=epochs, **settings)
        print(f"  read {case['name']} {settings}: {r['images_per_s']:,.0f} img/s", file=sys.stderr, flush=True)
        result["reads"].append(r)
    if not args.keep:
        beton.unlink(missing_ok=True)
    return result


def markdown(results: dict[str, Any]) -> str:
    """The results as the table of issue #10 plus the read details."""
    lines = ["| data | FFCV mode | write s (median) | .beton MB (× source) | read | images/s median "
             "[min–max] | first epoch s (JIT) |", "|---|---|--:|--:|---|--:|--:|"]
    for c in results["cases"]:
        for r in c["reads"]:
            rates = r["epoch_images_per_s"]
            what = f"{r['order']}, " + ("no crop" if r["crop"] is None else f"center crop {r['crop']}")
            lines.append(
                f"| {c['data']} ({c['samples']:,}) | {c['name'].split(' ', 1)[1]} | {c['write_s']:.1f} | "
                f"{c['beton_bytes'] / 1e6:,.0f} ({c['size_vs_source']:.2f}×) | {what} | "
                f"{r['images_per_s']:,.0f} [{min(rates):,.0f}–{max(rates):,.0f}] | {r['first_epoch_s']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    reason = ffcv_peer.unavailable()
    if reason:
        print(f"FFCV: {reason}", file=sys.stderr)
        return 2
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    started = _dt.datetime.now(_dt.UTC)
    results: dict[str, Any] = {
        "started": started.strftime("%Y-%m-%d %H:%M:%S UTC"),
        "command": " ".join(["benchmarks/ffcv_measure.py", *(argv if argv is not None else sys.argv[1:])]),
        "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(), "versions": _versions(),
        "batch_size": args.batch_size, "workers": args.workers, "cases": [],
    }
    for case in CASES:
        if case["data"] in only:
            print(f"{case['name']} ...", file=sys.stderr, flush=True)
            results["cases"].append(run_case(case, args))
    results["loadavg_end"] = os.getloadavg()
    results["minutes"] = (_dt.datetime.now(_dt.UTC) - started).total_seconds() / 60
    if not args.keep and args.work.exists() and not any(args.work.iterdir()):
        shutil.rmtree(args.work)
    (args.out / "ffcv.json").write_text(json.dumps(results, indent=2))
    (args.out / "ffcv.md").write_text(markdown(results))
    print(json.dumps(results, indent=2))
    print(markdown(results), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
