"""Fields from a table at a million records: reading one numeric field of every record, and the
memory packing takes per file.

    python benchmarks/bench_fields.py [--data DIR] [--files 1000000] [--repeats 5] [--backends shards,lmdb]
                                      [--json FILE]

The data (made once per ``--files``, reused): ``--files`` tiny PNGs (4x4, the same 75 bytes each) in
one flat folder, and ``labels.csv`` beside it, five columns besides the path: ``label`` (ten class
names), ``age`` (int), ``score`` (float), ``ok`` (bool) and ``caption`` (about 20 characters of
text).

* **pack memory**: ``packload pack DIR DEST --labels labels.csv --quiet`` (and, for comparison, the
  same without the table) run in a child process, its peak resident memory read from the kernel
  (``VmHWM`` in ``/proc/self/status``, by the child once it has packed); reported whole and per file. One run each: a pack of a million files
  takes half a minute.
* **read one field**: ``PackedImageFolder(pack).field("score").sum()`` (the pack opened, its fields
  part mapped and decoded, the column summed so that every value is read), against the same column
  read from ``labels.csv`` with the csv module (what reading it costs without the pack). After one
  warm-up each (page cache warm), ``--repeats`` rounds, the two interleaved; the medians and their
  ratio, and the time of ``field("score")`` alone on an open dataset.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from packload import PackedImageFolder  # noqa: E402


def make_data(data: Path, files: int) -> tuple[Path, Path]:
    """``data/files-N/images`` (flat) and ``labels.csv``; made once, reused."""
    root = data / f"files-{files}"
    images, table = root / "images", root / "labels.csv"
    if table.exists() and images.exists():
        return images, table
    images.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), (10, 20, 30)).save(buffer, "PNG")
    png = buffer.getvalue()
    for i in range(files):
        with open(images / f"{i:07d}.png", "wb") as f:
            f.write(png)
    with open(str(table) + ".tmp", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "label", "age", "score", "ok", "caption"])
        for i in range(files):
            writer.writerow([f"{i:07d}.png", f"c{i % 10}", i % 90, f"{(i % 1000) / 7:.4f}", "true" if i % 3 else "false",
                             f"a photo number {i}"])
    os.replace(str(table) + ".tmp", table)
    return images, table


# The child packs, then reads its own high-water mark: VmHWM is the process's since its exec, whereas
# ru_maxrss would carry the forking parent's resident memory over (Linux keeps it across exec).
PACK_CHILD = """
import sys
from packload.cli import main
code = main(["pack", *sys.argv[1:]])
with open("/proc/self/status") as status:
    print(next(line for line in status if line.startswith("VmHWM:")).split()[1])
sys.exit(code)
"""


def pack_peak(args: list[str]) -> tuple[float, int]:
    """(seconds, peak resident bytes) of ``packload pack ARGS`` run in a child process."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PACK_CHILD, *args, "--quiet", "--overwrite"], capture_output=True,
                          text=True)
    if done.returncode:
        raise SystemExit(f"pack {' '.join(args)} failed: {done.stderr.strip()}")
    return time.perf_counter() - started, int(done.stdout.split()[-1]) * 1024  # kB in /proc: KiB


def read_pack(path: Path) -> float:
    ds = PackedImageFolder(path)
    return float(ds.field("score").sum())


def read_csv(table: Path) -> float:
    with open(table, newline="") as f:
        reader = csv.reader(f)
        at = next(reader).index("score")
        return float(np.fromiter((float(row[at]) for row in reader), np.float64).sum())


def column_sum(ds: PackedImageFolder) -> float:
    return float(ds.field("score").sum())


def timed(fn: Any, *args: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    value = fn(*args)
    return time.perf_counter() - started, value


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("bench-data/fields"))
    parser.add_argument("--files", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backends", default="shards,lmdb")
    parser.add_argument("--json", type=Path, help="write the results here too")
    opts = parser.parse_args(argv)
    images, table = make_data(opts.data, opts.files)
    results: dict[str, Any] = {"files": opts.files, "pack": {}, "read": {}}
    for backend in opts.backends.split(","):
        suffix = ".shards" if backend == "shards" else ".lmdb"
        dest = opts.data / f"files-{opts.files}" / f"table{suffix}"
        seconds, peak = pack_peak([str(images), str(dest), "--labels", str(table)])
        plain_s, plain = pack_peak([str(images), str(opts.data / f"files-{opts.files}" / f"plain{suffix}")])
        results["pack"][backend] = {"seconds": round(seconds, 1), "peak_mb": round(peak / 1e6, 1),
                                    "bytes_per_file": round(peak / opts.files, 1),
                                    "without_table_seconds": round(plain_s, 1),
                                    "without_table_peak_mb": round(plain / 1e6, 1),
                                    "without_table_bytes_per_file": round(plain / opts.files, 1)}
        print(f"pack {backend}: {seconds:.1f} s, peak {peak / 1e6:.1f} MB = {peak / opts.files:.0f} B/file "
              f"(without the table: {plain_s:.1f} s, {plain / 1e6:.1f} MB = {plain / opts.files:.0f} B/file)",
              flush=True)
        want = read_csv(table)
        assert abs(read_pack(dest) - want) < 1e-6 * abs(want)  # warm-up, and the same column
        pack_times, csv_times = [], []
        for _ in range(opts.repeats):
            pack_times.append(timed(read_pack, dest)[0])
            csv_times.append(timed(read_csv, table)[0])
        ds = PackedImageFolder(dest)
        ds.field("score")
        alone = statistics.median(timed(column_sum, ds)[0] for _ in range(opts.repeats))
        results["read"][backend] = {"open_and_read_s": round(statistics.median(pack_times), 4),
                                    "csv_s": round(statistics.median(csv_times), 4),
                                    "ratio_csv_over_pack": round(statistics.median(csv_times)
                                                                 / statistics.median(pack_times), 1),
                                    "field_alone_s": round(alone, 5)}
        print(f"read score of {opts.files:,} records, {backend}: open + field {statistics.median(pack_times) * 1e3:.1f} "
              f"ms, field on an open dataset {alone * 1e3:.2f} ms; csv module {statistics.median(csv_times):.2f} s "
              f"({results['read'][backend]['ratio_csv_over_pack']}x)", flush=True)
    if opts.json:
        opts.json.write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
