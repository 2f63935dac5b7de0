"""The batch decoder (``packload/core/_jpeg_boxes.c``) on hostile JPEGs, built with AddressSanitizer and
UBSan and run in a child process with libasan preloaded: headers whose size disagrees with the index,
huge declared sizes, truncated and damaged entropy-coded data, thousands of scans, boxes outside the
image. None crashes, hangs or draws a sanitizer report; each that libjpeg-turbo can tell is wrong is
left to the general route, and the good records of the same batch come out as they do alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz_packs.server import JPEG_BOXES_ASAN, build_sanitized_kernel, sanitizer_runtime
from tests.reliability.packs import REPO, child_env

CHILD = r"""
import json, sys
import numpy as np
from tests.fuzz_packs.server import _use_kernel

_use_kernel(sys.argv[1])
from packload.core import jpeg_kernel, resize_kernel
from tests.jpeg_scan_factory import many_scan_jpeg
from tests.reliability.crafted import jpeg_bomb, jpeg_bytes

assert jpeg_kernel._extension_lib()._name.endswith("_jpeg_boxes_asan.so"), jpeg_kernel._extension_lib()._name
assert jpeg_kernel.available(), jpeg_kernel.unavailable_reason()
good = jpeg_bytes((96, 72), 1)  # 96 wide, 72 high
rng = np.random.default_rng(0)
cases = []  # (name, payload, index height, index width, scale, box)
for h, w in ((72, 96), (36, 48), (144, 192), (72, 97), (71, 96), (1, 1), (60000, 60000)):
    cases.append((f"index {w}x{h}", good, h, w, 8, (0, 0, min(h, 16), min(w, 16))))
cases.append(("declares 60000x60000", jpeg_bomb(), 60000, 60000, 1, (100, 100, 16, 16)))
cases.append(("declares 60000x60000, whole width", jpeg_bomb(), 60000, 60000, 1, (0, 0, 8, 7500)))
for cut in (3, 10, 150, len(good) // 3, len(good) - 3):
    cases.append((f"cut at {cut}", good[:cut], 72, 96, 8, (0, 0, 72, 96)))
for k in range(40):
    damaged = bytearray(good)
    start = damaged.index(b"\xff\xda") + 14
    for at in rng.integers(start, len(good) - 2, size=int(rng.integers(1, 12))):
        damaged[int(at)] = int(rng.integers(0, 256))
    cases.append((f"damaged {k}", bytes(damaged), 72, 96, int(rng.integers(1, 9)), (0, 0, 9, 12)))
for k in range(20):  # header fields overwritten: sizes, sampling factors, component counts
    damaged = bytearray(good)
    sof = damaged.index(b"\xff\xc0")
    for at in rng.integers(sof + 4, sof + 19, size=2):
        damaged[int(at)] = int(rng.integers(0, 256))
    cases.append((f"frame header {k}", bytes(damaged), 72, 96, 8, (3, 5, 30, 40)))
cases.append(("3000 scans", many_scan_jpeg(3000), 64, 64, 8, (0, 0, 64, 64)))
for box in ((60, 0, 13, 96), (0, 90, 72, 7), (-1, 0, 5, 5), (0, 0, 0, 5), (0, 0, 72, 0), (72, 96, 1, 1)):
    cases.append((f"box {box}", good, 72, 96, 8, box))
for scale in (0, 9, -3):
    cases.append((f"scale {scale}", good, 72, 96, scale, (0, 0, 8, 8)))
results = {name: jpeg_kernel.decode_region(data, h, w, scale, box) is not None for name, data, h, w, scale, box in cases}

# one batch: the good record (twice), then every case that must be refused; the good slots as alone,
# the others untouched (damaged data libjpeg-turbo does not notice decodes to whatever it decodes to)
size = 32
cases = [c for c in cases if not c[0].startswith(("damaged", "frame header", "index 96x72"))]
payloads = [good, *[c[1] for c in cases], good]
geometry = [[72, 96, 8, 72, 96, 4, 6, 48, 60]]  # a box the kernel resizes (at most 2x the slot)
for _, _, h, w, scale, box in cases:
    got = (-(-h * scale // 8), -(-w * scale // 8)) if 1 <= scale <= 8 else (h, w)
    geometry.append([h, w, scale, *got, *box])
geometry.append(geometry[0])
arrays = [np.frombuffer(p, np.uint8) for p in payloads]
batch = np.full((len(payloads), size, size, 3), 7, np.uint8)
boxes = np.array(geometry, np.int64)[:, 7:9]
usable = resize_kernel.regions_applicable(boxes[:, 0], boxes[:, 1], size, size)
rows = np.flatnonzero(usable)
done = jpeg_kernel.decode_boxes(np.array([arrays[k].ctypes.data for k in rows], np.uint64),
                                np.array([arrays[k].nbytes for k in rows], np.uint64),
                                np.array([geometry[k] for k in rows], np.int32), np.zeros(len(rows), bool),
                                np.array([batch[k].ctypes.data for k in rows], np.uint64), batch.strides[1], size,
                                False)
print(json.dumps({"alone": results, "batch_done": [int(rows[k]) for k in np.flatnonzero(done)],
                  "rows": len(payloads), "same": bool(np.array_equal(batch[0], batch[-1])),
                  "untouched": bool((batch[1:-1] == 7).all())}))
"""


def test_hostile_jpegs_under_sanitizers(tmp_path: Path) -> None:
    library, why = build_sanitized_kernel(tmp_path / "asan")
    if library is None:
        pytest.skip(f"cannot build the batch decoder with sanitizers here: {why}")
    runtime, _ = sanitizer_runtime()
    assert (library.parent / JPEG_BOXES_ASAN).exists()
    env = child_env()
    env.update(LD_PRELOAD=str(runtime), ASAN_OPTIONS="detect_leaks=0:abort_on_error=1",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    done = subprocess.run([sys.executable, "-c", CHILD, str(library)], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=600)
    report = done.stderr[-3000:]
    assert done.returncode == 0, report
    assert "AddressSanitizer" not in done.stderr and "runtime error" not in done.stderr, report
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    taken = [name for name, ok in answer["alone"].items() if ok and not name.startswith(("damaged", "frame header"))]
    assert taken == ["index 96x72"], taken  # only the JPEG as the index says it is
    assert answer["batch_done"] == [0, answer["rows"] - 1], answer["batch_done"]
    assert answer["same"] and answer["untouched"]

