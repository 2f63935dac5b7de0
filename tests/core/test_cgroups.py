"""What this process may use (``packload.core.cgroups``, ``cpus`` and ``memory``): cgroup v1 and v2
quotas and memory limits on fixture files, cores from ``/proc/cpuinfo``, the affinity mask capped by
a quota, RAM capped by a cgroup limit."""

from __future__ import annotations

import pytest

from packload.core import cpus, memory
from packload.core.cpus import cgroup_cpu_limit, physical_cores
from packload.core.memory import cgroup_memory_limit, cgroup_memory_usage
from tests.machine_files import CPUINFO, GIB, write


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


def test_physical_cores_from_cpuinfo(tmp_path):
    assert physical_cores(write(tmp_path / "cpuinfo", CPUINFO)) == 2  # 4 hyperthreads on 2 cores
    assert physical_cores(write(tmp_path / "bare", "processor\t: 0\n\n")) is None


def test_cgroup_memory_usage_v2_and_v1(tmp_path):
    v2 = tmp_path / "v2"
    (v2 / "job").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("cpu memory\n")
    (v2 / "job" / "memory.current").write_text("123456\n")
    (tmp_path / "self_v2").write_text("0::/job\n")
    assert cgroup_memory_usage(v2, tmp_path / "self_v2") == 123456
    v1 = tmp_path / "v1"
    (v1 / "memory" / "job").mkdir(parents=True)
    (v1 / "memory" / "job" / "memory.usage_in_bytes").write_text("789\n")
    (tmp_path / "self_v1").write_text("4:memory:/job\n")
    assert cgroup_memory_usage(v1, tmp_path / "self_v1") == 789
    assert cgroup_memory_usage(tmp_path / "none", tmp_path / "self_v1") is None


def test_memory_status_respects_a_cgroup_limit(monkeypatch):
    monkeypatch.setattr(memory, "read_meminfo", lambda: {"MemTotal": 64 << 30, "MemAvailable": 60 << 30})
    monkeypatch.setattr(memory, "cgroup_memory_limit", lambda: 8 << 30)
    monkeypatch.setattr(memory, "cgroup_memory_usage", lambda: 6 << 30)
    assert memory.memory_status() == {"total": 8 << 30, "available": 2 << 30}
    monkeypatch.setattr(memory, "cgroup_memory_limit", lambda: None)
    assert memory.memory_status() == {"total": 64 << 30, "available": 60 << 30}


def test_usable_cores_caps_affinity_by_quota(monkeypatch):
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(cpus, "cgroup_cpu_limit", lambda: 1.5)
    assert cpus.usable_cores() == 1
    monkeypatch.setattr(cpus, "cgroup_cpu_limit", lambda: None)
    assert cpus.usable_cores() == 4
