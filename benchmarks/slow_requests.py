"""The requests the pack reader sends to slow storage, counted by slowfs, for several block sizes.

    python benchmarks/slow_requests.py FOLDER [--latency-ms 2] [--mbps 200] [--block-sizes 0,16,64,256]

mounts FOLDER (holding ``*.lmdb`` and ``*.shards`` packs) with ``benchmarks/slowfs.py``, and for
each pack and block size reads every record once, undecoded, in batches of ``--batch-size`` in one
process with a cold cache (remounted before each read). Block size 0 is the sequential order
(``shuffle=False``); one untimed read first takes the one-time start-up costs. Prints records/s, MB/s, the number of read requests, their mean size and the
peak in flight; ``--json`` for the rows.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from benchmarks.slowfs import SlowFS, unavailable  # noqa: E402
from packload import PackedImageFolder  # noqa: E402


def read_pack(fs: SlowFS, pack: Path, block_size: int, batch_size: int) -> dict[str, Any]:
    """Read all of ``pack`` (a path under the mount) once after a remount; the figures."""
    fs.remount()
    before = fs.stats()
    start = time.perf_counter()
    ds = PackedImageFolder(pack, output="bytes")
    sampler = ds.sampler(shuffle=False) if block_size == 0 else ds.sampler(seed=0, block_size=block_size)
    order = list(sampler)
    nbytes = 0
    for i in range(0, len(order), batch_size):
        nbytes += sum(len(image) for image, _ in ds.__getitems__(order[i : i + batch_size]))
    seconds = time.perf_counter() - start
    ds.close()
    d = fs.stats().minus(before)
    return {"pack": pack.name, "block_size": block_size, "records": len(order), "seconds": seconds,
            "records_per_s": len(order) / seconds, "mb_per_s": nbytes / seconds / 1e6,
            "block_kb": nbytes / len(order) * block_size / 1024, "requests": d.reads,
            "mean_request_kb": d.mean_read_kb, "peak_in_flight": d.max_reads_in_flight}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/slow_requests.py", description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="folder holding *.lmdb and *.shards packs")
    p.add_argument("--latency-ms", type=float, default=2.0)
    p.add_argument("--mbps", type=float, default=None)
    p.add_argument("--block-sizes", default="0,16,64,256", help="0 = sequential (shuffle=False)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    packs = sorted([*args.folder.glob("*.lmdb"), *args.folder.glob("*.shards")])
    if not packs:
        print(f"slow_requests: {args.folder}: no *.lmdb or *.shards pack there; give the folder that holds them",
              file=sys.stderr)
        return 2
    if unavailable():
        print(f"slow_requests: cannot mount a slowfs here: {unavailable()}", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="slowfs-mnt-") as tmp, \
            SlowFS(args.folder, Path(tmp) / "mnt", latency_ms=args.latency_ms, mbps=args.mbps) as fs:
        read_pack(fs, Path(tmp) / "mnt" / packs[0].name, 0, args.batch_size)  # untimed: one-time start-up costs
        for pack in packs:
            for block in (int(b) for b in args.block_sizes.split(",")):
                row = read_pack(fs, Path(tmp) / "mnt" / pack.name, block, args.batch_size)
                rows.append(row)
                if not args.json:
                    print(f"{row['pack']:24} block {block or 'seq':>4} ({row['block_kb']:6.0f} KB): "
                          f"{row['records_per_s']:8.0f} records/s {row['mb_per_s']:6.1f} MB/s, "
                          f"{row['requests']} requests of {row['mean_request_kb']:.0f} KB, "
                          f"{row['peak_in_flight']} in flight", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
