"""What hostile inputs cost packload now: the figures of RELIABILITY.md's "Bounded time and memory".

Makes, in a temporary folder: a progressive JPEG of ``--side`` pixels square with ``--scans`` legal
scans (a small refinement scan repeated; the image flat but for a sparse grid, so each repeat is a
few hundred bytes), a small pack, and sparse copies of it (an ``index.bin`` of 6 GiB and 1 TiB whose
header and manifest agree, a 1 TiB shard with the manifest in step). It prints how long each route
takes to refuse each input and the peak of Python's allocations meanwhile, and what the scan check
costs on ordinary JPEGs beside their decoding. Sparse files take no disk space.

    python benchmarks/hostile_costs.py              # the figures in RELIABILITY.md
    python benchmarks/hostile_costs.py --quick      # small sizes, for a test
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packload import PackReader, pack  # noqa: E402
from packload.core.format import INDEX_ENTRY, INDEX_HEADER  # noqa: E402
from packload.core.jpeg_scans import count_scans, too_many_scans  # noqa: E402
from packload.core.scan import Sample  # noqa: E402
from packload.loaders.decode import decode_array  # noqa: E402
from packload.loaders.verify import info, verify  # noqa: E402
from packload.packer.encode import EncodeOptions, encode_data  # noqa: E402

_ECS_END = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


def _segments(data: bytes) -> list[tuple[int, int, int]]:
    """(marker, start, end) of each segment of a well-formed JPEG; a scan ends with its data."""
    pos, out = 2, []
    while pos + 1 < len(data):
        marker = data[pos + 1]
        if marker == 0xD9:
            break
        end = pos + 2 + ((data[pos + 2] << 8) | data[pos + 3])
        if marker == 0xDA:
            end = _ECS_END.search(data, end).start()
        out.append((marker, pos, end))
        pos = end
    return out


def many_scans(side: int, scans: int) -> bytes:
    """A ``side`` x ``side`` progressive JPEG of ``scans`` scans: its smallest scan repeated."""
    rng = np.random.default_rng(0)
    pixels = np.full((side, side, 3), 128, np.uint8)
    pixels[::64, ::64] = rng.integers(0, 255, pixels[::64, ::64].shape, dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", progressive=True, quality=90)
    data = out.getvalue()
    segments = _segments(data)
    sos = [k for k, (marker, _, _) in enumerate(segments) if marker == 0xDA]
    small = min(sos, key=lambda k: segments[k][2] - segments[k][1])
    first = small - 1 if segments[small - 1][0] == 0xC4 else small  # with its Huffman table
    tail = segments[sos[-1]][2]
    return data[:tail] + data[segments[first][1]:segments[small][2]] * (scans - len(sos)) + data[tail:]


def _photo_like(height: int, width: int) -> np.ndarray:
    """Gradients and noise: a JPEG of it is about the size of a photo's (about 100 KB at 500x375)."""
    rng = np.random.default_rng(1)
    ys, xs = np.mgrid[0:height, 0:width]
    base = np.stack([xs * 255 / width, ys * 255 / height, (xs + ys) * 127 / (width + height)], axis=2)
    return np.clip(base + rng.normal(0, 12, (height, width, 3)), 0, 255).astype(np.uint8)


def best(run: Callable[[], Any], rounds: int) -> float:
    """The shortest of ``rounds`` runs, in seconds."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def refused(run: Callable[[], Any]) -> dict[str, Any]:
    """Seconds and peak Python allocation of ``run``, and the one line it refused with."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        run()
        outcome = "accepted"
    except Exception as exc:  # noqa: BLE001 - what each route says is the figure
        outcome = f"{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"seconds": seconds, "peak_bytes": peak, "outcome": outcome}


def scan_figures(side: int, scans: int, rounds: int, baseline_scans: int) -> dict[str, Any]:
    data = many_scans(side, scans)
    out: dict[str, Any] = {"file_bytes": len(data), "side": side, "scans": count_scans(data, 10**9),
                           "count_scans_s": best(lambda: count_scans(data), rounds)}
    for name, options in (("pack_keep_fast", EncodeOptions()), ("pack_keep_full", EncodeOptions(check="full")),
                          ("pack_reencode", EncodeOptions(encoding="jpeg", max_side=512))):
        got = encode_data(Sample("a/x.jpg", 0), data, options)
        out[name] = {"s": best(lambda o=options: encode_data(Sample("a/x.jpg", 0), data, o), rounds),
                     "reason": getattr(got, "reason", "packed")}

    def read() -> None:
        try:
            decode_array(data, "JPEG", "RGB", side, side)
        except ValueError:
            pass

    out["read_s"] = best(read, rounds)
    few = many_scans(side, baseline_scans)
    out["pil_decode"] = {"scans": baseline_scans,
                         "s": best(lambda: Image.open(io.BytesIO(few)).convert("RGB"), 1)}
    for progressive in (False, True):
        image = io.BytesIO()
        Image.fromarray(_photo_like(375, 500)).save(image, "JPEG", quality=95, progressive=progressive)
        jpeg = image.getvalue()
        out["progressive" if progressive else "baseline"] = {
            "bytes": len(jpeg), "check_s": best(lambda j=jpeg: too_many_scans(j), 200),
            "decode_s": best(lambda j=jpeg: decode_array(j, "JPEG", "RGB", 500, 375), 20)}
    return out


def size_figures(work: Path, sizes: list[int]) -> dict[str, Any]:
    source = work / "src"
    for label in ("a", "b"):
        (source / label).mkdir(parents=True)
        for k in range(6):
            Image.new("RGB", (40 + k, 30), (k * 40, 90, 200)).save(source / label / f"{k}.png")
    base = work / "base.shards"
    pack(source, base, workers=1, progress=False)
    out: dict[str, Any] = {}
    for size in sizes:
        copy = work / f"index-{size}.shards"
        shutil.copytree(base, copy)
        raw = bytearray((copy / "index.bin").read_bytes())
        head = np.frombuffer(bytes(raw[: INDEX_HEADER.itemsize]), INDEX_HEADER).copy()
        head[0]["paths_len"] = size - INDEX_HEADER.itemsize - int(head[0]["count"]) * INDEX_ENTRY.itemsize
        raw[: INDEX_HEADER.itemsize] = head.tobytes()
        with open(copy / "index.bin", "r+b") as f:
            f.write(raw)
            f.truncate(size)
        manifest = json.loads((copy / "manifest.json").read_text())
        manifest["index"]["size"] = size
        (copy / "manifest.json").write_text(json.dumps(manifest))
        out[f"sparse_index_{size}"] = refused(lambda c=copy: PackReader(c).close())
        shutil.rmtree(copy)
    copy = work / "shard.shards"
    shutil.copytree(base, copy)
    shard = copy / "shard-00000.bin"
    os.truncate(shard, sizes[-1])
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["parts"][0]["size"] = sizes[-1]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    for name, run in (("open", lambda: PackReader(copy).close()), ("info", lambda: info(copy)),
                      ("verify", lambda: verify(copy, progress=False))):
        out[f"sparse_shard_{name}"] = refused(run)
    shutil.rmtree(copy)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a test)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    side, scans, rounds, few = (256, 2000, 2, 50) if args.quick else (4096, 20_000, 5, 300)
    sizes = [64 << 20, 1 << 30] if args.quick else [6 << 30, 1 << 40]
    with tempfile.TemporaryDirectory(prefix="packload-hostile-") as folder:
        figures = {"scans": scan_figures(side, scans, rounds, few), "sizes": size_figures(Path(folder), sizes)}
    print(json.dumps(figures, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return figures


if __name__ == "__main__":
    main()
