"""Measure how fast a DataLoader delivers batches: the one timing routine that the demo, the
benchmarks and the tuner share, and what the machine offers a loader (usable cores, memory, the
memory of a loader's workers)."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from packload.core.cpus import usable_cores
from packload.core.memory import memory_status


@dataclass(frozen=True)
class LoaderTiming:
    """Samples per second in the steady state, and the time to the first batch."""

    samples: int
    seconds: float
    first_batch_s: float

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("inf")


def batch_size_of(batch: Any) -> int:
    """Samples in a batch as DataLoader collates it: ``(images, labels)`` and ``(data, offsets,
    labels)`` tensors count their labels; a list of samples counts its items."""
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[-1], torch.Tensor):
        return len(batch[-1])
    return len(batch)


def time_loader(loader: DataLoader, max_batches: int | None = None, warmup_batches: int = 1) -> LoaderTiming:
    """Iterate ``loader`` (one epoch, or ``max_batches``) and time it, excluding the first
    ``warmup_batches`` (worker start-up is reported apart as ``first_batch_s``)."""
    start = time.perf_counter()
    first_batch_s = 0.0
    counted = 0
    steady_start = start
    for n, batch in enumerate(loader):
        if n + 1 == warmup_batches:
            first_batch_s = time.perf_counter() - start
            steady_start = time.perf_counter()
            continue
        if n + 1 > warmup_batches:
            counted += batch_size_of(batch)
        if max_batches is not None and n + 1 >= max_batches + warmup_batches:
            break
    return LoaderTiming(counted, time.perf_counter() - steady_start, first_batch_s)


# -- what a loader's workers use (for the tuner and ``doctor``) ------------------------------------


def process_memory(pids: list[int]) -> dict[str, int]:
    """Summed ``rss`` and ``pss`` bytes of ``pids`` (PSS splits pages shared after ``fork`` among
    the processes sharing them, so it is what each worker really adds). Gone processes are skipped."""
    rss = pss = 0
    for pid in pids:
        fields = {}
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                name, _, rest = line.partition(":")
                if name in ("Rss", "Pss"):
                    fields[name] = int(rest.split()[0]) * 1024
        except (OSError, ValueError, IndexError):
            fields = _psutil_memory(pid)
        rss += fields.get("Rss", 0)
        pss += fields.get("Pss", fields.get("Rss", 0))
    return {"rss": rss, "pss": pss}


def _psutil_memory(pid: int) -> dict[str, int]:
    try:
        import psutil
    except ImportError:
        return {}
    try:
        info = psutil.Process(pid).memory_full_info()
        return {"Rss": int(info.rss), "Pss": int(getattr(info, "pss", info.rss))}
    except (psutil.Error, OSError):
        return {}


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU seconds used so far by ``pids`` (all their threads; gone ones count 0)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
        except (OSError, ValueError, IndexError):
            pass
    return total


def loader_worker_pids(iterator: Any) -> list[int]:
    """Process ids of a DataLoader iterator's workers (none for ``num_workers=0``)."""
    workers = getattr(iterator, "_workers", None) or []
    return [w.pid for w in workers if getattr(w, "pid", None)]


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    """What a measurement was taken on: CPU, cores, memory, torch, CUDA device (or None), date."""
    cuda = torch.cuda.is_available()
    return {
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "memory_gb": round(memory_status()["total"] / 1e9, 1),
        "torch": torch.__version__,
        "cuda_device": torch.cuda.get_device_name(0) if cuda else None,
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
