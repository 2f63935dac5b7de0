"""``packload doctor [PATH]``: is slow training really the GPU's fault?

Checks this machine (PyTorch build against the GPU, usable CPUs, memory and cgroup limits,
``/dev/shm``, training settings) and, given a dataset (an image folder or a pack), its storage and
where the input pipeline stalls (``packload.diagnose.stall``). ``doctor()`` returns a JSON-serialisable dict
whose layout ``REPORT_SCHEMA`` documents (a JSON Schema; ``schema_errors`` checks a report against
it); ``format_report`` turns it into lines for the terminal. A diagnosis, not a test: whatever it
finds, the command exits 0.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TypedDict

from packload.core.display import pack_phrase, plural
from packload.core.errors import UsageError
from packload.core.scan import scan_folder
from packload.core.version import __version__
from packload.diagnose.checks import Check, check, human_bytes
from packload.diagnose.gpu_step import DummyStep
from packload.diagnose.machine import SystemPaths, collect_machine, small_files_check
from packload.diagnose.software import fast_hint
from packload.diagnose.stall import (
    StallReport,
    folder_plan,
    is_pack,
    measure_stall,
    pack_plan,
    samples_to_read,
)
from packload.diagnose.training_loop import DEFAULT_STEP_MS, DEFAULT_SYNC, assumed, resolve_step
from packload.loaders.verify import info

SCHEMA_VERSION = 1
DEFAULT_MAX_BATCHES = 20

_NUM, _STR, _BOOL, _INT = {"type": "number"}, {"type": "string"}, {"type": "boolean"}, {"type": "integer"}


def _obj(properties: dict[str, Any], nullable: bool = False) -> dict[str, Any]:
    """A JSON Schema object whose every listed property is required."""
    return {"type": ["object", "null"] if nullable else "object", "properties": properties,
            "required": list(properties)}


def _maybe(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` or null."""
    kind = schema["type"]
    return {**schema, "type": [*(kind if isinstance(kind, list) else [kind]), "null"]}


_CHECK = _obj({"name": _STR, "status": {"type": "string", "enum": ["ok", "warn", "info"]}, "message": _STR,
               "fix": _maybe(_STR)})
_RATE = _obj({"samples_per_s": _NUM, "ms_per_batch": _NUM, "first_batch_s": _NUM, "samples": _INT,
              "gpu_wait_ms_per_step": _NUM, "gpu_wait_share_of_step": _NUM})
_GPU = _obj({"index": _INT, "name": _STR, "capability": _STR, "sm": _STR, "memory_bytes": _INT})

# The layout of ``doctor()``'s result and of ``packload doctor --json``. Keys are only ever added
# (with SCHEMA_VERSION raised when a meaning changes). Sizes are bytes, rates samples per second,
# shares fractions in [0, 1].
REPORT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "packload doctor report",
    **_obj({
        "schema_version": {"type": "integer", "enum": [SCHEMA_VERSION]},
        "packload_version": _STR,
        "path": _maybe(_STR),
        "dataset": _obj({"kind": {"type": "string", "enum": ["folder", "pack"]}, "path": _STR, "samples": _INT,
                         "classes": _INT, "bytes": _INT, "files": _maybe(_INT), "mean_file_bytes": _maybe(_NUM),
                         "backend": _maybe(_STR), "encoding": _maybe(_STR)}, nullable=True),
        "machine": _obj({
            "torch": _obj({"version": _STR, "cuda_build": _maybe(_STR), "hip_build": _maybe(_STR),
                           "cuda_available": _BOOL, "driver_version": _maybe(_STR), "cudnn_version": _maybe(_INT),
                           "arch_list": {"type": "array", "items": _STR},
                           "devices": {"type": "array", "items": _GPU},
                           "kernels": {"type": ["string", "null"], "enum": ["native", "ptx", "none", None]}}),
            "cpu": _obj({"logical": _INT, "physical": _maybe(_INT), "affinity": _INT, "cgroup_quota": _maybe(_NUM),
                         "usable": _NUM, "workers_range": {"type": "array", "items": _INT},
                         "load_average": {"type": ["array", "null"], "items": _NUM}}),
            "memory": _obj({"total_bytes": _maybe(_INT), "available_bytes": _maybe(_INT),
                            "cgroup_limit_bytes": _maybe(_INT), "cgroup_version": _INT}),
            "shm": _obj({"path": _STR, "total_bytes": _maybe(_INT), "free_bytes": _maybe(_INT)}),
            "storage": _obj({"path": _STR, "mount_point": _maybe(_STR), "fstype": _maybe(_STR), "source": _maybe(_STR),
                             "network": _BOOL, "fuse": _BOOL, "disk": _maybe(_STR), "rotational": _maybe(_BOOL)},
                            nullable=True),
            "settings": _obj({"cudnn_benchmark": _BOOL, "float32_matmul_precision": _STR, "cudnn_allow_tf32": _BOOL}),
        }),
        "checks": {"type": "array", "items": _CHECK},
        "stall": _obj({
            "batch_size": _INT, "workers": _INT, "max_batches": _INT, "repeats": _INT,
            "step": _obj({"description": _STR, "on_gpu": _BOOL, "samples_per_s": _NUM, "ms_per_batch": _NUM}),
            "prepare": _RATE, "fetch": _maybe(_RATE),
            "eviction": _obj({"files": _INT, "failed": _INT, "cached_before": _maybe(_NUM),
                              "cached_after": _maybe(_NUM), "verified": _maybe(_BOOL)}, nullable=True),
            "shares": _obj({"gpu_busy": _NUM, "prep_stall": _NUM, "fetch_stall": _NUM}),
            "bottleneck": {"type": "string", "enum": ["storage", "cpu_preparation", "gpu"]},
            "notes": {"type": "array", "items": _STR},
        }, nullable=True),
        "verdict": _STR,
        "seconds": _NUM,
    }),
}

_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict), "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool), "null": lambda v: v is None,
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
}


def schema_errors(value: Any, schema: dict[str, Any] = REPORT_SCHEMA, where: str = "report") -> list[str]:
    """Where ``value`` departs from ``schema`` (the JSON Schema subset used here: type, enum,
    properties, required, items); an empty list when it conforms."""
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if kinds and not any(_JSON_TYPES[k](value) for k in kinds):
        return [f"{where}: expected {' or '.join(kinds)}, got {type(value).__name__} {value!r:.60}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{where}: {value!r} is not one of {schema['enum']}"]
    errors: list[str] = []
    if isinstance(value, dict):
        errors += [f"{where}: missing {key!r}" for key in schema.get("required", []) if key not in value]
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                errors += schema_errors(value[key], sub, f"{where}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += schema_errors(item, schema["items"], f"{where}[{i}]")
    return errors


# -- the dataset -----------------------------------------------------------------------------------
class DatasetFacts(TypedDict):
    """What was given: a ``folder`` (files counted and sized) or a ``pack`` (backend and encoding)."""

    kind: str
    path: str
    samples: int
    classes: int
    bytes: int
    files: int | None
    mean_file_bytes: float | None
    backend: str | None
    encoding: str | None


def dataset_facts(path: str, many_files: int = 10_000,
                  small_file_bytes: int = 200_000) -> tuple[DatasetFacts, list[Check]]:
    """What the dataset at ``path`` holds (a pack, or an image folder whose files are counted and sized)."""
    if is_pack(path):
        about = info(path)
        pack_facts = DatasetFacts(kind="pack", path=about["path"], samples=about["records"],
                                  classes=len(about["classes"]), bytes=about["pack_bytes"], files=None,
                                  mean_file_bytes=None, backend=about["backend"], encoding=about["encoding"])
        return pack_facts, [check("dataset", "ok", f"{pack_phrase(about['backend'])} ({about['encoding']}): "
                                  f"{plural(about['records'], 'image')}, {plural(len(about['classes']), 'class')}, "
                                  f"{human_bytes(about['pack_bytes'])}")]
    scan = scan_folder(path)
    sizes = [os.stat(scan.root / sample.path).st_size for sample in scan.samples]
    total = sum(sizes)
    facts = DatasetFacts(kind="folder", path=str(scan.root), samples=len(sizes), classes=len(scan.classes),
                         bytes=total, files=len(sizes), mean_file_bytes=total / len(sizes), backend=None,
                         encoding=None)
    return facts, [check("dataset", "info", f"an image folder: {plural(len(sizes), 'image')}, "
                                            f"{plural(len(scan.classes), 'class')}"),
                   small_files_check(len(sizes), total, many_files, small_file_bytes)]


# -- the verdict -----------------------------------------------------------------------------------
_FIXES = {
    "storage": "pack the dataset (`pack SRC DEST.shards`: big sequential reads), copy it to a local SSD, or "
               "add workers (waiting on I/O needs threads, not cores)",
    "storage_pack": "copy the pack to a local SSD (or keep it in the page cache: enough RAM for it), or add "
                    "workers (waiting on I/O needs threads, not cores)",
    "cpu_preparation": "more CPU cores per GPU or workers up to the usable CPUs; decode at reduced size "
                       "(PackedImageFolder decode_size=); pack once at training resolution (pack --encoding "
                       "raw --size HxW or --max-side); move augmentation to the GPU",
    "gpu": "the input pipeline keeps up: speed up the step itself (mixed precision, channels_last, "
           "torch.compile, a larger batch)",
}
_NAMES = {"storage": "storage (fetching files)", "cpu_preparation": "CPU preparation (decode and transforms)",
          "gpu": "the GPU itself"}


def broken_files_check(skipped: list[dict[str, str]], shown: int = 5) -> Check:
    """The files of a folder that were left out of the measurement as ``pack`` would skip them."""
    names = "; ".join(f"{item['path']} ({item['reason']})" for item in skipped[:shown])
    more = f"; and {len(skipped) - shown} more" if len(skipped) > shown else ""
    return check("broken_files", "warn", f"{plural(len(skipped), 'broken file')} among those measured, left out as pack "
                 f"would skip them: {names}{more}",
                 "fix or remove them; `pack` skips them too and lists them (`packload info`)")


def stall_checks(stall: StallReport, kind: str = "folder") -> list[Check]:
    """The stall analysis as check lines: the bottleneck with its fix (for a ``folder`` or a ``pack``),
    and a failed eviction."""
    shares, name = stall["shares"], stall["bottleneck"]
    fix = _FIXES["storage_pack" if name == "storage" and kind == "pack" else name]
    if name == "cpu_preparation":
        fix += fast_hint()
    waits = shares["prep_stall"] + shares["fetch_stall"]
    checks = [check("bottleneck", "ok" if name == "gpu" else "warn",
                    f"bottleneck: {_NAMES[name]}; the GPU would wait {waits:.0%} of the time "
                    f"({shares['prep_stall']:.0%} for preparation, {shares['fetch_stall']:.0%} for storage)",
                    None if name == "gpu" else fix)]
    low, high = sorted((shares["prep_stall"], shares["fetch_stall"]))
    if name != "gpu" and low >= 0.05 and high < 1.5 * low:
        checks[0]["message"] += ("; storage and preparation stall about equally (the name may flip between "
                                 "runs): fixing one leaves the other")
    eviction = stall["eviction"]
    if eviction is not None and eviction["verified"] is False:
        checks.append(check("eviction", "warn", f"the page cache could not be emptied ({eviction['cached_after']:.0%} "
                             "still cached): the storage figures are optimistic",
                             "measure on a real disk (not tmpfs), with no other process mapping the files"))
    return checks


def verdict(stall: StallReport | None, checks: list[Check], dataset_given: bool = False, assumed: str = "") -> str:
    """The one-line answer (``dataset_given``: a dataset was checked but not measured, --no-measure),
    with what the measurement ``assumed`` of the training step."""
    warnings = sum(c["status"] == "warn" for c in checks)
    tail = (f" {assumed}." if assumed and stall is not None else "") + (f" {plural(warnings, 'warning')} above." if warnings else "")
    if stall is None and dataset_given:
        return ("Machine and dataset checks only (--no-measure): run without --no-measure to measure where "
                "the input stalls." + tail)
    if stall is None:
        return "Machine checks only: give a dataset (image folder or pack) to measure where the input stalls." + tail
    shares, name = stall["shares"], stall["bottleneck"]
    if name == "gpu":
        return (f"The GPU is the limit: the input pipeline keeps up (the GPU would wait "
                f"{shares['prep_stall'] + shares['fetch_stall']:.0%} of the time)." + tail)
    return (f"Not the GPU's fault: it would sit idle {1 - shares['gpu_busy']:.0%} of the time, mostly waiting for "
            f"{_NAMES[name]} (the fix is under Stall analysis)." + tail)


# -- the whole diagnosis ---------------------------------------------------------------------------
def _log(progress: bool) -> Callable[[str], None]:
    return (lambda text: print(f"doctor: {text}", file=sys.stderr, flush=True)) if progress else (lambda _: None)


def _warm_budget(memory: dict[str, Any]) -> int | None:
    """Half the memory the page cache may use: datasets larger than that are warmed by a pass instead."""
    known = [v for v in (memory["available_bytes"], memory["cgroup_limit_bytes"]) if v is not None]
    return min(known) // 2 if known else None


def doctor(path: str | None = None, *, batch_size: int = 64, step_ms: float | None = None, model: str | None = None,
           workers: int | None = None, max_batches: int = DEFAULT_MAX_BATCHES, repeats: int = 2,
           crop: int = 224, measure: bool = True, many_files: int = 10_000, small_file_bytes: int = 200_000,
           paths: SystemPaths | None = None, progress: bool = True) -> dict[str, Any]:
    """Diagnose this machine and, given ``path`` (an image folder or a pack), where its input pipeline stalls.

    ``step_ms`` is the GPU time of one training step (emulated by a calibrated GPU loop, or a wait
    without CUDA); ``model="small-cnn"`` runs a real CNN step instead (CUDA only). ``workers``
    defaults to the usable CPUs; each loader pass reads ``max_batches`` batches of ``batch_size``
    (plus one untimed), and each figure is the best of ``repeats`` passes. ``measure=False`` skips
    the stall analysis. ``many_files``/``small_file_bytes`` set when a folder counts as "many small
    files". Raises UsageError for a bad path or option; otherwise returns the report (see
    ``REPORT_SCHEMA``), whatever it finds.
    """
    resolved, step_given = resolve_step(step_ms, model)
    step_ms = DEFAULT_STEP_MS if resolved is None else resolved
    _check_options(path, batch_size, step_ms, workers, max_batches, repeats, crop)
    started, say = time.perf_counter(), _log(progress)
    facts: DatasetFacts | None = None
    dataset_checks: list[Check] = []
    if path is not None:
        facts, dataset_checks = dataset_facts(path, many_files, small_file_bytes)
    say("checking the machine")
    machine, machine_checks = collect_machine(path, facts["bytes"] if facts else None, paths)
    checks = _ordered(machine_checks, dataset_checks)
    stall: StallReport | None = None
    workers = workers if workers is not None else int(machine["cpu"]["workers_range"][1])
    if path is not None and facts is not None and measure:  # (facts is set exactly when path is)
        count = samples_to_read(batch_size, max_batches, facts["samples"])
        plan = pack_plan(path, count, crop) if facts["kind"] == "pack" else folder_plan(path, count, crop)
        if plan.skipped:
            checks = _ordered(machine_checks, [*dataset_checks, broken_files_check(plan.skipped)])
        step = _step(step_ms, model, machine["torch"]["kernels"] != "none")
        step.image_shape = (3, crop, crop)  # what a model step is timed on
        say(f"measuring {plural(count, 'sample')}, batch {batch_size}, {plural(workers, 'worker')}")
        stall = measure_stall(plan, step, batch_size=batch_size, workers=workers, max_batches=max_batches,
                              repeats=repeats, warm_budget=_warm_budget(machine["memory"]), log=say)
        checks += stall_checks(stall, facts["kind"])
    return {"schema_version": SCHEMA_VERSION, "packload_version": __version__, "path": path, "dataset": facts,
            "machine": machine, "checks": checks, "stall": stall,
            "verdict": verdict(stall, checks, path is not None,
                               _assumed(step_ms, step_given, model, batch_size, workers)),
            "seconds": time.perf_counter() - started}


def _assumed(step_ms: float, given: bool, model: str | None, batch_size: int, workers: int) -> str:
    """What the stall analysis took the training step and the loop to be, said in the verdict: the
    same step default and loop model as ``tune`` (``training_loop``)."""
    text = assumed(step_ms, given, model, batch_size, DEFAULT_SYNC)
    loading = (f"with {plural(workers, 'DataLoader worker')} the next batches load while the step runs" if workers
               else "loading in the main process (workers 0) adds to each step")
    return text[:1].upper() + text[1:] + f"; {loading}"


def _step(step_ms: float, model: str | None, gpu_usable: bool) -> DummyStep:
    """The training step to measure against: ``model`` if given, else ``step_ms`` of GPU work (emulated
    when this PyTorch has no kernels for the GPU, where any CUDA call would fail)."""
    try:
        return DummyStep(step_ms=None if model else step_ms, model=model, device=None if gpu_usable else "cpu",
                         sync=DEFAULT_SYNC)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _check_options(path: str | None, batch_size: int, step_ms: float, workers: int | None, max_batches: int,
                   repeats: int, crop: int) -> None:
    if path is not None and not os.path.exists(path):
        raise UsageError(f"{path}: not found; give an image folder or a pack (.lmdb file or shards folder)")
    for name, value, low in (("--batch-size", batch_size, 1), ("--max-batches", max_batches, 1),
                             ("--repeats", repeats, 1), ("--crop", crop, 1),
                             ("--workers", 0 if workers is None else workers, 0)):
        if value < low:
            raise UsageError(f"{name} {value}: give at least {low}")
    if not step_ms > 0:
        raise UsageError(f"--step-ms {step_ms}: give the GPU time of one step in milliseconds (> 0)")


_DATASET_FIRST = ("dataset", "broken_files", "small_files", "page_cache", "filesystem", "disk")
_SETTINGS = ("cudnn_benchmark", "tf32", "mixed_precision")
SECTIONS = {**{name: "Dataset and storage" for name in _DATASET_FIRST}, **{name: "Training settings (recommended, "
            "not changed)" for name in _SETTINGS}, "bottleneck": "Stall analysis", "eviction": "Stall analysis"}


def _ordered(machine_checks: list[Check], dataset_checks: list[Check]) -> list[Check]:
    """Machine checks, then the dataset's and its storage's, then the training settings."""
    every = dataset_checks + machine_checks
    section = [SECTIONS.get(c["name"], "Machine") for c in every]
    order = ("Machine", "Dataset and storage", "Training settings (recommended, not changed)")
    return [c for name in order for c, s in zip(every, section, strict=True) if s == name]


# -- the terminal report ---------------------------------------------------------------------------
def _check_lines(check_: Check) -> list[str]:
    lines = [f"  [{check_['status']:4s}] {check_['message']}"]
    if check_["fix"]:
        lines.append(f"         fix: {check_['fix']}")
    return lines


def _stall_lines(stall: StallReport) -> list[str]:
    step = stall["step"]
    lines = [f"  batch {stall['batch_size']}, {plural(stall['workers'], 'worker')}, "
             f"{plural(stall['max_batches'], 'timed batch', 'timed batches')} "
             f"(best of {stall['repeats']}); "
             f"step: {step['description']}",
             f"  {'':36s}{'samples/s':>10s}{'ms/batch':>10s}   GPU waits per step",
             f"  {'training step alone':36s}{step['samples_per_s']:10,.0f}{step['ms_per_batch']:10.1f}   -"]
    for label, rate in (("loader, data in page cache (prepare)", stall["prepare"]),
                        ("loader, data from storage (fetch)", stall["fetch"])):
        if rate is not None:
            lines.append(f"  {label:36s}{rate['samples_per_s']:10,.0f}{rate['ms_per_batch']:10.1f}   "
                         f"{rate['gpu_wait_ms_per_step']:.1f} ms ({rate['gpu_wait_share_of_step']:.0%} of the step)")
    shares = stall["shares"]
    lines.append(f"  share of training time: GPU busy {shares['gpu_busy']:.0%}, waiting for preparation "
                 f"{shares['prep_stall']:.0%}, waiting for storage {shares['fetch_stall']:.0%}")
    eviction = stall["eviction"]
    if eviction is not None:
        before, after = eviction["cached_before"], eviction["cached_after"]
        lines.append(f"  page cache before the storage pass: {plural(eviction['files'], 'file')} evicted, "
                     + ("cache state unknown" if after is None else
                        f"{after:.0%} of their pages still cached (was {before:.0%})"))
    return lines + [f"  note: {note}" for note in stall["notes"]]


def format_report(report: dict[str, Any]) -> list[str]:
    """The report as lines for the terminal: checks by section, the stall table, the verdict."""
    head = f"packload doctor {report['packload_version']}"
    dataset = report["dataset"]
    if dataset:
        head += (f": {dataset['path']} ({dataset['kind']}, {plural(dataset['samples'], 'image')}, "
                 f"{human_bytes(dataset['bytes'])})")
    lines = [head]
    current = None
    stall_lines = _stall_lines(report["stall"]) if report["stall"] else []
    for item in report["checks"]:
        section = SECTIONS.get(item["name"], "Machine")
        if section != current:
            lines += ["", section]
            if section == "Stall analysis":
                lines += stall_lines
            current = section
        lines += _check_lines(item)
    lines += ["", f"Verdict: {report['verdict']}", f"({report['seconds']:.1f} s)"]
    return lines
