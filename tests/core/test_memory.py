"""How much memory this process has (``packload.core.memory``), from ``/proc/meminfo`` texts and
cgroup files the test writes: kB turned into bytes, the texts a limit may hold, the usage of the
deepest group, and ``memory_status`` read through real files, with a usage past its limit and without
``MemAvailable``. (Plain v1 and v2 limits and usages are in tests/core/test_cgroups.py.)"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from packload.core import memory
from packload.core.memory import KIB, cgroup_memory_limit, cgroup_memory_usage, read_meminfo
from tests.machine_files import GIB, MEMINFO, write


def test_meminfo_in_bytes(tmp_path: Path) -> None:
    text = MEMINFO + "Hugepagesize:       2048 kB\nnot a line\nBroken:  kB\n"
    assert read_meminfo(write(tmp_path / "meminfo", text)) == {
        "MemTotal": 16_000_000 * KIB, "MemFree": 1_000_000 * KIB, "MemAvailable": 8_000_000 * KIB,
        "HugePages_Total": 0,  # a count, not kB: as written
        "Hugepagesize": 2048 * KIB}
    assert read_meminfo(tmp_path / "missing") == {}


def v2(tmp_path: Path, files: dict[str, str], group: str = "job") -> tuple[Path, Path]:
    """A cgroup v2 root with ``files`` (relative paths) and this process in ``group``."""
    root = tmp_path / "cgroup"
    write(root / "cgroup.controllers", "cpu memory\n")
    (root / group).mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        write(root / name, text)
    return root, write(tmp_path / "self_cgroup", f"0::/{group}\n")


@pytest.mark.parametrize(("text", "limit"), [
    (" 1073741824 \n", GIB), ("max\n", None), ("", None), ("-1\n", None), ("1G\n", None),
    (f"{(1 << 62) + 4096}\n", (1 << 62) + 4096),  # past v1's "no limit", below v2's: a limit in v2
])
def test_v2_limit_texts(tmp_path: Path, text: str, limit: int | None) -> None:
    assert cgroup_memory_limit(*v2(tmp_path, {"job/memory.max": text})) == limit


def test_v1_limit_is_the_tightest_of_the_group_and_its_ancestors(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    write(root / "memory" / "memory.limit_in_bytes", f"{1 << 62}\n")  # v1's "no limit"
    write(root / "memory" / "docker" / "memory.limit_in_bytes", f"{3 * GIB}\n")
    write(root / "memory" / "docker" / "abc" / "memory.limit_in_bytes", f"{5 * GIB}\n")
    self_cgroup = write(tmp_path / "self", "3:memory:/docker/abc\n")
    assert cgroup_memory_limit(root, self_cgroup) == 3 * GIB


def test_v1_without_a_memory_controller_has_no_limit_or_usage(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    write(root / "cpu" / "cpu.cfs_quota_us", "-1\n")
    self_cgroup = write(tmp_path / "self", "4:cpu:/\n")
    assert cgroup_memory_limit(root, self_cgroup) is None and cgroup_memory_usage(root, self_cgroup) is None


def test_usage_is_the_deepest_existing_groups(tmp_path: Path) -> None:
    files = {"memory.current": "999\n", "pod/memory.current": "500\n", "pod/job/memory.current": "123\n"}
    assert cgroup_memory_usage(*v2(tmp_path / "a", files, "pod/job")) == 123
    # the group's own folder is not visible (a container's view): the deepest that is
    root, _ = v2(tmp_path / "b", {"memory.current": "999\n"}, "")
    assert cgroup_memory_usage(root, write(tmp_path / "b" / "self", "0::/pod/job\n")) == 999
    assert cgroup_memory_usage(*v2(tmp_path / "c", {"job/memory.current": "n/a\n"})) is None


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``memory_status`` reads the meminfo and cgroup files ``machine(meminfo, files)`` writes."""
    def make(meminfo: str, files: dict[str, str]) -> None:
        meminfo_file = write(tmp_path / "meminfo", meminfo)
        monkeypatch.setattr(memory, "read_meminfo", functools.partial(read_meminfo, meminfo_file))
        where = v2(tmp_path, files)
        monkeypatch.setattr(memory, "cgroup_memory_limit", functools.partial(cgroup_memory_limit, *where))
        monkeypatch.setattr(memory, "cgroup_memory_usage", functools.partial(cgroup_memory_usage, *where))
    return make


def test_a_usage_past_the_limit_leaves_nothing_available(machine) -> None:
    machine(MEMINFO, {"job/memory.max": f"{GIB}\n", "job/memory.current": f"{GIB + 4096}\n"})
    assert memory.memory_status() == {"total": GIB, "available": 0}


def test_a_limit_without_a_usage_file_caps_what_is_available(machine) -> None:
    machine(MEMINFO, {"job/memory.max": f"{4 * GIB}\n"})
    assert memory.memory_status() == {"total": 4 * GIB, "available": 4 * GIB}


def test_a_limit_above_the_ram_changes_nothing(machine) -> None:
    machine(MEMINFO, {"job/memory.max": f"{64 * GIB}\n", "job/memory.current": f"{GIB}\n"})
    assert memory.memory_status() == {"total": 16_000_000 * KIB, "available": 8_000_000 * KIB}


def test_without_memavailable_psutil_says(machine, monkeypatch: pytest.MonkeyPatch) -> None:
    psutil = pytest.importorskip("psutil")
    machine("MemTotal:       16000000 kB\n", {})  # an old kernel's meminfo
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(total=12 * GIB, available=5 * GIB))
    assert memory.memory_status() == {"total": 12 * GIB, "available": 5 * GIB}


def test_without_meminfo_or_psutil_all_the_ram_is_available(machine, monkeypatch: pytest.MonkeyPatch) -> None:
    machine("", {})
    monkeypatch.setitem(sys.modules, "psutil", None)  # not installed
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert memory.memory_status() == {"total": ram, "available": ram}
