"""``packload doctor``: the system-file readers on fixture files, the checks, the stall analysis on
datasets of known cost, the JSON schema, and the whole diagnosis on a small folder and packs."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import Dataset

from packload import pack
from packload.core.errors import UsageError
from packload.diagnose import doctor as doctor_module
from packload.diagnose import machine
from packload.diagnose.doctor import REPORT_SCHEMA, doctor, format_report, schema_errors
from packload.diagnose.gpu_step import DummyStep
from packload.diagnose.machine import (
    Mount,
    SystemPaths,
    arch_support,
    cgroup_cpu_limit,
    cgroup_memory_limit,
    disk_of,
    find_mount,
    gpu_checks,
    is_fuse,
    is_network_fs,
    memory_checks,
    parse_driver_version,
    physical_cores,
    read_meminfo,
    read_mounts,
    rotational,
    shm_check,
    shm_size,
    small_files_check,
    storage_checks,
    storage_facts,
    whole_disk,
    workers_range,
)
from packload.diagnose.page_cache import evict, resident_fraction, resident_pages, warm
from packload.diagnose.stall import BOTTLENECKS, StallPlan, bottleneck, measure_stall, stall_shares
from tests.image_factory import textured_rgb

GIB = 1 << 30


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# -- cgroups ---------------------------------------------------------------------------------------
def test_cgroup_v2_limits_and_unlimited(tmp_path):
    root = tmp_path / "cgroup"
    write(root / "cgroup.controllers", "cpu memory io\n")
    write(root / "cpu.max", "max 100000\n")
    write(root / "memory.max", "max\n")
    self_cgroup = write(tmp_path / "self_cgroup", "0::/\n")
    assert cgroup_cpu_limit(root, self_cgroup) is None
    assert cgroup_memory_limit(root, self_cgroup) is None
    write(root / "cpu.max", "250000 100000\n")
    write(root / "memory.max", f"{4 * GIB}\n")
    assert cgroup_cpu_limit(root, self_cgroup) == pytest.approx(2.5)
    assert cgroup_memory_limit(root, self_cgroup) == 4 * GIB


def test_cgroup_v2_nested_group_takes_the_tightest_ancestor(tmp_path):
    root = tmp_path / "cgroup"
    write(root / "cgroup.controllers", "cpu memory\n")
    write(root / "kubepods" / "cpu.max", "150000 100000\n")
    write(root / "kubepods" / "memory.max", "max\n")
    write(root / "kubepods" / "pod1" / "cpu.max", "max 100000\n")
    write(root / "kubepods" / "pod1" / "memory.max", f"{GIB}\n")
    self_cgroup = write(tmp_path / "self_cgroup", "0::/kubepods/pod1\n")
    assert cgroup_cpu_limit(root, self_cgroup) == pytest.approx(1.5)
    assert cgroup_memory_limit(root, self_cgroup) == GIB


def test_cgroup_v1_quota_limit_and_unlimited(tmp_path):
    root = tmp_path / "cgroup"
    cpu = root / "cpu,cpuacct"
    write(cpu / "cpu.cfs_quota_us", "-1\n")
    write(cpu / "cpu.cfs_period_us", "100000\n")
    write(root / "memory" / "memory.limit_in_bytes", "9223372036854771712\n")  # v1's "no limit"
    self_cgroup = write(tmp_path / "self_cgroup", "4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n0::/\n")
    assert cgroup_cpu_limit(root, self_cgroup) is None  # the group's folder is not visible: the mount root counts
    assert cgroup_memory_limit(root, self_cgroup) is None
    write(cpu / "docker" / "abc" / "cpu.cfs_quota_us", "50000\n")
    write(cpu / "docker" / "abc" / "cpu.cfs_period_us", "100000\n")
    write(root / "memory" / "docker" / "abc" / "memory.limit_in_bytes", f"{2 * GIB}\n")
    assert cgroup_cpu_limit(root, self_cgroup) == pytest.approx(0.5)
    assert cgroup_memory_limit(root, self_cgroup) == 2 * GIB


def test_no_cgroup_files_means_no_limit(tmp_path):
    assert cgroup_cpu_limit(tmp_path / "missing", tmp_path / "missing_self") is None
    assert cgroup_memory_limit(tmp_path / "missing", tmp_path / "missing_self") is None


# -- CPUs and memory -------------------------------------------------------------------------------
CPUINFO = "".join(f"processor\t: {i}\nphysical id\t: 0\ncore id\t\t: {i // 2}\ncpu cores\t: 2\n\n" for i in range(4))
MEMINFO = "MemTotal:       16000000 kB\nMemFree:         1000000 kB\nMemAvailable:    8000000 kB\nHugePages_Total:       0\n"


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


def test_physical_cores_from_cpuinfo(tmp_path):
    assert physical_cores(write(tmp_path / "cpuinfo", CPUINFO)) == 2  # 4 hyperthreads on 2 cores
    assert physical_cores(write(tmp_path / "bare", "processor\t: 0\n\n")) is None


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


# -- mounts and disks ------------------------------------------------------------------------------
MOUNTS = """\
/dev/sda2 / ext4 rw,relatime 0 0
proc /proc proc rw 0 0
server:/export /mnt/data nfs4 rw,vers=4.1 0 0
/dev/nvme0n1p1 /mnt/data/local ext4 rw 0 0
/dev/sdb1 /mnt/dat xfs rw 0 0
gcsfuse /mnt/gcs fuse.gcsfuse rw 0 0
/dev/sdc1 /mnt/usb fuseblk rw 0 0
user@host:/x /mnt/my\\040files fuse.sshfs rw 0 0
overlay /var/lib/docker/overlay2/abc/merged overlay rw,lowerdir=/a 0 0
tmpfs /var/lib/docker/overlay2/abc/merged tmpfs rw 0 0
"""


def test_mounts_longest_prefix(tmp_path):
    mounts = read_mounts(write(tmp_path / "mounts", MOUNTS))
    assert len(mounts) == 10 and mounts[7].point == "/mnt/my files"  # octal escapes decoded

    def fstype(path):
        return find_mount(path, mounts).fstype

    assert fstype("/mnt/data/local/train/a.jpg") == "ext4"  # nested in the NFS mount: the longer one wins
    assert find_mount("/mnt/data/local", mounts).source == "/dev/nvme0n1p1"
    assert fstype("/mnt/data/train") == "nfs4"
    assert fstype("/mnt/dat/x") == "xfs"
    assert fstype("/mnt/datax/y") == "ext4"  # /mnt/dat is not a prefix of /mnt/datax at a / boundary
    assert fstype("/mnt/gcs/bucket/a.jpg") == "fuse.gcsfuse"
    assert fstype("/mnt/my files/a") == "fuse.sshfs"
    assert fstype("/var/lib/docker/overlay2/abc/merged/data") == "tmpfs"  # mounted last, hides the overlay
    assert find_mount("relative", mounts) is None


def test_network_and_fuse_filesystems():
    assert is_network_fs("nfs4") and is_network_fs("cifs") and is_network_fs("lustre")
    assert is_network_fs("fuse.gcsfuse") and is_network_fs("fuse.sshfs")
    assert is_fuse("fuseblk") and not is_network_fs("fuseblk")
    assert not is_network_fs("ext4") and not is_fuse("overlay")


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


@pytest.fixture()
def sysfs(tmp_path):
    """A sysfs with a spinning sda (partition sda2), an SSD nvme0n1 and a device-number link."""
    sys_root = tmp_path / "sys"
    write(sys_root / "block" / "sda" / "queue" / "rotational", "1\n")
    write(sys_root / "block" / "sda" / "sda2" / "partition", "2\n")
    (sys_root / "class" / "block").mkdir(parents=True)
    (sys_root / "class" / "block" / "sda2").symlink_to("../../block/sda/sda2")
    write(sys_root / "block" / "nvme0n1" / "queue" / "rotational", "0\n")
    (sys_root / "dev" / "block").mkdir(parents=True)
    (sys_root / "dev" / "block" / "8:2").symlink_to("../../block/sda/sda2")
    write(sys_root / "block" / "loop0" / "queue" / "rotational", "maybe\n")
    return sys_root


def test_partition_maps_to_its_disk(sysfs):
    assert whole_disk("sda2", sysfs) == "sda"  # through /sys/class/block/sda2/partition
    assert whole_disk("sda", sysfs) == "sda"
    assert whole_disk("nvme0n1p1", sysfs) == "nvme0n1"  # no sysfs entry for the partition: by name
    assert whole_disk("sdz9", sysfs) is None
    assert rotational("sda", sysfs) is True and rotational("nvme0n1", sysfs) is False
    assert rotational("loop0", sysfs) is None and rotational("missing", sysfs) is None
    assert disk_of("/dev/sda2", sysfs) == "sda"
    assert disk_of("/dev/nvme0n1p1", sysfs) == "nvme0n1"
    assert disk_of("overlay", sysfs) is None and disk_of("server:/export", sysfs) is None
    assert disk_of("/dev/root", sysfs, dev=os.makedev(8, 2)) == "sda"  # by device number


def test_storage_facts_on_fixture_mounts(tmp_path, sysfs):
    data = tmp_path / "data"
    data.mkdir()
    mounts = write(tmp_path / "mounts", f"/dev/sda2 / ext4 rw 0 0\n/dev/sda2 {os.path.realpath(tmp_path)} xfs rw 0 0\n")
    facts = storage_facts(str(data), str(mounts), str(sysfs))
    assert facts["fstype"] == "xfs" and facts["disk"] == "sda" and facts["rotational"] is True
    assert not facts["network"] and not facts["fuse"]


def test_many_small_files_threshold():
    flagged = small_files_check(300, 300 * 1000, many=100, small=200_000)
    assert flagged["status"] == "warn" and "pack it" in flagged["fix"]
    assert small_files_check(300, 300 * 1000)["status"] == "ok"  # below the default 10,000 files
    assert small_files_check(20_000, 20_000 * 1_000_000)["status"] == "ok"  # many, but large


# -- PyTorch and the GPU ---------------------------------------------------------------------------
def test_arch_support():
    assert arch_support((9, 0), ["sm_80", "sm_90"]) == "native"
    assert arch_support((8, 6), ["sm_75", "sm_80"]) == "native"  # same major, older minor runs
    assert arch_support((8, 0), ["sm_86"]) == "none"  # a newer minor does not
    assert arch_support((9, 0), ["sm_90a"]) == "native" and arch_support((9, 1), ["sm_90a"]) == "none"
    assert arch_support((12, 0), ["sm_80", "sm_90", "compute_90"]) == "ptx"
    assert arch_support((12, 0), ["sm_50", "sm_80", "sm_90"]) == "none"
    assert arch_support((12, 0), ["sm_100", "sm_120"]) == "native"
    assert arch_support((9, 0), []) is None


def facts(**changes):
    base = {"version": "2.5.0", "cuda_build": "12.4", "hip_build": None, "cuda_available": True,
            "driver_version": "550.54.15", "cudnn_version": 90100, "arch_list": ["sm_80", "sm_90"],
            "devices": [{"index": 0, "name": "NVIDIA H100", "capability": "9.0", "sm": "sm_90",
                         "memory_bytes": 80 * GIB}], "kernels": "native"}
    return {**base, **changes}


def by_name(checks):
    return {c["name"]: c for c in checks}


def test_gpu_checks():
    good = by_name(gpu_checks(facts()))
    assert good["gpu"]["status"] == "ok" and good["gpu_kernels"]["status"] == "ok" and good["driver"]["status"] == "ok"
    blackwell = facts(devices=[{"index": 0, "name": "RTX 5090", "capability": "12.0", "sm": "sm_120",
                                "memory_bytes": 32 * GIB}], kernels="none")
    kernels = by_name(gpu_checks(blackwell))["gpu_kernels"]
    assert kernels["status"] == "warn" and "no kernel image" in kernels["message"] and "cu128" in kernels["fix"]
    old_driver = by_name(gpu_checks(facts(driver_version="470.82.01")))["driver"]
    assert old_driver["status"] == "warn"


def test_gpu_checks_without_gpu():
    cpu_build = facts(cuda_build=None, cuda_available=False, driver_version=None, devices=[], kernels=None)
    [line] = gpu_checks(cpu_build)
    assert line["status"] == "info" and "no GPU" in line["message"]
    [wrong_build] = gpu_checks({**cpu_build, "driver_version": "550.54.15"})
    assert wrong_build["status"] == "warn" and "cu126" in wrong_build["fix"]
    [hidden] = gpu_checks(facts(cuda_available=False, devices=[], kernels=None))
    assert hidden["status"] == "warn" and "--gpus" in hidden["fix"]
    [laptop] = gpu_checks(facts(cuda_available=False, devices=[], kernels=None, driver_version=None))
    assert laptop["status"] == "info" and "no GPU" in laptop["message"]  # a CUDA build without a GPU is fine


def test_driver_version_file(tmp_path):
    text = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
    assert parse_driver_version(text) == "550.54.15"
    assert parse_driver_version("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release") \
        == "570.86.15"
    assert machine.driver_version(str(write(tmp_path / "version", text))) == "550.54.15"
    assert parse_driver_version(None) is None


def test_settings_are_recommended_not_changed():
    before = (torch.backends.cudnn.benchmark, torch.get_float32_matmul_precision())
    checks = by_name(machine.settings_checks(machine.settings_facts(), (9, 0)))
    assert {"cudnn_benchmark", "tf32", "mixed_precision"} <= set(checks)
    assert "bfloat16" in checks["mixed_precision"]["message"]
    assert "float16" in by_name(machine.settings_checks(machine.settings_facts(), (7, 0)))["mixed_precision"]["message"]
    assert (torch.backends.cudnn.benchmark, torch.get_float32_matmul_precision()) == before


def in_memory(path):
    return storage_facts(str(path))["fstype"] in ("tmpfs", "ramfs")


# -- page cache ------------------------------------------------------------------------------------
def test_page_cache_eviction_is_checked(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(os.urandom(2 << 20))
    (tmp_path / "empty.bin").write_bytes(b"")
    assert resident_pages(tmp_path / "empty.bin") == (0, 0)
    warm([str(path)])
    assert resident_fraction([str(path)]) > 0.9
    eviction = evict([str(path)])
    assert eviction.files == 1 and eviction.failed == 0 and eviction.before > 0.9
    if in_memory(tmp_path):
        assert eviction.verified is False  # nothing to evict to: the report must say so
    elif not eviction.verified:
        pytest.skip(f"this filesystem kept the pages cached ({eviction.after:.0%}); nothing to check here")
    else:
        assert eviction.after <= 0.05


# -- stall analysis --------------------------------------------------------------------------------
class SleepyImages(Dataset):
    """Images whose preparation costs a known time: ``__getitem__`` sleeps ``seconds``."""

    def __init__(self, count: int, seconds: float) -> None:
        self.count, self.seconds = count, seconds

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int):
        time.sleep(self.seconds)
        return np.zeros((8, 8, 3), np.uint8), 0


def sleepy_plan(count=72, seconds=0.01):
    return StallPlan(SleepyImages(count, seconds), list(range(count)), files=[])


def test_stall_prep_bound_names_cpu_preparation():
    report = measure_stall(sleepy_plan(), DummyStep(step_ms=1.0, device="cpu"), batch_size=8, workers=2,
                           max_batches=8)
    # two workers sleeping 10 ms per sample deliver at most 200 samples/s
    assert 20 < report["prepare"]["samples_per_s"] <= 200 * 1.1
    assert report["step"]["samples_per_s"] == pytest.approx(8000)
    assert report["fetch"] is None and report["eviction"] is None
    assert report["bottleneck"] == "cpu_preparation" and report["shares"]["prep_stall"] > 0.5
    assert report["prepare"]["gpu_wait_share_of_step"] > 1
    assert any("storage not measured" in note for note in report["notes"])


def test_stall_slow_step_names_the_gpu():
    report = measure_stall(sleepy_plan(), DummyStep(step_ms=2000.0, device="cpu"), batch_size=8, workers=2,
                           max_batches=8)
    assert report["step"]["samples_per_s"] == pytest.approx(4)
    assert report["bottleneck"] == "gpu" and report["shares"]["gpu_busy"] > 0.9


def test_close_stalls_are_called_close():
    shares = stall_shares(step_rate=1000, prepare_rate=500, fetch_rate=350)
    [line] = doctor_module.stall_checks({"shares": shares, "bottleneck": bottleneck(shares), "eviction": None})
    assert line["status"] == "warn" and "about equally" in line["message"]
    clear = stall_shares(step_rate=1000, prepare_rate=900, fetch_rate=100)
    [line] = doctor_module.stall_checks({"shares": clear, "bottleneck": bottleneck(clear), "eviction": None}, "pack")
    assert "about equally" not in line["message"] and "local SSD" in line["fix"] and "pack the" not in line["fix"]


def test_stall_shares_and_bottleneck():
    prep = stall_shares(step_rate=1000, prepare_rate=100, fetch_rate=None)
    assert prep == pytest.approx({"gpu_busy": 0.1, "prep_stall": 0.9, "fetch_stall": 0.0})
    fetch = stall_shares(step_rate=100, prepare_rate=1000, fetch_rate=50)
    assert fetch == pytest.approx({"gpu_busy": 0.5, "prep_stall": 0.0, "fetch_stall": 0.5})
    assert bottleneck(prep) == "cpu_preparation" and bottleneck(fetch) == "storage"
    assert bottleneck(stall_shares(100, 1000, 1000)) == "gpu"
    assert bottleneck(stall_shares(100, 95, 95)) == "gpu"  # a 5 % wait is not worth chasing
    for shares in (prep, fetch):
        assert sum(shares.values()) == pytest.approx(1.0)


# -- the whole diagnosis ---------------------------------------------------------------------------
def make_jpegs(root: Path, per_class: int = 40, size: tuple[int, int] = (96, 80)) -> Path:
    for c in range(2):
        folder = root / f"class{c}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(textured_rgb(size, seed=c * 1000 + i)).save(folder / f"{i:03d}.jpg", quality=85)
    return root


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("doctor")
    images = make_jpegs(root / "images")
    for name in ("x.shards", "x.lmdb"):
        pack(images, root / name, progress=False)
    return root


@pytest.mark.parametrize("name", ["images", "x.shards", "x.lmdb"])
def test_doctor_end_to_end(datasets, name):
    path = str(datasets / name)
    report = doctor(path, batch_size=16, step_ms=5.0, workers=1, max_batches=3, repeats=1, crop=64, progress=False)
    assert schema_errors(report) == []
    assert json.loads(json.dumps(report)) == report  # plain JSON, nothing lost
    assert report["dataset"]["kind"] == ("folder" if name == "images" else "pack")
    assert report["dataset"]["samples"] == 80
    stall = report["stall"]
    assert stall["bottleneck"] in BOTTLENECKS and stall["fetch"] is not None
    assert stall["prepare"]["samples_per_s"] > 0 and stall["eviction"]["files"] >= 1
    assert report["machine"]["storage"]["path"] == os.path.realpath(path)
    lines = format_report(report)
    assert lines[0].startswith("packload doctor") and lines[-2].startswith("Verdict:")
    assert any("training step alone" in line for line in lines)
    assert report["seconds"] < 60


def test_many_tiny_pngs_are_flagged_pack_it(tmp_path):
    folder = tmp_path / "tiny"
    for i in range(300):
        (folder / f"c{i % 3}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((4, 4, 3), i % 256, np.uint8)).save(folder / f"c{i % 3}" / f"{i}.png")
    report = doctor(str(folder), measure=False, many_files=100, progress=False)
    small = by_name(report["checks"])["small_files"]
    assert small["status"] == "warn" and "pack it" in small["fix"] and "300 files" in small["message"]
    assert report["dataset"]["files"] == 300 and report["dataset"]["mean_file_bytes"] < 1000
    assert report["stall"] is None and schema_errors(report) == []
    default = doctor(str(folder), measure=False, progress=False)  # 300 files are not "many" by default
    assert by_name(default["checks"])["small_files"]["status"] == "ok"


def test_no_gpu_path(monkeypatch, datasets):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    report = doctor(None, progress=False)
    assert schema_errors(report) == []
    gpu = by_name(report["checks"])["gpu"]
    assert gpu["status"] in ("info", "warn") and "no GPU" in gpu["message"]
    assert report["machine"]["torch"]["devices"] == [] and report["machine"]["torch"]["kernels"] is None
    assert report["stall"] is None and report["dataset"] is None and "Machine checks only" in report["verdict"]
    measured = doctor(str(datasets / "x.shards"), batch_size=16, step_ms=5.0, workers=0, max_batches=2,
                      repeats=1, crop=64, progress=False)
    assert measured["stall"]["step"]["on_gpu"] is False and "emulated" in measured["stall"]["step"]["description"]
    if not in_memory(datasets):  # with workers=0 the pack is mapped in this process: it must be let go to evict
        assert measured["stall"]["eviction"]["verified"] is True


def test_doctor_reads_injected_system_files(tmp_path):
    proc, cgroup = tmp_path / "proc", tmp_path / "cgroup"
    write(proc / "meminfo", MEMINFO)
    write(proc / "cpuinfo", CPUINFO)
    write(proc / "mounts", MOUNTS)
    write(proc / "self" / "cgroup", "0::/job\n")
    write(proc / "loadavg", "0.10 0.20 0.30 1/100 42\n")
    write(cgroup / "cgroup.controllers", "cpu memory\n")
    write(cgroup / "job" / "cpu.max", "50000 100000\n")
    write(cgroup / "job" / "memory.max", f"{GIB}\n")
    shm = tmp_path / "shm"
    shm.mkdir()
    paths = SystemPaths(proc=str(proc), sys=str(tmp_path / "sys"), cgroup=str(cgroup), shm=str(shm))
    report = doctor(None, paths=paths, progress=False)
    cpu, memory = report["machine"]["cpu"], report["machine"]["memory"]
    assert cpu["cgroup_quota"] == pytest.approx(0.5) and cpu["physical"] == 2 and cpu["workers_range"] == [1, 1]
    assert memory["cgroup_limit_bytes"] == GIB and memory["total_bytes"] == 16000000 * 1024
    assert memory["cgroup_version"] == 2 and cpu["load_average"] == [0.1, 0.2, 0.3]
    assert schema_errors(report) == []


# -- schema, command line, errors ------------------------------------------------------------------
def test_schema_catches_departures():
    json.dumps(REPORT_SCHEMA)  # a plain JSON Schema document
    report = doctor(None, progress=False)
    assert schema_errors(report) == []
    broken = json.loads(json.dumps(report))
    del broken["verdict"]
    broken["checks"][0]["status"] = "bad"
    broken["machine"]["cpu"]["logical"] = "two"
    errors = schema_errors(broken)
    assert any("missing 'verdict'" in e for e in errors)
    assert any("checks[0].status" in e for e in errors)
    assert any("machine.cpu.logical" in e for e in errors)
    assert schema_errors({**report, "seconds": float("nan")})  # not valid JSON


def test_command_line(datasets, capsys):
    from packload.cli import main

    assert main(["doctor", str(datasets / "images"), "--json", "--no-measure"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert schema_errors(out) == [] and out["dataset"]["kind"] == "folder"
    assert main(["doctor", "--quiet", "--no-measure"]) == 0
    assert "Verdict:" in capsys.readouterr().out
    assert main(["doctor", str(datasets / "missing")]) == 2
    assert "not found" in capsys.readouterr().err


def test_bad_options():
    with pytest.raises(UsageError):
        doctor("/no/such/dataset", progress=False)
    with pytest.raises(UsageError):
        doctor(None, batch_size=0, progress=False)
    with pytest.raises(UsageError):
        doctor(None, step_ms=0, progress=False)
    assert doctor_module.DEFAULT_MAX_BATCHES >= 1


def test_known_mount_is_found_for_real_paths(tmp_path):
    mounts = [Mount("/dev/x", "/", "ext4", "rw")]
    assert find_mount(os.path.realpath(tmp_path), mounts).point == "/"
