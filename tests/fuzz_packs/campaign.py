"""The campaign: the cases of every base pack, the jobs planned from them (``full``, the CI
subset ``quick``, or ``asan``), each mutated pack written and probed, and the report."""

from __future__ import annotations

import contextlib
import shutil
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.fuzz_packs.cases import (
    GROUPS,
    Case,
    Plan,
    index_entry_cases,
    index_header_cases,
    record_header_cases,
    record_path_cases,
    shard_header_cases,
)
from tests.fuzz_packs.manifest_cases import manifest_cases
from tests.fuzz_packs.model import BACKENDS, Model, make_bases
from tests.fuzz_packs.read_paths import CLI_COMMANDS, PROBE_TIMEOUT, READ_PATHS, UNSEALED_PATHS
from tests.fuzz_packs.server import ProbeServer

BIG_MANIFEST_FULL = 300 << 20  # the manifest a reader must refuse by its size alone
BIG_MANIFEST_QUICK = 8 << 20  # the same, scaled down for CI


def build_cases(model: Model, payload: str, big: int) -> list[Case]:
    """Every case for one intact base pack."""
    plan = Plan.of(model)
    cases = index_header_cases(plan) + index_entry_cases(plan, payload) + record_header_cases(plan)
    cases += record_path_cases(plan)
    if model.backend == "shards":
        cases += shard_header_cases(plan)
    return cases + manifest_cases(plan, big)


@dataclass(frozen=True)
class Job:
    """One mutated pack and the read paths to probe it with."""

    case: Case
    backend: str
    payload: str
    recompute: bool
    paths: tuple[str, ...]

    @property
    def label(self) -> str:
        checks = ("recomputed" if self.recompute else "not recomputed") if self.case.sealed else "n/a"
        return f"{self.case.name} [{self.backend}, {self.payload}, checksums {checks}]"


def applicable(path: str, payload: str) -> bool:
    return not READ_PATHS[path].get("raw_only") or payload == "raw"


class _Rotation:
    """Hands out read paths from pools in turn, so a subset of cases still covers every path."""

    def __init__(self, pools: list[list[str]]) -> None:
        self.pools = pools
        self.turn = [0] * len(pools)

    def take(self, payload: str) -> tuple[str, ...]:
        out = []
        for k, pool in enumerate(self.pools):
            for _ in range(len(pool)):
                path = pool[self.turn[k] % len(pool)]
                self.turn[k] += 1
                if applicable(path, payload):
                    out.append(path)
                    break
        return tuple(out)


QUICK_POOLS = [
    [p for p in READ_PATHS if READ_PATHS[p]["kind"] in ("item", "items")][::2],
    [p for p in READ_PATHS if READ_PATHS[p]["kind"] in ("item", "items")][1::2],
    ["PackLoader crop", "PackLoader one size", "PackLoader crop, torch resize", "DataLoader numpy workers=2",
     "PackLoader one size verify=True", "PackLoader crop"],
    list(CLI_COMMANDS),
]


def plan_jobs(cases: dict[tuple[str, str], list[Case]], mode: str) -> list[Job]:
    """The jobs of a campaign. ``full``: every case on every base pack with every read path (and,
    without recomputed checksums, with ``UNSEALED_PATHS``). ``quick``: the cases marked for CI, each
    field on both backends, its values alternating between the payloads, four read paths each in
    turn; without recomputed checksums one value per field. ``asan``: index-entry cases with the
    PackLoader crop."""
    jobs: list[Job] = []
    if mode == "full":
        for (backend, payload), mine in cases.items():
            for case in mine:
                paths = case.paths or tuple(p for p in READ_PATHS if applicable(p, payload))
                jobs.append(Job(case, backend, payload, True, paths))
                if case.sealed:
                    unsealed = tuple(p for p in UNSEALED_PATHS if p in paths)
                    jobs.append(Job(case, backend, payload, False, unsealed))
        return jobs
    if mode == "asan":
        return [Job(case, backend, payload, True, ("PackLoader crop",))
                for (backend, payload), mine in cases.items()
                for case in mine if case.group == "index entry" and case.quick]
    rotation = _Rotation(QUICK_POOLS)
    chosen: dict[tuple[str, str], list[str]] = {}  # (group, field) -> its CI values, in order
    where: dict[tuple[str, str, str], list[str]] = {}  # (group, field, value) -> payloads that have it
    for (_, payload), mine in cases.items():
        for case in mine:
            if case.quick:
                values = chosen.setdefault((case.group, case.field), [])
                if case.value not in values:
                    values.append(case.value)
                having = where.setdefault((case.group, case.field, case.value), [])
                if payload not in having:
                    having.append(payload)
    for f_index, ((group, name), values) in enumerate(chosen.items()):
        for v_index, value in enumerate(values[:2]):
            for b_index, backend in enumerate(BACKENDS):
                having = where[(group, name, value)]
                payload = having[(f_index + v_index + b_index) % len(having)]
                case = next((c for c in cases.get((backend, payload), ())
                             if (c.group, c.field, c.value) == (group, name, value)), None)
                if case is None:  # a shard header: shards only
                    continue
                jobs.append(Job(case, backend, payload, True, case.paths or rotation.take(payload)))
                if case.sealed and v_index == 0 and b_index == f_index % 2:
                    jobs.append(Job(case, backend, payload, False, (UNSEALED_PATHS[f_index % 3], "verify")))
    return jobs


def fuzz_fields(workdir: Path, mode: str = "quick", big_manifest: int | None = None,
                timeout: float = PROBE_TIMEOUT, asan_library: Path | None = None,
                log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run a campaign (``quick``, ``full`` or ``asan``, see ``plan_jobs``) in ``workdir``. Returns the
    counts (cases per field class, packs, probes, outcomes) and every failure (one dict per probe
    finding: case, backend, payload, checksums recomputed or not, read path, kind, cause, detail)."""
    started = time.perf_counter()
    big = big_manifest or (BIG_MANIFEST_FULL if mode == "full" else BIG_MANIFEST_QUICK)
    workdir.mkdir(parents=True, exist_ok=True)
    bases = make_bases(workdir / "bases")
    models = {key: Model.load(path) for key, path in bases.items()}
    cases = {key: build_cases(model, key[1], big) for key, model in models.items()}
    jobs = plan_jobs(cases, mode)
    result: dict[str, Any] = {"mode": mode, "big_manifest": big, "cases": _case_counts(cases, jobs),
                              "packs": 0, "duplicates": 0, "probes": 0, "outcomes": {}, "failures": [],
                              "control": [], "notes": [], "coverage": {}, "paths": {}}
    main_mode = f"asan:{asan_library}" if mode == "asan" else "kernel"
    with contextlib.ExitStack() as stack:
        servers = {"main": ProbeServer(main_mode, workdir / "server-main.log", timeout=timeout)}
        if mode != "asan":
            servers["torch"] = ProbeServer("torch", workdir / "server-torch.log", timeout=timeout)
        for server in servers.values():
            stack.enter_context(server)
        result["kernel"] = servers["main"].info.get("kernel")
        runner = _Runner(servers, workdir, big // 2, result)
        for (backend, payload), path in bases.items():  # the intact packs: every path must read them cleanly
            control = Case("control", "intact pack", "-", lambda m, r: None, sealed=False)
            paths = tuple(p for p in READ_PATHS if applicable(p, payload) and (mode != "asan" or p in (
                "PackLoader crop",)))
            runner.probe_pack(Job(control, backend, payload, True, paths), path, control=True)
        digests = {key: model.digest() for key, model in models.items()}
        seen: set[str] = set()
        for k, job in enumerate(jobs):
            model = models[(job.backend, job.payload)].copy()
            try:
                job.case.apply(model, job.recompute)
            except Exception:  # noqa: BLE001 - a bug of this harness: reported, the campaign goes on
                runner.harness_error(job, traceback.format_exc())
                continue
            digest = model.digest()
            if digest == digests[(job.backend, job.payload)] or (digest, job.paths) in seen:
                result["duplicates"] += 1
                continue
            seen.add((digest, job.paths))
            place = workdir / "cases" / f"{k}"
            pack = model.write(place / f"pack.{job.backend}")
            runner.probe_pack(job, pack)
            shutil.rmtree(place, ignore_errors=True)
            if log and (k + 1) % 200 == 0:
                log(f"  {k + 1}/{len(jobs)} packs, {len(result['failures'])} failures, "
                    f"{time.perf_counter() - started:.0f} s")
        result["worker_deaths"] = {name: server.deaths for name, server in servers.items()}
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["problems"] = [f"{f['case']}: {f['path']}: {f['kind']}: {f['cause']}" for f in result["failures"]]
    return result


class _Runner:
    """Probes one pack with each of its job's read paths and records outcomes and failures."""

    def __init__(self, servers: dict[str, ProbeServer], workdir: Path, manifest_limit: int,
                 result: dict[str, Any]) -> None:
        self.servers, self.workdir, self.limit, self.result = servers, workdir, manifest_limit, result

    def probe_pack(self, job: Job, pack: Path, control: bool = False) -> None:
        self.result["packs"] += 1
        for server in self.servers.values():
            server.recycle()
        fields = self.result["coverage"].setdefault(job.case.group, {})
        backends = fields.setdefault(job.case.field, [])
        if job.backend not in backends:
            backends.append(job.backend)
        scratch = pack.parent / "scratch"
        for path in job.paths:
            server = self.servers.get(READ_PATHS[path].get("server", "main"), self.servers["main"])
            scratch.mkdir(parents=True, exist_ok=True)
            answer = server.ask({"pack": str(pack), "path": path, "scratch": str(scratch),
                                 "manifest_limit": self.limit})
            shutil.rmtree(scratch, ignore_errors=True)
            self._record(job, path, answer, control)

    def harness_error(self, job: Job, trace: str) -> None:
        finding = {"kind": "harness", "cause": "the fuzz harness could not make the case",
                   "detail": trace[-600:]}
        self._record(job, "-", {"outcome": "harness error", "refused": [], "findings": [finding]}, False)

    def _record(self, job: Job, path: str, answer: dict[str, Any], control: bool) -> None:
        result = self.result
        result["probes"] += 1
        if not control and path in READ_PATHS:
            result["paths"][path] = result["paths"].get(path, 0) + 1
        if "died" in answer or "hang" in answer:
            kind = "signal" if "died" in answer else "hang"
            findings = [{"kind": kind, "cause": f"the worker died ({answer['died']})" if kind == "signal"
                         else f"no answer within {answer['hang']:.0f} s", "detail": answer.get("log", "")}]
            outcome = kind
        else:
            findings, outcome = answer["findings"], answer["outcome"]
            if outcome == "refused" and answer.get("valid") and not control:
                result["notes"].append({"case": job.case.name, "backend": job.backend, "payload": job.payload,
                                        "path": path, "refused though the reference finds it valid":
                                            answer["refused"]})
            if control and outcome != "ok":
                findings = findings or [{"kind": "control", "cause": "refused an intact pack",
                                         "detail": "; ".join(answer["refused"])}]
        counts = result["outcomes"].setdefault(job.case.group, {})
        counts[outcome] = counts.get(outcome, 0) + 1
        for finding in findings:
            checks = ("recomputed" if job.recompute else "not recomputed") if job.case.sealed else "n/a"
            entry = {"case": job.case.name, "group": job.case.group, "field": job.case.field,
                     "value": job.case.value, "backend": job.backend, "payload": job.payload,
                     "checksums": checks, "path": path, **finding}
            (result["control"] if control else result["failures"]).append(entry)


def _case_counts(cases: dict[tuple[str, str], list[Case]], jobs: list[Job]) -> dict[str, dict[str, int]]:
    """Per field class: distinct cases (field and value), fields, and mutated packs planned."""
    out: dict[str, dict[str, int]] = {}
    for group in GROUPS:
        distinct = {(c.field, c.value) for mine in cases.values() for c in mine if c.group == group}
        out[group] = {"cases": len(distinct), "fields": len({f for f, _ in distinct}),
                      "packs": sum(1 for j in jobs if j.case.group == group),
                      "probes": sum(len(j.paths) for j in jobs if j.case.group == group)}
    return out


def failure_report(result: dict[str, Any], limit: int = 12) -> list[str]:
    """The failures grouped by cause (kind and cause), each with the cases that showed it."""
    groups: dict[tuple[str, str], list[dict[str, str]]] = {}
    for failure in result["control"] + result["failures"]:
        groups.setdefault((failure["kind"], failure["cause"]), []).append(failure)
    lines = []
    for (kind, cause), failures in sorted(groups.items(), key=lambda item: (item[0][0], -len(item[1]))):
        lines.append(f"[{kind}] {cause}: {len(failures)} probe(s)")
        for f in failures[:limit]:
            lines.append(f"    {f['case']} [{f['backend']}, {f['payload']}, checksums {f['checksums']}] "
                         f"{f['path']}: {f['detail'][:200]}".rstrip())
        if len(failures) > limit:
            lines.append(f"    ... and {len(failures) - limit} more")
    return lines
