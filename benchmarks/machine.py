"""What the machine is, and what it can do at most, so results read as a fraction of the possible.

:func:`describe` lists the CPU, cores, memory, the filesystem under the data, and the versions of
every library involved. :func:`limits` measures ceilings on this machine: per-core decode rates on
in-memory bytes of the benchmark's own images (no storage involved), the cold sequential read
bandwidth of the data's disk, and memory-copy bandwidth.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import io
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from benchmarks import cache
from packload.core.cpus import usable_cores
from packload.diagnose.measure import cpu_model
from packload.loaders.transforms import ResizeCenterCrop

try:  # optional fast JPEG decoder (packload's `fast` extra)
    import simplejpeg
except ImportError:  # pragma: no cover - depends on the environment
    simplejpeg = None

_DISTRIBUTIONS = {
    "python": None, "packload": "packload", "torch": "torch", "numpy": "numpy", "pillow": "pillow",
    "lmdb": "lmdb", "simplejpeg": "simplejpeg", "psutil": "psutil", "matplotlib": "matplotlib",
}
PEER_DISTRIBUTIONS = {"webdataset": "webdataset", "litdata": "litdata", "streaming": "mosaicml-streaming",
                      "ffcv": "ffcv"}


# ---------------------------------------------------------------- description


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _memory() -> dict[str, Any]:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = None
    try:
        text = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        limit = None if text == "max" else int(text)
    except (OSError, ValueError):
        pass
    return {"ram_gb": round(total / 1e9, 1), "cgroup_limit_gb": round(limit / 1e9, 1) if limit else None}


def _filesystem(path: Path) -> dict[str, Any]:
    """Mount point, device, filesystem type, rotational flag and free space under ``path``."""
    real = str(path.resolve())
    best: tuple[str, str, str] = ("/", "?", "?")
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mount, fstype = line.split()[:3]
            if (real == mount or real.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best[0]):
                best = (mount, dev, fstype)
    except OSError:
        pass
    mount, dev, fstype = best
    rotational = None
    name = Path(dev).name
    for candidate in (name, name.rstrip("0123456789"), name.rsplit("p", 1)[0]):
        flag = Path(f"/sys/block/{candidate}/queue/rotational")
        if flag.exists():
            rotational = flag.read_text().strip() == "1"
            break
    usage = shutil.disk_usage(path if path.exists() else path.parent)
    return {"path": real, "mount": mount, "device": dev, "fstype": fstype, "rotational": rotational,
            "free_gb": round(usage.free / 1e9, 1), "total_gb": round(usage.total / 1e9, 1)}


def code_state(repo: Path) -> dict[str, Any]:
    """The packload commit measured and any uncommitted library changes (read-only git calls)."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.rstrip() if done.returncode == 0 else None

    changed = git("status", "--porcelain", "--untracked-files=no", "--", "packload", "packer", "loaders")
    return {"commit": git("rev-parse", "--short", "HEAD"), "subject": git("log", "-1", "--format=%s"),
            "uncommitted_library_files": [line[3:] for line in (changed or "").splitlines()]}


def describe(data_path: str | os.PathLike[str]) -> dict[str, Any]:
    """The machine, the filesystem of ``data_path``, library and peer versions, and the date."""
    versions = {name: (platform.python_version() if dist is None else _version(dist))
                for name, dist in _DISTRIBUTIONS.items()}
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        **_memory(),
        "os": f"{platform.system()} {platform.release()}",
        "python_executable": sys.executable,
        "filesystem": _filesystem(Path(data_path)),
        "versions": versions,
        "peer_versions": {name: _version(dist) for name, dist in PEER_DISTRIBUTIONS.items()},
    }


# ---------------------------------------------------------------- ceilings


def rate(fn: Callable[[bytes], Any], items: Sequence[bytes], seconds: float = 1.0, rounds: int = 3) -> float:
    """Calls of ``fn`` per second on one core over ``items`` (cycled), median of ``rounds`` timings."""
    if not items:
        raise ValueError("no items to time")
    results = []
    for _ in range(rounds):
        done = 0
        start = time.perf_counter()
        deadline = start + seconds / rounds
        while True:
            for item in items:
                fn(item)
            done += len(items)
            now = time.perf_counter()
            if now >= deadline:
                break
        results.append(done / (now - start))
    return statistics.median(results)


_CROP = ResizeCenterCrop(224)


def _pil_rgb(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _pil_crop(data: bytes, *, crop: ResizeCenterCrop = _CROP) -> np.ndarray:
    return crop(Image.open(io.BytesIO(data)).convert("RGB"))


def _pil_draft_crop(data: bytes, *, crop: ResizeCenterCrop = _CROP) -> np.ndarray:
    image = Image.open(io.BytesIO(data))
    image.draft("RGB", (224, 224))
    return crop(image.convert("RGB"))


def _sj_rgb(data: bytes) -> np.ndarray:
    return simplejpeg.decode_jpeg(data, colorspace="RGB")


def _sj_crop(data: bytes, *, crop: ResizeCenterCrop = _CROP) -> np.ndarray:
    return crop(simplejpeg.decode_jpeg(data, colorspace="RGB"))


def sample_files(folder: Path, suffixes: tuple[str, ...], limit: int) -> list[bytes]:
    """The bytes of up to ``limit`` files under ``folder``, spread over its sorted file list."""
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in suffixes)
    step = max(1, len(files) // limit) if files else 1
    return [p.read_bytes() for p in files[::step][:limit]]


def decode_limits(jpeg_dir: Path | None, png_dir: Path | None, seconds: float = 1.0,
                  sample: int = 200) -> dict[str, Any]:
    """Per-core decode rates (images/s) on in-memory bytes of the benchmark images."""
    out: dict[str, Any] = {}
    if jpeg_dir is not None and jpeg_dir.is_dir():
        jpegs = sample_files(jpeg_dir, (".jpg", ".jpeg"), sample)
        if jpegs:
            out["jpeg_files_sampled"] = len(jpegs)
            out["jpeg_mean_kb"] = sum(map(len, jpegs)) / len(jpegs) / 1e3
            out["jpeg_decode_pil"] = rate(_pil_rgb, jpegs, seconds)
            out["jpeg_decode_crop224_pil"] = rate(_pil_crop, jpegs, seconds)
            out["jpeg_decode_crop224_pil_draft"] = rate(_pil_draft_crop, jpegs, seconds)
            if simplejpeg is not None:
                out["jpeg_decode_simplejpeg"] = rate(_sj_rgb, jpegs, seconds)
                out["jpeg_decode_crop224_simplejpeg"] = rate(_sj_crop, jpegs, seconds)
            else:
                out["simplejpeg"] = "not installed"
    if png_dir is not None and png_dir.is_dir():
        pngs = sample_files(png_dir, (".png",), sample * 5)
        if pngs:
            out["png_files_sampled"] = len(pngs)
            out["png_decode_pil"] = rate(_pil_rgb, pngs, seconds)
    return out


def read_bandwidth(folder: Path, size_mb: int = 512, existing: Path | None = None) -> dict[str, Any]:
    """Sequential read MB/s of one large file with a cold cache (eviction checked).

    Reads ``existing`` when given (e.g. a pack), else writes a ``size_mb`` file of random bytes in
    ``folder`` (the data's filesystem), reads it, and removes it.
    """
    made = existing is None
    path = existing if existing is not None else folder / f".packload-bandwidth-{os.getpid()}.bin"
    try:
        if made:
            block = np.random.default_rng(0).integers(0, 256, 8 << 20, dtype=np.uint8).tobytes()
            with open(path, "wb") as f:
                for _ in range(max(1, size_mb // 8)):
                    f.write(block)
                f.flush()
                os.fsync(f.fileno())
        check = cache.evict_checked([path])
        buf = bytearray(8 << 20)
        total = 0
        start = time.perf_counter()
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
        seconds = time.perf_counter() - start
    finally:
        if made and path.exists():
            path.unlink()
    return {"file": str(path), "bytes": total, "mb_per_s": total / seconds / 1e6, "eviction": check,
            "cold": bool(check.get("evicted"))}


def memcpy_bandwidth(size_mb: int = 256, rounds: int = 5) -> float:
    """Best memory-copy bandwidth (GB/s) of ``size_mb`` between two numpy arrays (one core)."""
    src = np.ones(size_mb << 20, dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return src.nbytes / best / 1e9


def limits(jpeg_dir: Path | None, png_dir: Path | None, scratch: Path, *, seconds: float = 1.0,
           read_mb: int = 512, big_file: Path | None = None) -> dict[str, Any]:
    """Every ceiling: per-core decode rates (and × usable cores), cold read and memcpy bandwidth."""
    decode = decode_limits(jpeg_dir, png_dir, seconds)
    cores = usable_cores()
    ceilings = {k.replace("jpeg_", "all_cores_jpeg_").replace("png_", "all_cores_png_"): v * cores
                for k, v in decode.items() if k.startswith(("jpeg_decode", "png_decode"))}
    return {
        "per_core": decode,
        "usable_cores": cores,
        "all_cores": ceilings,
        "cold_read": read_bandwidth(scratch, read_mb, big_file),
        "memcpy_gb_per_s": memcpy_bandwidth(),
    }
