"""``packload doctor``: the system-file readers on fixture files, the checks, the stall analysis on
datasets of known cost, the JSON schema, and the whole diagnosis on a small folder and packs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from packload import pack
from packload.core.errors import UsageError
from packload.diagnose import doctor as doctor_module
from packload.diagnose.doctor import REPORT_SCHEMA, doctor, format_report, schema_errors
from packload.diagnose.machine import (
    SystemPaths,
)
from packload.diagnose.stall import BOTTLENECKS
from tests.image_factory import textured_rgb
from tests.machine_files import CPUINFO, GIB, MEMINFO, MOUNTS, by_name, in_memory, write


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
def test_doctor_end_to_end(datasets, name, monkeypatch):
    from packload.diagnose import stall as stall_module

    passes = []
    real_time_plan = stall_module.time_plan

    def counted(plan, batch_size, workers, max_batches, pin_memory=False):
        passes.append(max_batches)
        return real_time_plan(plan, batch_size, workers, max_batches, pin_memory)

    monkeypatch.setattr(stall_module, "time_plan", counted)
    clock = iter([10.0, 12.5])  # doctor's own clock: read when it starts and when it is done
    monkeypatch.setattr(doctor_module, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
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
    assert "Assumed a GPU step of 5 ms per batch of 16 (as given)" in report["verdict"]
    # the work is bounded: a cached and a storage pass (and at most one untimed pass to warm the
    # cache), each of at most the batches asked for
    assert 2 <= len(passes) <= 3 and set(passes) == {3}
    assert report["seconds"] == 2.5  # the whole diagnosis, from its start to its end


def test_the_verdict_says_when_the_step_is_the_default(datasets):
    """No --step-ms: the verdict says the 100 ms step was assumed, and how to measure the real one,
    and the loop it assumed: the same default and the same loop as tune's."""
    from packload.diagnose.training_loop import DEFAULT_STEP_MS, loop_words

    report = doctor(str(datasets / "images"), batch_size=16, workers=1, max_batches=2, repeats=1, crop=64,
                    progress=False)
    assert DEFAULT_STEP_MS == 100
    assert "Assumed a GPU step of 100 ms per batch of 16 (the default" in report["verdict"]
    assert "packload.watch" in report["verdict"] and "step_ms" in report["verdict"]
    assert loop_words(True) in report["verdict"] and "with 1 DataLoader worker the next batches load" in report["verdict"]


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


def test_the_command_lines_verdict_says_the_default_step_in_its_flags(datasets, capsys):
    """`packload doctor PATH`: the verdict states the default step and the loop, as tune's does, and
    names --step-ms (the command's flag), not the library's step_ms."""
    from packload.cli import main

    assert main(["doctor", str(datasets / "x.lmdb"), "--batch-size", "8", "--max-batches", "1", "--repeats", "1",
                 "--crop", "16", "--workers", "0", "--quiet"]) == 0
    [verdict] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Verdict:")]
    assert "a GPU step of 100 ms per batch of 8 (the default: measure yours with packload.watch(loader) and give " \
           "it as --step-ms)" in verdict
    assert "waits for each step" in verdict and "loading in the main process (workers 0) adds to each step" in verdict
    assert "step_ms" not in verdict


def test_bad_options():
    with pytest.raises(UsageError):
        doctor("/no/such/dataset", progress=False)
    with pytest.raises(UsageError):
        doctor(None, batch_size=0, progress=False)
    with pytest.raises(UsageError):
        doctor(None, step_ms=0, progress=False)
    assert doctor_module.DEFAULT_MAX_BATCHES >= 1




def test_a_folder_with_broken_files_is_measured_without_them(tmp_path, capsys):
    """One broken file among the images: skipped and named as pack would, no DataLoader traceback."""
    from packload.cli import main

    images = make_jpegs(tmp_path / "images", per_class=4)  # few enough that every file is measured
    (images / next(p.name for p in images.iterdir() if p.is_dir()) / "zz-broken.jpg").write_bytes(b"\xff\xd8broken")
    assert main(["doctor", str(images), "--batch-size", "4", "--max-batches", "2", "--repeats", "1",
                 "--workers", "0", "--crop", "16", "--step-ms", "1", "--json"]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    report = json.loads(captured.out)
    assert schema_errors({k: v for k, v in report.items() if k != "command"}) == []
    broken = by_name(report["checks"])["broken_files"]
    assert broken["status"] == "warn" and "zz-broken.jpg" in broken["message"]
    assert report["stall"] is not None


def test_fast_decoder_recommended_only_when_missing(monkeypatch):
    from packload.diagnose import machine, software

    monkeypatch.setattr(software, "fast_decoder_installed", lambda: True)
    assert software.fast_hint() == ""
    assert by_name(software.software_checks())["fast_decoder"]["status"] == "ok"
    assert not any("fast" in (c["fix"] or "") for c in machine.cpu_checks(2, 1, 2, None))
    monkeypatch.setattr(software, "fast_decoder_installed", lambda: False)
    assert "pip install simplejpeg" in software.fast_hint()
    assert "pip install simplejpeg" in by_name(software.software_checks())["fast_decoder"]["fix"]
    assert any("pip install simplejpeg" in (c["fix"] or "") for c in machine.cpu_checks(2, 1, 2, None))


def test_resize_kernel_reported(monkeypatch):
    from packload.core import resize_kernel
    from packload.diagnose import software

    monkeypatch.setattr(resize_kernel, "available", lambda: False)
    monkeypatch.setattr(resize_kernel, "unavailable_reason", "the compiled kernel was not built (no C compiler)")
    check_ = by_name(software.software_checks())["resize_kernel"]
    assert check_["status"] == "warn" and "not built" in check_["message"] and "compiler" in check_["fix"]
    monkeypatch.setattr(resize_kernel, "available", lambda: True)
    assert by_name(software.software_checks())["resize_kernel"]["status"] == "ok"


def test_batch_decoder_reported(monkeypatch):
    from packload.core import jpeg_kernel
    from packload.diagnose import software

    monkeypatch.setattr(jpeg_kernel, "available", lambda: False)
    monkeypatch.setattr(jpeg_kernel, "unavailable_reason", lambda: "the compiled batch decoder was not built (it "
                        "needs a C compiler when packload is installed)")
    check_ = by_name(software.software_checks())["batch_decoder"]
    assert check_["status"] == "info" and "not built" in check_["message"] and "C compiler" in check_["fix"]
    monkeypatch.setattr(jpeg_kernel, "unavailable_reason", lambda: "no usable libjpeg-turbo was found: "
                        "libjpeg.so.8 from the system is not the libjpeg 6.2 ABI this build expects")
    check_ = by_name(software.software_checks())["batch_decoder"]
    assert "libjpeg.so.8" in check_["message"] and "one at a time" in check_["message"]
    assert "pillow" in check_["fix"] and "libjpeg62-turbo" in check_["fix"]
    monkeypatch.setattr(jpeg_kernel, "unavailable_reason", lambda: "disabled by jpeg_kernel.set_enabled(False)")
    check_ = by_name(software.software_checks())["batch_decoder"]
    assert "disabled" in check_["message"] and not check_["fix"]
    monkeypatch.setattr(jpeg_kernel, "available", lambda: True)
    monkeypatch.setattr(jpeg_kernel, "description", lambda: "libjpeg-turbo libjpeg-x.so.62 from Pillow's wheel")
    check_ = by_name(software.software_checks())["batch_decoder"]
    assert check_["status"] == "ok" and "from Pillow's wheel" in check_["message"]


def test_no_measure_with_a_dataset_does_not_ask_for_one(datasets):
    report = doctor(str(datasets / "images"), measure=False, progress=False)
    assert "give a dataset" not in report["verdict"] and "--no-measure" in report["verdict"]
    assert "give a dataset" in doctor(None, progress=False)["verdict"]
