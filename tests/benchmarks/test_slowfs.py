"""benchmarks/slowfs.py: the emulated slow disk (its server ``slowfs.c``, built on first use) adds the
latency it claims and returns identical bytes; and, through its counters, the reader issues few large
requests when it reads a pack in batches. No wall-clock time is asserted: the server counts every
request it served and the time it held each back (its ``delay_s``), and the tests read those."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from benchmarks import slowfs
from packload import PackedImageFolder, pack
from packload.diagnose.page_cache import drop

ROOT = Path(__file__).resolve().parents[2]
REASON = slowfs.unavailable()
needs_fuse = pytest.mark.skipif(REASON is not None, reason=f"slowfs cannot mount here: {REASON}")


def _evict(root: Path) -> None:
    for f in root.rglob("*"):
        if f.is_file():
            drop(f)


@pytest.fixture
def files(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    for i in range(6):
        (src / f"small{i}.bin").write_bytes(rng.bytes(3000 + i))
    (src / "big.bin").write_bytes(rng.bytes(3 << 20))
    (src / "sub").mkdir()
    (src / "sub" / "x.bin").write_bytes(b"hello")
    return src


@needs_fuse
def test_adds_latency_and_returns_identical_bytes(files: Path, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    with slowfs.SlowFS(files, mnt, latency_ms=30) as fs:
        before = fs.stats()
        for i in range(6):
            ahead = fs.stats()
            data = (mnt / f"small{i}.bin").read_bytes()
            one = fs.stats().minus(ahead)
            # one open and at least one read request, each held back 30 ms, as the server counts them
            assert one.opens == 1 and one.reads >= 1
            assert one.delay_s == pytest.approx(0.030 * (one.opens + one.reads))
            assert data == (files / f"small{i}.bin").read_bytes()
        assert (mnt / "big.bin").read_bytes() == (files / "big.bin").read_bytes()
        assert (mnt / "sub" / "x.bin").read_bytes() == b"hello"
        assert sorted(p.name for p in mnt.iterdir()) == sorted(p.name for p in files.iterdir())  # counters hidden
        d = fs.stats().minus(before)
        assert d.opens == 8
        assert d.read_bytes >= 6 * 3000 + (3 << 20) + 5
        assert d.delay_s >= 0.030 * (d.opens + d.reads) * 0.99
        assert max(d.read_sizes) <= 128 * 1024 + 4096  # the kernel cuts reads into FUSE-sized requests
        with pytest.raises(OSError):
            (mnt / "new.bin").write_bytes(b"x")  # read-only
    assert not mnt.is_mount()
    assert fs.final_stats is not None and fs.final_stats.opens >= 8


@needs_fuse
def test_bandwidth_cap_and_concurrent_requests_overlap(files: Path, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    with slowfs.SlowFS(files, mnt, latency_ms=0, mbps=30) as fs:
        before = fs.stats()
        assert (mnt / "big.bin").read_bytes() == (files / "big.bin").read_bytes()
        d = fs.stats().minus(before)
        # every read request held back for its bytes at 30 MB/s: 3 MiB at least, as the server counts
        assert d.read_bytes == 3 << 20 and d.delay_s >= (3 << 20) / 30e6 * 0.999
    with slowfs.SlowFS(files, mnt, latency_ms=100) as fs:
        before = fs.stats()
        threads = [threading.Thread(target=(mnt / f"small{i}.bin").read_bytes) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        d = fs.stats().minus(before)
        # served by several threads at once (counted by the server); each reader still had its open
        # and its read held back 100 ms
        assert fs.stats().max_reads_in_flight >= 2
        assert d.opens == 6 and d.reads >= 6
        assert d.delay_s == pytest.approx(0.100 * (d.opens + d.reads))


@needs_fuse
def test_unmounts_when_the_block_raises(files: Path, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    with pytest.raises(ZeroDivisionError), slowfs.SlowFS(files, mnt, latency_ms=1):
        assert mnt.is_mount()
        1 / 0  # noqa: B018
    assert not mnt.is_mount()


@needs_fuse
def test_links_meta_latency_and_counters_file(files: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "o.bin").write_bytes(b"far")
    (files / "far").symlink_to(outside, target_is_directory=True)
    (files / "far.bin").symlink_to(outside / "o.bin")
    mnt = tmp_path / "mnt"
    with slowfs.SlowFS(files, mnt, latency_ms=0, meta_latency_ms=30) as fs:
        before = fs.stats()
        assert (mnt / "far").is_dir() and not (mnt / "far").is_symlink()  # links shown as what they point to
        looked = fs.stats().minus(before)
        assert looked.getattrs >= 1 and looked.delay_s == pytest.approx(0.030 * looked.getattrs)  # the lookup waited
        assert (mnt / "far" / "o.bin").read_bytes() == b"far" == (mnt / "far.bin").read_bytes()
        assert (mnt / "far.bin").stat().st_mode & 0o222 == 0  # read-only
        names = os.listdir(mnt)
        assert ".slowfs-stats" not in names and "far.bin" in names
        for _ in range(3):  # reading the counters is not counted and not delayed
            (mnt / ".slowfs-stats").read_bytes()
        d = fs.stats().minus(before)
        assert d.opens == 2 and d.reads == 2 and d.read_bytes == 6
        assert d.readdirs >= 1 and d.getattrs >= 3  # a lookup each of far, far/o.bin and far.bin
        assert d.delay_s >= 0.030 * (d.getattrs + d.readdirs) * 0.99
        live = json.loads((mnt / ".slowfs-stats").read_bytes())
    assert list(live) == list(slowfs.Stats().to_json())  # the server writes the shape Stats reads
    assert fs.final_stats is not None and fs.final_stats.opens == live["opens"]


def test_compiled_server_builds_outside_the_repo_once_per_source(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    reason = slowfs.c_server()[1]
    if reason is not None and "does not build" not in reason:
        pytest.skip(f"the slowfs server cannot be built here: {reason}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    source = tmp_path / "slowfs.c"
    source.write_bytes(slowfs.C_SOURCE.read_bytes())
    monkeypatch.setattr(slowfs, "C_SOURCE", source)
    slowfs.c_server.cache_clear()
    try:
        first, why = slowfs.c_server()
        assert why is None and first is not None and os.access(first, os.X_OK)
        assert first.parent == tmp_path / "cache" / "packload" and not first.is_relative_to(ROOT)
        slowfs.c_server.cache_clear()
        assert slowfs.c_server() == (first, None)  # cached: not rebuilt
        source.write_text(source.read_text() + "\n/* changed */\n")
        slowfs.c_server.cache_clear()
        second, _ = slowfs.c_server()
        assert second is not None and second != first  # a changed source is a new binary
        source.write_text("this is not C\n")
        slowfs.c_server.cache_clear()
        binary, why = slowfs.c_server()
        assert binary is None and "does not build" in why
        assert sorted(p.name for p in first.parent.iterdir()) == sorted([first.name, second.name])  # no leftovers
    finally:
        slowfs.c_server.cache_clear()


def test_without_the_server_a_mount_says_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(slowfs, "c_server", lambda: (None, "no compiler here"))
    if REASON is None:  # everything else is there: the server is what is missing
        assert slowfs.unavailable() == "no compiler here"
    with pytest.raises(RuntimeError, match="cannot mount a slowfs"):
        slowfs.SlowFS(tmp_path, tmp_path / "mnt").mount()
    assert not (tmp_path / "mnt").exists()  # refused before anything was made


@needs_fuse
def test_command_line_serves(files: Path, tmp_path: Path) -> None:
    mnt, stats = tmp_path / "mnt", tmp_path / "stats.json"
    mnt.mkdir()
    proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "slowfs.py"), str(files), str(mnt),
                             "--latency-ms", "1", "--stats-file", str(stats)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + slowfs.MOUNT_TIMEOUT_S
        while not os.path.ismount(mnt):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.02)
        assert (mnt / "sub" / "x.bin").read_bytes() == b"hello"
    finally:
        slowfs.unmount(mnt)
        proc.wait(10)
    assert proc.returncode == 0
    written = slowfs.Stats.from_json(json.loads(stats.read_text()))
    assert written.opens == 1 and written.read_bytes == 5 and written.read_sizes


def test_command_line_rejects_a_missing_source(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "slowfs.py"), str(tmp_path / "nope"),
                          str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "nope" in run.stderr


# ---------------------------------------------------------------- the reader's requests


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3,000 noisy 32x32 PNGs in 3 classes, packed as shards and as LMDB (about 9 MB each)."""
    base = tmp_path_factory.mktemp("slowpacks")
    rng = np.random.default_rng(1)
    for c in range(3):
        (base / "images" / f"c{c}").mkdir(parents=True)
        for i in range(1000):
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(base / "images" / f"c{c}" / f"{i}.png")
    pack(base / "images", base / "p.shards", progress=False)
    pack(base / "images", base / "p.lmdb", progress=False)
    return base


@needs_fuse
@pytest.mark.parametrize("name", ["p.shards", "p.lmdb"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_reader_issues_few_large_requests(packs: Path, tmp_path: Path, name: str, shuffle: bool) -> None:
    mnt = tmp_path / "mnt"
    with slowfs.SlowFS(packs, mnt, latency_ms=2) as fs:
        _evict(mnt / name)
        before = fs.stats()
        ds = PackedImageFolder(mnt / name, output="bytes")
        order = list(ds.sampler(shuffle=shuffle, seed=0))
        got = {}
        for i in range(0, len(order), 256):
            batch = order[i : i + 256]
            got.update(zip(batch, (img for img, _ in ds.__getitems__(batch)), strict=True))
        original = packs / "images" / ds.path(1234)
        ds.close()
        d = fs.stats().minus(before)
    assert len(got) == 3000
    assert got[1234] == original.read_bytes()
    size = sum(f.stat().st_size for f in (packs / name).rglob("*")) if (packs / name).is_dir() \
        else (packs / name).stat().st_size
    assert d.read_bytes <= 1.5 * size  # each byte fetched about once
    assert d.reads < 3000 / 20, d  # far fewer requests than records
    assert d.mean_read_kb >= 64, d  # large requests, not 4 KiB page faults
    if name == "p.shards" or shuffle:  # a sequential LMDB batch is one chunk: the kernel's readahead serves it
        assert d.max_reads_in_flight >= 4, d  # on FUSE the reader keeps several requests in flight


@needs_fuse
@pytest.mark.parametrize("name", ["p.shards", "p.lmdb"])
def test_announcement_reads_ahead_in_the_background_on_fuse(packs: Path, tmp_path: Path, name: str) -> None:
    """On FUSE a sampler's announcement is read by the reader's own threads after ``advise`` returns:
    the window's bytes arrive with no further call, in large requests, and the batches that follow
    ask the storage for nothing more."""
    from packload.loaders.read import PackReader

    mnt = tmp_path / "mnt"
    with slowfs.SlowFS(packs, mnt, latency_ms=2) as fs:
        _evict(mnt / name)
        ds = PackedImageFolder(mnt / name, output="bytes")
        window = np.arange(1000, 2024)
        with PackReader(mnt / name) as reader:
            reader.positions(window)  # the index is read before the count starts
            before = fs.stats()
            queued = reader.advise(window)
            deadline = time.monotonic() + 30
            while fs.stats().minus(before).read_bytes < queued and time.monotonic() < deadline:
                time.sleep(0.01)
            ahead = fs.stats().minus(before)
            assert queued >= 1024 * (32 * 32 * 3) // 2  # the window's records, more or less compressed
            assert queued <= ahead.read_bytes <= queued + (1 << 20), ahead
            assert ahead.mean_read_kb >= 64, ahead
            assert ahead.max_reads_in_flight >= 4, ahead  # read in parallel, not one request at a time
            time.sleep(0.05)
            before = fs.stats()
            got = [data for data, _ in ds.__getitems__(window.tolist())]
            assert fs.stats().minus(before).reads <= 2  # at most an index or header page: the bytes are here
        assert got == [(packs / "images" / ds.path(i)).read_bytes() for i in window.tolist()]
        ds.close()


def test_run_storage_option_parses_and_rejects() -> None:
    import argparse

    from benchmarks.run import _storage

    assert _storage("local") is None
    assert _storage("slow:2") == {"latency_ms": 2.0, "mbps": None}
    assert _storage("slow:0.5:200") == {"latency_ms": 0.5, "mbps": 200.0}
    for bad in ("slow", "slow:x", "fast:2", "slow:2:0", "slow:-1", "slow:1:2:3"):
        with pytest.raises(argparse.ArgumentTypeError, match="slow:LATENCY_MS"):
            _storage(bad)
