"""Checks of the tuner's GPU side, for a machine with an NVIDIA GPU; prints one JSON document.

1. Calibration: for a few ``step_ms`` values, the dummy step's own calibration (CUDA events) and an
   independent wall-clock measurement of steps fed real batches through ``DummyStep.__call__``,
   both within 10% of the request; the step must return before the GPU is done (asynchronous).
2. pin_memory: copying a uint8 batch (256×3×224×224 by default) to the GPU with
   ``non_blocking=True`` from pageable and from pinned memory: how long the CPU is blocked, the
   copy's bandwidth, and whether the copy overlaps a GPU step already queued.
3. The small CNN's step time, and the tuner on a pack (or image folder) given on the command line.

    python benchmarks/gpu_check.py ./data.lmdb --batch-size 256 --step-ms 120 --budget 60

Without CUDA it says so and exits 0. With CUDA it exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packload.diagnose.gpu_step import DummyStep  # noqa: E402
from packload.diagnose.measure import machine_info  # noqa: E402
from packload.diagnose.tune import format_report  # noqa: E402
from packload.diagnose.tune_inputs import tune_path  # noqa: E402

TOLERANCE = 0.10


def check_calibration(step_values: list[float], steps: int = 10) -> list[dict[str, Any]]:
    """Requested vs measured ms per step, by CUDA events (calibration) and by the wall clock."""
    batch = (torch.randint(0, 256, (64, 3, 224, 224), dtype=torch.uint8).pin_memory(),
             torch.zeros(64, dtype=torch.int64).pin_memory())
    rows = []
    for ms in step_values:
        step = DummyStep(step_ms=ms)
        step(batch)
        step.synchronize()
        call_start = time.perf_counter()
        step(batch)
        call_ms = (time.perf_counter() - call_start) * 1000
        step.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            step(batch)
        step.synchronize()
        wall_ms = (time.perf_counter() - start) * 1000 / steps
        error = (wall_ms - ms) / ms
        rows.append({"requested_ms": ms, "calibration": step.calibration, "wall_ms_per_step": round(wall_ms, 3),
                     "wall_error_pct": round(error * 100, 2), "call_returns_after_ms": round(call_ms, 3),
                     "asynchronous": call_ms < 0.5 * ms,
                     "ok": bool(step.calibration["ok"]) and abs(error) <= TOLERANCE and call_ms < 0.5 * ms})
    return rows


def _copy_times(source: torch.Tensor, repeats: int) -> dict[str, float]:
    blocked, total = [], []
    for _ in range(repeats + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        source.to("cuda", non_blocking=True)
        returned = time.perf_counter()
        torch.cuda.synchronize()
        blocked.append(returned - start)
        total.append(time.perf_counter() - start)
    blocked, total = sorted(blocked[1:]), sorted(total[1:])
    median_total = total[len(total) // 2]
    return {"cpu_blocked_ms": round(blocked[len(blocked) // 2] * 1000, 3), "copy_ms": round(median_total * 1000, 3),
            "gb_per_s": round(source.nbytes / median_total / 1e9, 2)}


def _overlap_ms(source: torch.Tensor, step_ms: float) -> float:
    """How long ``.to(cuda, non_blocking=True)`` blocks the CPU while a GPU step is still running."""
    step = DummyStep(step_ms=step_ms)
    step(None)
    step.synchronize()
    step(None)  # queued: the GPU is busy for step_ms
    start = time.perf_counter()
    source.to("cuda", non_blocking=True)
    blocked = (time.perf_counter() - start) * 1000
    step.synchronize()
    return round(blocked, 3)


def check_pinning(batch_size: int, size: int, repeats: int = 10) -> dict[str, Any]:
    pageable = torch.randint(0, 256, (batch_size, 3, size, size), dtype=torch.uint8)
    pinned = pageable.pin_memory()
    result: dict[str, Any] = {"batch": [batch_size, 3, size, size], "mb": round(pageable.nbytes / 1e6, 1),
                              "pageable": _copy_times(pageable, repeats), "pinned": _copy_times(pinned, repeats)}
    result["pageable"]["cpu_blocked_behind_50ms_step_ms"] = _overlap_ms(pageable, 50)
    result["pinned"]["cpu_blocked_behind_50ms_step_ms"] = _overlap_ms(pinned, 50)
    result["pinned_overlaps_gpu_work"] = result["pinned"]["cpu_blocked_behind_50ms_step_ms"] < 10
    result["speedup_pinned"] = round(result["pageable"]["copy_ms"] / max(result["pinned"]["copy_ms"], 1e-6), 2)
    return result


def check_small_cnn(batch_size: int) -> dict[str, Any]:
    step = DummyStep(model="small-cnn")
    rate = step.step_rate(batch_size, (3, 224, 224))
    return {"samples_per_s": round(rate, 1), "calibration": step.calibration}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check the tuner's GPU side (calibration, pin_memory, a tune run).")
    parser.add_argument("path", nargs="?", help="a pack (.lmdb or shards folder) or image folder to tune on")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--step-ms", type=float, default=120.0, help="GPU step to emulate in the tune run")
    parser.add_argument("--model", choices=("small-cnn",), help="tune against the small CNN instead")
    parser.add_argument("--budget", type=float, default=60.0, help="the tune run's budget in seconds")
    parser.add_argument("--steps", default="10,50,120", help="step_ms values to check the calibration of")
    parser.add_argument("--max-workers", type=int)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device here (torch {torch.__version__}); run it on a machine with an "
              "NVIDIA GPU. Nothing was checked.")
        return 0
    report: dict[str, Any] = {"machine": machine_info()}
    report["calibration"] = check_calibration([float(v) for v in args.steps.split(",")])
    report["pin_memory"] = check_pinning(args.batch_size, 224)
    report["small_cnn"] = check_small_cnn(args.batch_size)
    if args.path:
        result = tune_path(args.path, batch_size=args.batch_size, step_ms=None if args.model else args.step_ms,
                           model=args.model, budget_s=args.budget, max_workers=args.max_workers, progress=False)
        report["tune"] = {**result.as_dict(), "report": format_report(result)}
    report["ok"] = all(row["ok"] for row in report["calibration"]) and report["pin_memory"]["pinned_overlaps_gpu_work"]
    print(json.dumps(report, indent=2, default=str))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
