"""``doctor``'s checks of the PyTorch build and the GPU (``packload.diagnose.gpu_checks``): kernels for
a compute capability, the driver, the speed settings (read, never changed)."""

from __future__ import annotations

import torch

from packload.diagnose import gpu_checks as gpu_checks_module
from packload.diagnose.gpu_checks import arch_support, gpu_checks, parse_driver_version
from tests.machine_files import GIB, by_name, write


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
    assert gpu_checks_module.driver_version(str(write(tmp_path / "version", text))) == "550.54.15"
    assert parse_driver_version(None) is None


def test_settings_are_recommended_not_changed():
    before = (torch.backends.cudnn.benchmark, torch.get_float32_matmul_precision())
    checks = by_name(gpu_checks_module.settings_checks(gpu_checks_module.settings_facts(), (9, 0)))
    assert {"cudnn_benchmark", "tf32", "mixed_precision"} <= set(checks)
    assert "bfloat16" in checks["mixed_precision"]["message"]
    assert "float16" in by_name(gpu_checks_module.settings_checks(gpu_checks_module.settings_facts(), (7, 0)))["mixed_precision"]["message"]
    assert (torch.backends.cudnn.benchmark, torch.get_float32_matmul_precision()) == before
