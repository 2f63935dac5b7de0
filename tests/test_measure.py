"""The tuner's view of the machine comes from packload.diagnose.machine's cgroup-aware readers."""

from __future__ import annotations

from packload.diagnose import measure
from packload.diagnose.machine import cgroup_memory_usage


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
    monkeypatch.setattr(measure, "read_meminfo", lambda: {"MemTotal": 64 << 30, "MemAvailable": 60 << 30})
    monkeypatch.setattr(measure, "cgroup_memory_limit", lambda: 8 << 30)
    monkeypatch.setattr(measure, "cgroup_memory_usage", lambda: 6 << 30)
    assert measure.memory_status() == {"total": 8 << 30, "available": 2 << 30}
    monkeypatch.setattr(measure, "cgroup_memory_limit", lambda: None)
    assert measure.memory_status() == {"total": 64 << 30, "available": 60 << 30}


def test_usable_cores_caps_affinity_by_quota(monkeypatch):
    monkeypatch.setattr(measure.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(measure, "cgroup_cpu_limit", lambda: 1.5)
    assert measure.usable_cores() == 1
    monkeypatch.setattr(measure, "cgroup_cpu_limit", lambda: None)
    assert measure.usable_cores() == 4
