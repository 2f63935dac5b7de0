"""Packing on Ray against packing on one machine, and what one Ray task costs.

    python benchmarks/bench_ray_pack.py --data bench-data [--datasets imagenet,cifar] [--repeats 3]
                                        [--cpus 2] [--out ray-pack.json]

For each dataset: ``pack(..., workers=CPUS)`` (the single-machine engine) and ``pack_ray`` on a
local Ray instance of CPUS CPUs, started once beforehand as a cluster would be (its start-up is
reported apart), runs interleaved, each from an empty destination with ``os.sync()`` untimed
before and timed after. The first Ray run is reported apart too: it starts and imports the Ray
worker processes. Then the per-task cost: empty Ray tasks, and ``pack_ray`` of the first dataset
at several ``task_files`` (seconds against number of tasks: the slope is what each task adds).
Prints a JSON report (also written to --out) and the markdown tables for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packload import EncodeOptions, pack, pack_ray  # noqa: E402
from packload.core.scan import scan_folder  # noqa: E402


def _clear(path: Path) -> None:
    for p in (path, path.with_name(path.name + ".partial")):
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    os.sync()


def _cpu() -> float:
    """CPU seconds of this process and its finished children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _run(engine: str, src: Path, dst: Path, cpus: int, options: EncodeOptions, task_files: int | None = None) -> dict:
    """One timed pack; ``cpu_s`` counts this process, its children and (Ray) the tasks' CPU time."""
    _clear(dst)
    cpu = _cpu()
    start = time.perf_counter()
    if engine == "local":
        result = pack(src, dst, workers=cpus, options=options, progress=False)
    else:
        result = pack_ray(src, dst, options=options, progress=False, task_files=task_files)
    os.sync()
    seconds = time.perf_counter() - start
    result.update(result.pop("ray") or {})  # the Ray engine's task figures, beside the common keys
    cpu_s = _cpu() - cpu + result.get("task_cpu_s", 0.0)
    files = len(scan_folder(src).samples)
    result.update(seconds=seconds, files_per_s=files / seconds, cpu_ms_per_file=cpu_s / files * 1e3)
    return result


def _summary(runs: list[dict]) -> dict[str, Any]:
    rates = [r["files_per_s"] for r in runs]
    return {"median": statistics.median(rates), "min": min(rates), "max": max(rates), "runs": len(rates)}


def compare(src: Path, work: Path, cpus: int, repeats: int, options: EncodeOptions) -> dict[str, Any]:
    """Interleaved local and Ray packs of ``src``; the first Ray run (worker start-up) kept apart."""
    _run("local", src, work / "warm.shards", cpus, options)  # source into the page cache
    first_ray = _run("ray", src, work / "ray.shards", cpus, options)
    local, ray_runs = [], []
    for _ in range(repeats):
        local.append(_run("local", src, work / "local.shards", cpus, options))
        ray_runs.append(_run("ray", src, work / "ray.shards", cpus, options))
    out = {"files": len(scan_folder(src).samples), "local": _summary(local), "ray": _summary(ray_runs),
           "ray_first_run": first_ray["files_per_s"],
           "ray_phases": {k: statistics.median(r[k] for r in ray_runs) for k in ("tasks_s", "join_s")},
           "cpu_ms_per_file": {"local": statistics.median(r["cpu_ms_per_file"] for r in local),
                               "ray": statistics.median(r["cpu_ms_per_file"] for r in ray_runs)},
           "tasks": ray_runs[0]["tasks"]}
    out["ratio"] = out["ray"]["median"] / out["local"]["median"]
    for path in work.iterdir():
        _clear(path)
    return out


def empty_task_cost(ray: Any, count: int = 200) -> dict[str, float]:
    """Milliseconds per empty task: submitted all at once (throughput) and one after another (latency)."""
    @ray.remote(num_cpus=1)
    def nothing() -> None:
        return None

    ray.get([nothing.remote() for _ in range(8)])  # workers up
    start = time.perf_counter()
    ray.get([nothing.remote() for _ in range(count)])
    batch = (time.perf_counter() - start) / count
    start = time.perf_counter()
    for _ in range(50):
        ray.get(nothing.remote())
    serial = (time.perf_counter() - start) / 50
    return {"batch_ms": batch * 1e3, "serial_ms": serial * 1e3}


def task_sweep(src: Path, work: Path, cpus: int, options: EncodeOptions, sizes: list[int],
               repeats: int) -> dict[str, Any]:
    """Seconds of ``pack_ray`` at several ``task_files``; a line fit gives the cost of one more task."""
    points = []
    for size in sizes:
        runs = [_run("ray", src, work / "sweep.shards", cpus, options, task_files=size) for _ in range(repeats)]
        points.append({"task_files": size, "tasks": runs[0]["tasks"],
                       "seconds": statistics.median(r["seconds"] for r in runs),
                       "cpu_s": statistics.median(r["cpu_ms_per_file"] * r["records"] / 1e3 for r in runs)})
    _clear(work / "sweep.shards")
    tasks = np.array([p["tasks"] for p in points], dtype=float)
    seconds = np.array([p["seconds"] for p in points])
    slope, intercept = np.polyfit(tasks, seconds, 1)
    cpu_slope, _ = np.polyfit(tasks, np.array([p["cpu_s"] for p in points]), 1)
    # Wall seconds per extra task with CPUS running at a time, and CPU seconds per extra task.
    return {"points": points, "seconds_per_task": float(slope), "intercept_s": float(intercept),
            "cpu_seconds_per_task": float(cpu_slope)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("bench-data"), help="folder holding the datasets")
    parser.add_argument("--datasets", default="imagenet,cifar", help="comma-separated sub-folders of --data")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray instance and --workers")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sweep", default="10000,2500,1000,500,250",
                        help="task_files values for the per-task cost, on the first dataset ('' to skip)")
    parser.add_argument("--work", type=Path, help="scratch folder for the packs (default: a temporary one)")
    parser.add_argument("--out", type=Path, help="also write the JSON report here")
    args = parser.parse_args(argv)
    import ray

    work = Path(tempfile.mkdtemp(prefix="ray-pack-", dir=args.work))
    report: dict[str, Any] = {"command": " ".join(["python", "benchmarks/bench_ray_pack.py", *(argv or sys.argv[1:])]),
                              "cpus": args.cpus, "ray_version": ray.__version__, "datasets": {}}
    start = time.perf_counter()
    ray.init(num_cpus=args.cpus, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    report["ray_start_s"] = time.perf_counter() - start
    try:
        report["empty_task"] = empty_task_cost(ray)
        names = [n for n in args.datasets.split(",") if n]
        for name in names:
            report["datasets"][name] = compare(args.data / name, work, args.cpus, args.repeats, EncodeOptions())
        sizes = [int(s) for s in args.sweep.split(",") if s]
        if len(sizes) > 1:
            report["sweep"] = task_sweep(args.data / names[0], work, args.cpus, EncodeOptions(), sizes, args.repeats)
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    print()
    print("| dataset | files | tasks | `pack --workers 2` files/s | `--engine ray` files/s | × local | first Ray run "
          "| CPU ms/file local, Ray |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for name, d in report["datasets"].items():
        print(f"| {name} | {d['files']:,} | {d['tasks']} | {d['local']['median']:,.0f} [{d['local']['min']:,.0f}–"
              f"{d['local']['max']:,.0f}] | {d['ray']['median']:,.0f} [{d['ray']['min']:,.0f}–{d['ray']['max']:,.0f}]"
              f" | {d['ratio']:.2f}× | {d['ray_first_run']:,.0f} | {d['cpu_ms_per_file']['local']:.3f}, "
              f"{d['cpu_ms_per_file']['ray']:.3f} |")
    if "sweep" in report:
        print()
        print("| task_files | tasks | seconds | CPU seconds |")
        print("|--:|--:|--:|--:|")
        for p in report["sweep"]["points"]:
            print(f"| {p['task_files']:,} | {p['tasks']} | {p['seconds']:.2f} | {p['cpu_s']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
