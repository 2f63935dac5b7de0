"""Checks of PyTorch's build and the GPU for ``packload doctor``: kernels for this GPU, the driver, and
the training settings that change speed a lot (cudnn.benchmark, TF32, mixed precision)."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any, TypedDict

from packload.core.cgroups import read_text
from packload.diagnose.checks import Check, check, human_bytes

WHEEL_FOR_MAJOR = {10: "cu128", 11: "cu128", 12: "cu128"}

DEFAULT_WHEEL = "cu126"

MIN_DRIVER = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580, 65, 6)}


def parse_arch(arch: str) -> tuple[str, int, str] | None:
    """``sm_90`` → ("sm", 90, ""), ``sm_90a`` → ("sm", 90, "a"), ``compute_80`` → ("compute", 80, "")."""
    match = re.fullmatch(r"(sm|compute)_(\d+)([a-z]*)", arch)
    return (match.group(1), int(match.group(2)), match.group(3)) if match else None

def _split(number: int) -> tuple[int, int]:
    """``90`` → (9, 0), ``120`` → (12, 0): the last digit is the minor version."""
    major, minor = divmod(number, 10)
    return major, minor

def arch_support(capability: tuple[int, int], arch_list: list[str]) -> str | None:
    """How this build runs on a GPU of ``capability``: ``native`` (a cubin it can run: same major,
    minor not above the GPU's), ``ptx`` (only by JIT-compiling PTX of an older arch), ``none`` (the
    cause of "no kernel image is available"), or None when the build lists nothing (CPU build)."""
    major, minor = capability
    parsed = [p for p in (parse_arch(a) for a in arch_list) if p]
    if not parsed:
        return None
    for kind, number, suffix in parsed:
        arch_major, arch_minor = _split(number)
        if kind == "sm" and arch_major == major and (arch_minor == minor if suffix else arch_minor <= minor):
            return "native"
    if any(kind == "compute" and _split(number) <= (major, minor) for kind, number, _ in parsed):
        return "ptx"
    return "none"

def install_hint(capability: tuple[int, int]) -> str:
    """What to install for a GPU of this capability."""
    sm = f"sm_{capability[0]}{capability[1]}"
    if capability < (5, 0):
        return (f"current PyTorch builds no longer ship kernels for {sm}; use an older PyTorch release whose "
                "torch.cuda.get_arch_list() lists it, or a newer GPU")
    wheel = WHEEL_FOR_MAJOR.get(capability[0], DEFAULT_WHEEL)
    return (f"install a PyTorch build with {sm} kernels: the {wheel} wheel from PyTorch's own wheel index "
            "(see PyTorch's install page), then check torch.cuda.get_arch_list()")

def parse_driver_version(text: str | None) -> str | None:
    """The version in ``/proc/driver/nvidia/version`` ("... Kernel Module  550.54.15 ...")."""
    match = re.search(r"Kernel Module(?: for [\w-]+)?\s+(\d+\.\d+(?:\.\d+)?)", text or "")
    return match.group(1) if match else None

def driver_version(version_file: str = "/proc/driver/nvidia/version") -> str | None:
    """The NVIDIA driver version from the kernel module, else from nvidia-smi; None without a driver."""
    found = parse_driver_version(read_text(version_file))
    if found or not shutil.which("nvidia-smi"):
        return found
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None

class GpuFacts(TypedDict):
    """One visible GPU."""

    index: int
    name: str
    capability: str
    sm: str
    memory_bytes: int

class TorchFacts(TypedDict):
    """The PyTorch build and what it sees."""

    version: str
    cuda_build: str | None
    hip_build: str | None
    cuda_available: bool
    driver_version: str | None
    cudnn_version: int | None
    arch_list: list[str]
    devices: list[GpuFacts]
    kernels: str | None

def torch_facts(version_file: str = "/proc/driver/nvidia/version") -> TorchFacts:
    """Read the PyTorch build, its CUDA runtime and the GPUs it sees (without changing anything)."""
    import torch

    available = bool(torch.cuda.is_available())
    devices: list[GpuFacts] = []
    for i in range(torch.cuda.device_count() if available else 0):
        props = torch.cuda.get_device_properties(i)
        devices.append({"index": i, "name": props.name, "capability": f"{props.major}.{props.minor}",
                        "sm": f"sm_{props.major}{props.minor}", "memory_bytes": int(props.total_memory)})
    arch_list = list(torch.cuda.get_arch_list()) if available else []
    kernels = None
    if devices and torch.version.hip is None:
        major, minor = (int(x) for x in devices[0]["capability"].split("."))
        kernels = arch_support((major, minor), arch_list)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"version": torch.__version__, "cuda_build": torch.version.cuda, "hip_build": torch.version.hip,
            "cuda_available": available, "driver_version": driver_version(version_file),
            "cudnn_version": cudnn, "arch_list": arch_list, "devices": devices, "kernels": kernels}

def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text))

def gpu_checks(facts: TorchFacts) -> list[Check]:
    """The PyTorch build against the GPU and driver actually here."""
    build = f"PyTorch {facts['version']}" + (f" (CUDA {facts['cuda_build']})" if facts["cuda_build"] else
                                             f" (ROCm {facts['hip_build']})" if facts["hip_build"] else
                                             " (CPU-only build)")
    if not facts["cuda_available"]:
        return [_no_gpu_check(facts, build)]
    checks = [check("gpu", "ok", f"{build}; " + "; ".join(
        f"GPU {d['index']}: {d['name']}, compute capability {d['capability']} ({d['sm']}), "
        f"{human_bytes(d['memory_bytes'])}" for d in facts["devices"]) + f"; driver {facts['driver_version'] or '?'}")]
    checks += _kernel_checks(facts)
    checks += _driver_checks(facts)
    return checks

def _no_gpu_check(facts: TorchFacts, build: str) -> Check:
    driver = facts["driver_version"]
    if not driver:
        return check("gpu", "info", f"{build}, no GPU here (no NVIDIA driver found): the training step is "
                     "emulated (a wait of the step time) and GPU-specific checks are skipped",
                     None if not facts["cuda_build"] else
                     "if this machine has a GPU: in a container, start it with --gpus all")
    if not facts["cuda_build"] and not facts["hip_build"]:
        return check("gpu", "warn", f"{build}, but an NVIDIA driver ({driver}) is installed: this PyTorch "
                     "cannot use the GPU", f"install a CUDA build of PyTorch (for example the {DEFAULT_WHEEL} "
                     "wheel from PyTorch's own wheel index; see PyTorch's install page)")
    return check("gpu", "warn", f"{build} and NVIDIA driver {driver}, but no GPU is available to PyTorch",
                 "check nvidia-smi; make sure CUDA_VISIBLE_DEVICES is not empty; in a container start it with "
                 "--gpus all; the driver must be new enough for this CUDA runtime")

def _kernel_checks(facts: TorchFacts) -> list[Check]:
    if facts["hip_build"] or not facts["devices"]:
        return []
    device = facts["devices"][0]
    capability = tuple(int(x) for x in device["capability"].split("."))
    archs = " ".join(facts["arch_list"]) or "none"
    if facts["kernels"] == "native":
        return [check("gpu_kernels", "ok", f"this build has kernels for {device['sm']} (built for: {archs})")]
    if facts["kernels"] == "ptx":
        return [check("gpu_kernels", "warn", f"no {device['sm']} kernels in this build (built for: {archs}); "
                      "they are JIT-compiled from PTX: slow first start, possibly slower kernels",
                      install_hint((capability[0], capability[1])))]
    return [check("gpu_kernels", "warn", f"this build has no kernels for {device['sm']} (built for: {archs}): "
                  "CUDA calls fail with 'no kernel image is available for execution on the device'",
                  install_hint((capability[0], capability[1])))]

def _driver_checks(facts: TorchFacts) -> list[Check]:
    driver, runtime = facts["driver_version"], facts["cuda_build"]
    if not driver or not runtime:
        return []
    needed = MIN_DRIVER.get(_version_tuple(runtime)[0])
    if needed and _version_tuple(driver) < needed:
        return [check("driver", "warn", f"driver {driver} is older than CUDA {runtime} needs "
                      f"({'.'.join(map(str, needed))} or newer)",
                      "update the NVIDIA driver, or install a PyTorch build for an older CUDA")]
    return [check("driver", "ok", f"driver {driver} runs CUDA {runtime}")]

def settings_facts() -> dict[str, Any]:
    """Training settings that change speed a lot (read, never changed)."""
    import torch

    return {"cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32)}

def settings_checks(settings: dict[str, Any], capability: tuple[int, int] | None) -> list[Check]:
    """Recommendations for cudnn.benchmark, TF32 and mixed precision (nothing is changed)."""
    on_gpu = "" if capability else " (applies on a GPU; none here)"
    checks = [check("cudnn_benchmark", "ok" if settings["cudnn_benchmark"] else "info",
                    f"torch.backends.cudnn.benchmark = {settings['cudnn_benchmark']}{on_gpu}",
                    None if settings["cudnn_benchmark"] else
                    "set torch.backends.cudnn.benchmark = True when input sizes are fixed")]
    precision = settings["float32_matmul_precision"]
    if capability is None or capability >= (8, 0):
        tf32 = precision != "highest"
        checks.append(check("tf32", "ok" if tf32 else "info", f"float32 matmul precision {precision!r}"
                            + ("" if tf32 else ": TF32 tensor cores unused for float32 matmuls") + on_gpu,
                            None if tf32 else "torch.set_float32_matmul_precision('high') (Ampere or newer)"))
    if capability is None or capability >= (8, 0):
        amp = "torch.autocast('cuda', dtype=torch.bfloat16) around the forward pass"
    elif capability >= (7, 0):
        amp = "torch.autocast('cuda', dtype=torch.float16) with torch.amp.GradScaler"
    else:
        amp = "none: this GPU has no tensor cores"
    checks.append(check("mixed_precision", "info", f"mixed precision: recommended {amp}{on_gpu}"))
    return checks
