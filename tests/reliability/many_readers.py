"""Many readers: DataLoader workers over one pack for several epochs, every record right each
epoch, and file descriptors, memory maps and RSS (parent and workers) that do not grow."""

from __future__ import annotations

import gc
import os
import time
import zlib
from pathlib import Path
from typing import Any


def fd_count() -> int:
    """Open file descriptors of this process."""
    return len(os.listdir("/proc/self/fd"))


def file_fd_count() -> int:
    """Open descriptors of files (not pipes, sockets or the shared memory that DataLoader workers
    pass tensors through, whose number varies with the batches in flight)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/") and not target.startswith(("/dev/shm", "/proc/")) and "(deleted)" not in target:
            count += 1
    return count


def pack_maps(root: str) -> int:
    """Memory maps of files under ``root`` in this process."""
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if root in line)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class ProbeDataset:
    """A ``PackedImageFolder`` (checksums on) that also reports, per sample, the worker's pid, open
    file descriptors and resident memory."""

    def __init__(self, root: str) -> None:
        from packload import PackedImageFolder

        self.root = str(Path(root).resolve())
        self.ds = PackedImageFolder(root, output="numpy", verify=True)

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> tuple[int, int, int, int, int, int, int]:
        image, label = self.ds[i]
        return (i, label, zlib.crc32(image.tobytes()), os.getpid(), file_fd_count(), pack_maps(self.root),
                rss_bytes())


def load_check(pack: Path, workers: int, epochs: int, persistent: bool, start_method: str,
               batch_size: int = 8) -> dict[str, Any]:
    """``workers`` DataLoader workers over one pack for ``epochs`` epochs: every record each epoch
    with the right pixels, and file descriptors (parent and workers) and RSS per epoch."""
    from torch.utils.data import DataLoader

    from packload import PackedImageFolder

    ds = ProbeDataset(str(pack))
    reference = PackedImageFolder(pack, output="numpy")
    crcs = [zlib.crc32(reference[i][0].tobytes()) for i in range(len(reference))]
    labels = list(reference.targets)
    reference.close()
    sampler = reference.sampler(shuffle=True, seed=1)
    loader = DataLoader(ds, batch_size=batch_size, sampler=sampler, num_workers=workers,  # type: ignore[arg-type]
                        persistent_workers=persistent, multiprocessing_context=start_method, timeout=300)
    per_epoch = []
    problems: list[str] = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        seen: list[int] = []
        worker_fds: dict[int, int] = {}
        worker_rss: dict[int, int] = {}
        worker_maps: dict[int, int] = {}
        for index, label, crc, pid, fds, maps, rss in loader:
            for i, y, c, p, f, m, r in zip(index.tolist(), label.tolist(), crc.tolist(), pid.tolist(), fds.tolist(),
                                           maps.tolist(), rss.tolist(), strict=True):
                seen.append(i)
                if y != labels[i] or c != crcs[i]:
                    problems.append(f"epoch {epoch}: record {i} read wrong")
                worker_fds[p] = max(worker_fds.get(p, 0), f)
                worker_maps[p] = max(worker_maps.get(p, 0), m)
                worker_rss[p] = max(worker_rss.get(p, 0), r)
        gc.collect()
        if per_epoch:  # workers that just exited may take a moment to release their pipes
            deadline = time.monotonic() + 2.0
            while fd_count() > per_epoch[0]["parent_fds"] and time.monotonic() < deadline:
                time.sleep(0.05)
        if sorted(seen) != list(range(len(labels))):
            problems.append(f"epoch {epoch}: {len(seen)} samples, not each of the {len(labels)} records once")
        per_epoch.append({"parent_fds": fd_count(), "parent_rss_mb": round(rss_bytes() / 2**20, 1),
                          "workers_seen": len(worker_fds), "worker_fds_max": max(worker_fds.values()),
                          "worker_pack_maps_max": max(worker_maps.values()),
                          "worker_rss_mb_max": round(max(worker_rss.values()) / 2**20, 1)})
    del loader
    gc.collect()
    first, last = per_epoch[min(1, epochs - 1)], per_epoch[-1]
    if last["parent_fds"] > first["parent_fds"]:
        problems.append(f"parent file descriptors grew: {[e['parent_fds'] for e in per_epoch]}")
    if last["worker_fds_max"] > first["worker_fds_max"]:
        problems.append(f"worker file descriptors grew: {[e['worker_fds_max'] for e in per_epoch]}")
    if last["worker_pack_maps_max"] > first["worker_pack_maps_max"]:
        problems.append(f"worker maps of the pack grew: {[e['worker_pack_maps_max'] for e in per_epoch]}")
    if last["worker_rss_mb_max"] > first["worker_rss_mb_max"] + 64:
        problems.append(f"worker RSS grew: {[e['worker_rss_mb_max'] for e in per_epoch]} MB")
    if last["parent_rss_mb"] > first["parent_rss_mb"] + 64:
        problems.append(f"parent RSS grew: {[e['parent_rss_mb'] for e in per_epoch]} MB")
    if any(e["workers_seen"] > workers for e in per_epoch):
        problems.append("more worker processes than asked for")
    return {"backend": "lmdb" if pack.is_file() else "shards", "workers": workers, "epochs": epochs,
            "persistent": persistent, "start_method": start_method, "per_epoch": per_epoch,
            "problems": problems}
