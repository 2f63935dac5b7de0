"""How many CPUs this process can keep busy (``packload.core.cpus``), from cgroup files and
``/proc/cpuinfo`` texts the test writes: the edges of ``cpu.max`` and of the v1 quota files, cores of
several packages, and the affinity mask capped by a quota read from files. (The plain v1 and v2
limits, nested groups and a hyperthreaded cpuinfo are in tests/core/test_cgroups.py.)"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from packload.core import cpus
from packload.core.cpus import affinity_cpus, cgroup_cpu_limit, physical_cores, usable_cpus
from tests.machine_files import write


def v2(tmp_path: Path, cpu_max: str | None, group: str = "") -> tuple[Path, Path]:
    """A cgroup v2 root whose group ``group`` has ``cpu.max`` (none when None), and the
    ``/proc/self/cgroup`` that puts this process there."""
    root = tmp_path / "cgroup"
    write(root / "cgroup.controllers", "cpuset cpu io memory\n")
    (root / group).mkdir(parents=True, exist_ok=True)
    if cpu_max is not None:
        write(root / group / "cpu.max", cpu_max)
    return root, write(tmp_path / "self_cgroup", f"0::/{group}\n")


@pytest.mark.parametrize(("cpu_max", "limit"), [
    ("max 100000\n", None), ("max\n", None), ("", None), (None, None),
    ("150000\n", 1.5),  # no period: the default 100 ms
    ("50000 0\n", None),  # a period of zero: no limit it could mean
    ("20000 10000\n", 2.0), ("1000 100000\n", 0.01),
])
def test_cpu_max(tmp_path: Path, cpu_max: str | None, limit: float | None) -> None:
    assert cgroup_cpu_limit(*v2(tmp_path, cpu_max, "job")) == limit


def test_v2_reads_its_own_line_of_a_hybrid_self_cgroup(tmp_path: Path) -> None:
    root, _ = v2(tmp_path, "300000 100000\n", "pod/app")
    write(root / "cpu.max", "max 100000\n")
    hybrid = write(tmp_path / "hybrid", "12:cpu,cpuacct:/elsewhere\n1:name=systemd:/x\n0::/pod/app\n")
    assert cgroup_cpu_limit(root, hybrid) == 3.0


def v1(tmp_path: Path, mount: str, files: dict[str, str], group: str = "g") -> tuple[Path, Path]:
    """A cgroup v1 root with the cpu controller mounted at ``mount``, ``files`` in group ``group``."""
    root = tmp_path / "cgroup"
    write(root / "memory" / "memory.limit_in_bytes", "9223372036854771712\n")
    (root / mount / group).mkdir(parents=True)
    for name, text in files.items():
        write(root / mount / group / name, text)
    return root, write(tmp_path / "self_cgroup", f"5:memory:/{group}\n4:{mount}:/{group}\n")


@pytest.mark.parametrize(("files", "limit"), [
    ({"cpu.cfs_quota_us": "250000\n", "cpu.cfs_period_us": "100000\n"}, 2.5),
    ({"cpu.cfs_quota_us": "250000\n"}, None),  # no period file: nothing to divide by
    ({"cpu.cfs_quota_us": "250000\n", "cpu.cfs_period_us": "0\n"}, None),
    ({"cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"}, None),
    ({"cpu.cfs_quota_us": "0\n", "cpu.cfs_period_us": "100000\n"}, None),
])
def test_v1_quota(tmp_path: Path, files: dict[str, str], limit: float | None) -> None:
    assert cgroup_cpu_limit(*v1(tmp_path, "cpu,cpuacct", files)) == limit


def test_v1_cpu_mounted_under_any_name_of_its_controllers(tmp_path: Path) -> None:
    files = {"cpu.cfs_quota_us": "50000\n", "cpu.cfs_period_us": "100000\n"}
    assert cgroup_cpu_limit(*v1(tmp_path, "cpuacct,cpu", files)) == 0.5


def test_v1_without_a_cpu_controller_is_no_limit(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    write(root / "memory" / "g" / "memory.limit_in_bytes", "1073741824\n")
    write(root / "cpuset" / "cpuset.cpus", "0-3\n")  # "cpuset" is not "cpu"
    assert cgroup_cpu_limit(root, write(tmp_path / "self", "4:memory:/g\n")) is None


def test_an_empty_cgroup_folder_is_no_limit(tmp_path: Path) -> None:
    (tmp_path / "cgroup").mkdir()
    assert cgroup_cpu_limit(tmp_path / "cgroup", write(tmp_path / "self", "0::/\n")) is None


def test_cores_of_two_packages(tmp_path: Path) -> None:
    """Core ids repeat in each package: a core is a (package, core) pair."""
    blocks = [f"processor\t: {4 * p + i}\nphysical id\t: {p}\ncore id\t\t: {i // 2}\n"
              for p in range(2) for i in range(4)]
    assert physical_cores(write(tmp_path / "cpuinfo", "\n".join(blocks))) == 4


def test_cores_without_a_package_id_count_as_one_package(tmp_path: Path) -> None:
    text = "".join(f"processor\t: {i}\ncore id\t\t: {i}\n\n" for i in range(3))  # as some ARM kernels write it
    assert physical_cores(write(tmp_path / "cpuinfo", text)) == 3
    assert physical_cores(tmp_path / "missing") is None


@pytest.mark.parametrize(("affinity", "quota", "usable"), [(8, None, 8.0), (8, 2.5, 2.5), (2, 6.0, 2.0), (4, 0.3, 0.3)])
def test_usable_cpus_is_the_smaller(affinity: int, quota: float | None, usable: float) -> None:
    assert usable_cpus(affinity, quota) == usable


def test_affinity_is_this_process_mask() -> None:
    assert affinity_cpus() == len(os.sched_getaffinity(0)) >= 1


def test_an_empty_mask_still_counts_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: set())
    assert affinity_cpus() == 1


@pytest.mark.parametrize(("cpu_max", "cores"), [("30000 100000\n", 1), ("250000 100000\n", 2), ("max\n", 4),
                                                ("800000 100000\n", 4)])
def test_usable_cores_from_cgroup_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cpu_max: str,
                                        cores: int) -> None:
    """Four CPUs in the mask, the quota read from real files: whole cores, one at least."""
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(cpus, "cgroup_cpu_limit", functools.partial(cgroup_cpu_limit, *v2(tmp_path, cpu_max)))
    assert cpus.usable_cores() == cores
