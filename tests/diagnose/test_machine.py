"""``doctor``'s machine checks (``packload.diagnose.machine``): what CPU counts, load, memory,
``/dev/shm`` and storage facts mean, each judged from facts given by the test."""

from __future__ import annotations

from packload.core.memory import read_meminfo
from packload.core.storage import (
    is_fuse,
    is_network_fs,
)
from packload.diagnose import machine
from packload.diagnose.machine import (
    memory_checks,
    shm_check,
    shm_size,
    small_files_check,
    storage_checks,
    workers_range,
)
from tests.machine_files import GIB, MEMINFO, write


def test_cpu_counts_and_workers():
    assert workers_range(2.0) == (1, 2)
    assert workers_range(16) == (8, 16)
    assert workers_range(0.5) == (1, 1)
    checks = machine.cpu_checks(logical=8, physical=4, affinity=8, quota=2.0)
    limited = next(c for c in checks if c["name"] == "cpu_limit")
    assert limited["status"] == "warn" and "1-2" in limited["fix"]
    assert not [c for c in machine.cpu_checks(32, 16, 32, None) if c["status"] == "warn"]


def test_load_average(tmp_path):
    load = machine.read_loadavg(write(tmp_path / "loadavg", "3.50 2.10 1.00 3/200 12345\n"))
    assert load == [3.5, 2.1, 1.0]
    assert machine.load_check(load, 2.0)["status"] == "warn"
    assert machine.load_check([0.2, 0.1, 0.1], 2.0)["status"] == "ok"
    assert machine.read_loadavg(tmp_path / "missing") is None and machine.load_check(None, 2.0) is None


def test_meminfo_and_page_cache_fit(tmp_path):
    info = read_meminfo(write(tmp_path / "meminfo", MEMINFO))
    assert info["MemTotal"] == 16000000 * 1024 and info["MemAvailable"] == 8000000 * 1024
    assert info["HugePages_Total"] == 0
    fits = {c["name"]: c for c in memory_checks(info, None, 100 << 20)}
    assert fits["page_cache"]["status"] == "ok"
    too_big = {c["name"]: c for c in memory_checks(info, None, 20 * GIB)}
    assert too_big["page_cache"]["status"] == "warn" and too_big["page_cache"]["fix"]
    limited = {c["name"]: c for c in memory_checks(info, GIB, 2 * GIB)}  # the cgroup limit is what counts
    assert limited["page_cache"]["status"] == "warn" and "cgroup memory limit" in limited["memory"]["message"]


def test_shm_sizes():
    small = shm_check((64 << 20, 64 << 20))
    assert small["status"] == "warn" and "bus error" in small["message"] and "--shm-size" in small["fix"]
    assert shm_check(None)["status"] == "warn"
    assert shm_check((8 * GIB, 8 * GIB))["status"] == "ok"


def test_shm_size_reads_statvfs(tmp_path):
    total, free = shm_size(tmp_path)
    assert total > 0 and 0 <= free <= total
    assert shm_size(tmp_path / "missing") is None


def storage(fstype, source="/dev/sda2", disk="sda", spinning=False):
    return {"path": "/data", "mount_point": "/data", "fstype": fstype, "source": source,
            "network": is_network_fs(fstype), "fuse": is_fuse(fstype), "disk": disk, "rotational": spinning}


def test_storage_checks():
    nfs = storage_checks(storage("nfs4", "server:/export", None, None))
    assert nfs[0]["status"] == "warn" and "network" in nfs[0]["message"] and "pack" in nfs[0]["fix"]
    assert nfs[1]["status"] == "info"  # no block device behind NFS
    fuse = storage_checks(storage("fuse.gcsfuse", "gcsfuse", None, None))
    assert fuse[0]["status"] == "warn"
    local = storage_checks(storage("ext4"))
    assert [c["status"] for c in local] == ["ok", "ok"]
    hdd = storage_checks(storage("ext4", spinning=True))
    assert hdd[1]["status"] == "warn" and "SSD" in hdd[1]["fix"]
    virtual = storage_checks(storage("ext4", "/dev/vda", "vda", True))
    assert virtual[1]["status"] == "info"
    assert storage_checks(storage("overlay", "overlay", None, None))[0]["status"] == "info"


def test_many_small_files_threshold():
    flagged = small_files_check(300, 300 * 1000, many=100, small=200_000)
    assert flagged["status"] == "warn" and "pack it" in flagged["fix"]
    assert small_files_check(300, 300 * 1000)["status"] == "ok"  # below the default 10,000 files
    assert small_files_check(20_000, 20_000 * 1_000_000)["status"] == "ok"  # many, but large
