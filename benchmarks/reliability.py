"""The reliability suite at full counts: SIGKILLed packs, killed DataLoader workers, bit flips and
truncations, hostile packs, fuzzing (of the decoders, and of every field of a pack against every read
path), full disks and file-size limits, LMDB map growth, and 16 DataLoader workers over one pack. The
CI tests (tests/reliability/test_reliability_*.py, tests/test_fuzz_pack_fields.py) run the same functions
(tests/reliability/, tests/fuzz_packs/) with small counts; this prints the figures
RELIABILITY.md records, and writes them as JSON with ``--json``.

    python benchmarks/reliability.py [--quick] [--json FILE] [--only kills,corruption,...]
                                     [--fuzz-big-manifest MB]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.reliability.corruption import corruption_campaign  # noqa: E402
from tests.reliability.crafted import copy_pack  # noqa: E402
from tests.reliability.decoder_fuzz import fuzz_decoders  # noqa: E402
from tests.reliability.full_disk import lmdb_map_growth_check, write_limit_check  # noqa: E402
from tests.reliability.hostile import hostile_suite  # noqa: E402
from tests.reliability.kills import kill_and_resume, kill_points, worker_kill_resume  # noqa: E402
from tests.reliability.many_readers import load_check  # noqa: E402
from tests.reliability.object_store import store_suite  # noqa: E402
from tests.reliability.packs import make_source, pack_small  # noqa: E402

SECTIONS = ("kills", "workers", "corruption", "hostile", "fuzz", "disk", "load", "store")
FULL = {"kill_points": 24, "flips": 600, "truncations": 50, "fuzz": 4000, "fuzz_fields": "full",
        "load_workers": 16, "load_epochs": 3, "per_class": 30,
        "store_caches": 40, "store_damages": 200, "store_replacements": 40, "store_faults": 60}
QUICK = {"kill_points": 3, "flips": 24, "truncations": 6, "fuzz": 150, "fuzz_fields": "quick",
         "load_workers": 4, "load_epochs": 2, "per_class": 10,
         "store_caches": 6, "store_damages": 16, "store_replacements": 4, "store_faults": 6}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def timed(name: str, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    started = time.perf_counter()
    log(f"== {name}")
    result = run()
    result["seconds"] = round(time.perf_counter() - started, 1)
    log(f"   {name}: {len(result.get('problems', []))} problem(s) in {result['seconds']} s")
    return result


def kills(work: Path, source: Path, refs: dict[str, Path], counts: dict[str, int]) -> dict[str, Any]:
    from packload import PackReader

    out: dict[str, Any] = {"runs": [], "problems": []}
    for backend, ref in refs.items():
        with PackReader(ref) as reader:
            files = reader.manifest["source"]["files"]
        for k, point in enumerate(kill_points(files, counts["kill_points"], backend)):
            run = kill_and_resume(source, work / f"kill-{k}.{backend}", ref, point)
            out["runs"].append({"backend": backend, "point": point, "killed": run["killed"],
                                "resumed_at": run["resumed_at"], "identical": run["identical"],
                                "problems": run["problems"]})
            out["problems"] += [f"{backend} killed at {point!r}: {p}" for p in run["problems"]]
    return out


def workers(refs: dict[str, Path]) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": [], "problems": []}
    for backend, ref in refs.items():
        for start_method in ("fork", "spawn"):
            for kill_after in (1, 4):
                run = worker_kill_resume(ref, workers=2, batch_size=2, kill_after=kill_after,
                                            start_method=start_method)
                out["runs"].append({"backend": backend, "start_method": start_method, "kill_after": kill_after,
                                    "victim": run["victim"], "error": run["error"], "delivered": run["delivered"],
                                    "expected": run["expected"]})
                out["problems"] += [f"{backend} {start_method}: {p}" for p in run["problems"]]
    return out


def corruption(source: Path, refs: dict[str, Path], work: Path, counts: dict[str, int]) -> dict[str, Any]:
    """Both backends as packed by default (keep), and a raw-pixel shards pack with half the flips."""
    from packload.packer.encode import EncodeOptions

    raw = work / "raw.shards"
    pack_small(source, raw, options=EncodeOptions(encoding="raw", size=(24, 24)))
    out: dict[str, Any] = {"backends": {}, "problems": []}
    packs = [(backend, ref, counts["flips"], counts["truncations"]) for backend, ref in refs.items()]
    packs.append(("shards, raw pixels", raw, counts["flips"] // 2, counts["truncations"] // 2))
    for k, (name, ref, flips, truncations) in enumerate(packs):
        pack = copy_pack(ref, work / f"corrupt-{k}{ref.suffix}")
        result = corruption_campaign(pack, flips, truncations, seed=100 + k, log=log)
        out["backends"][name] = result
        out["problems"] += [f"{name}: {p}" for p in result["problems"]]
    return out


def fuzz(work: Path, counts: dict[str, Any], big_manifest: int | None) -> dict[str, Any]:
    """Hypothesis over the decoders; then hostile packs field by field against every read path
    (``tests/fuzz_packs/``, the whole grid or the CI subset); then the PackLoader crop over hostile
    index entries with the resize kernel built with AddressSanitizer and UBSan, where it builds."""
    from tests.fuzz_packs.campaign import failure_report, fuzz_fields
    from tests.fuzz_packs.server import build_sanitized_kernel

    out = fuzz_decoders(counts["fuzz"], seed=7)
    fields = fuzz_fields(work / "fuzz-fields", counts["fuzz_fields"], big_manifest=big_manifest, log=log)
    library, why = build_sanitized_kernel(work / "fuzz-asan")
    sanitized: dict[str, Any] = {"skipped": why, "problems": []}
    if library is not None:
        sanitized = fuzz_fields(work / "fuzz-sanitized", "asan", asan_library=library)
    out.update(fields=fields, sanitized=sanitized)
    out["problems"] = out["problems"] + fields["problems"] + sanitized["problems"]
    report = failure_report(fields, limit=5) + (failure_report(sanitized, limit=5) if library else [])
    for line in report:
        log("   " + line)
    return out


def disk(work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": [], "problems": []}
    big = make_source(work / "disk-src", per_class=4, big=6)
    for backend in ("lmdb", "shards"):
        ref = work / f"disk-ref.{backend}"
        pack_small(big, ref)
        limits = [("fsize", n) for n in ((100_000, 400_000, 1_000_000) if backend == "lmdb" else (20_000, 40_000))]
        limits += [("tmpfs", n) for n in (150_000, 400_000, 1_000_000)]
        place = work / f"disk-{backend}"
        place.mkdir()
        for kind, limit in limits:
            run = write_limit_check(big, place, ref, backend, kind, limit)
            out["runs"].append({"backend": backend, "kind": kind, "limit": limit,
                                **{k: v for k, v in run.items() if k in ("exit", "error", "skipped")}})
            out["problems"] += [f"{backend} {kind} {limit}: {p}" for p in run.get("problems", [])]
    growth = lmdb_map_growth_check(big, work / "grow.lmdb", work / "disk-ref.lmdb")
    out["map_growth"] = growth
    out["problems"] += growth["problems"]
    return out


def load(refs: dict[str, Path], counts: dict[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": [], "problems": []}
    for backend, ref in refs.items():
        for start_method in ("fork", "spawn"):
            for persistent in (False, True):
                log(f"   {backend} {start_method} persistent={persistent}")
                run = load_check(ref, counts["load_workers"], counts["load_epochs"], persistent, start_method)
                out["runs"].append(run)
                out["problems"] += [f"{backend} {start_method} persistent={persistent}: {p}" for p in run["problems"]]
    return out


def summary(results: dict[str, Any], counts: dict[str, int]) -> list[str]:
    """The figures as Markdown, for RELIABILITY.md."""
    lines = []
    if "kills" in results:
        runs = results["kills"]["runs"]
        for backend in ("lmdb", "shards"):
            mine = [r for r in runs if r["backend"] == backend]
            lines.append(f"- kills, {backend}: {len(mine)} kill points ({sum(isinstance(r['point'], int) for r in mine)} "
                         f"by record count, {sum(isinstance(r['point'], str) for r in mine)} in the finishing phases), "
                         f"{sum(r['killed'] for r in mine)} killed, {sum(r['identical'] for r in mine)} resumed "
                         f"identical, {sum(bool(r['problems']) for r in mine)} with problems")
    if "workers" in results:
        runs = results["workers"]["runs"]
        lines.append(f"- DataLoader worker killed: {len(runs)} runs, the error names the killed worker's pid in "
                     f"{sum(str(r['victim']) in str(r['error']) for r in runs)}, the resumed loader completes the "
                     f"epoch in the same order in {sum(r['delivered'] == r['expected'] for r in runs)}")
    if "corruption" in results:
        for backend, result in results["corruption"]["backends"].items():
            lines.append(f"- corruption, {backend}: {result['flips']} bit flips, {result['truncations']} truncations, "
                         f"{len(result['problems'])} problems, checker restarts {result['checker_starts'] - 1}")
            for kind, outcomes in result["counts"].items():
                lines.append(f"  - {kind}: " + ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items())))
    if "hostile" in results:
        lines.append(f"- hostile packs: {results['hostile']['cases']} crafted cases x 6 commands, "
                     f"{results['hostile']['pack_time_bomb_runs']} packs of decompression bombs, "
                     f"{len(results['hostile']['problems'])} problems")
    if "fuzz" in results:
        fuzzed = results["fuzz"]
        lines.append("- fuzz: " + ", ".join(f"{n} {k} inputs" for k, n in fuzzed["examples"].items())
                     + f", {len(decoder_problems(fuzzed))} problems")
        fields = fuzzed["fields"]
        kinds: dict[str, int] = {}
        for failure in fields["failures"] + fields["control"]:
            kinds[failure["kind"]] = kinds.get(failure["kind"], 0) + 1
        failing = len(fields["failures"]) + len(fields["control"])
        by_kind = f" ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))})" if kinds else ""
        lines.append(f"- hostile fields ({fields['mode']}): "
                     + ", ".join(f"{c['cases']} {group} cases" for group, c in fields["cases"].items())
                     + f"; {fields['packs']} packs, {fields['probes']} probes over "
                     f"{len(fields['paths'])} read paths, {failing} failing probes{by_kind}")
        sanitized = fuzzed["sanitized"]
        if "skipped" in sanitized:
            lines.append(f"- sanitized resize kernel: skipped ({sanitized['skipped']})")
        else:
            failing = len(sanitized["failures"]) + len(sanitized["control"])
            lines.append(f"- sanitized resize kernel (ASan, UBSan): {sanitized['probes']} PackLoader crop "
                         f"probes, {failing} failing")
    if "disk" in results:
        runs = results["disk"]["runs"]
        lines.append(f"- full disk / file-size limit: {sum('skipped' not in r for r in runs)} runs "
                     f"({sum('skipped' in r for r in runs)} skipped), {len(results['disk']['problems'])} problems; "
                     f"LMDB map grew from {results['disk']['map_growth']['start_map']} to "
                     f"{results['disk']['map_growth']['final_map']} bytes")
    if "store" in results:
        lines += store_lines(results["store"])
    if "load" in results:
        for run in results["load"]["runs"]:
            epochs = run["per_epoch"]
            lines.append(f"- load, {run['backend']}, {run['workers']} workers, {run['start_method']}, persistent="
                         f"{run['persistent']}: parent fds {[e['parent_fds'] for e in epochs]}, worker file fds max "
                         f"{[e['worker_fds_max'] for e in epochs]}, worker RSS MB "
                         f"{[e['worker_rss_mb_max'] for e in epochs]}, problems {len(run['problems'])}")
    return lines


def _problems(result: dict[str, Any]) -> int:
    """A check's problems, a read that took past its bound among them (timed here, not by the tests)."""
    return len(result["problems"]) + len(result.get("overruns", []))


def store_lines(store: dict[str, Any]) -> list[str]:
    """The object-store section's figures (``tests.reliability.object_store``)."""
    own, damage, replaced = store["cache_ownership"], store["cache_damage"], store["replaced"]
    dest, stalled, faults, shown = store["destinations"], store["stalls"], store["faults"], store["redaction"]
    slowest = max(case["seconds"] for case in stalled["cases"])
    return [
        f"- store, cache ownership: {own['runs']} cache folders holding {own['user_files']} files of the user's, "
        f"{own['puts']} writes, {own['evictions']} full evictions, {len(own['problems'])} problems",
        f"- store, cache damage: {damage['events']} damaged entries ("
        + ", ".join(f"{n} {k}" for k, n in sorted(damage["by_kind"].items()))
        + f"), {damage['refetched']} fetched again, {len(damage['problems'])} problems",
        f"- store, pack replaced under an open reader: {replaced['runs']} runs, {replaced['served']} records served "
        f"(each the opened pack's), {replaced['refused']} refused as changed, {len(replaced['problems'])} problems",
        f"- store, destinations: {dest['attempts']} --overwrite attempts onto what is not a pack ({dest['refused']} "
        f"refused), {dest['failed_packs']} failing packs over a pack, {len(dest['problems'])} problems",
        f"- store, stalls: {len(stalled['cases'])} cases, each an error; slowest {slowest} s for a "
        f"{stalled['timeout']} s deadline, {_problems(stalled)} problems",
        f"- store, fault fuzz: {faults['trials']} reads, faults " + ", ".join(
            f"{n} {k}" for k, n in sorted(faults["faults"].items()))
        + f"; {faults['whole']} whole, {faults['refused']} refused in one line, slowest {faults['max_seconds']} s, "
        f"{_problems(faults)} problems",
        f"- store, URLs with secrets: {shown['runs']} commands, {len(shown['problems'])} problems",
    ]


def decoder_problems(fuzzed: dict[str, Any]) -> list[str]:
    """The decoder fuzz's own problems (the fuzz section's list holds the field fuzz's too)."""
    others = set(fuzzed["fields"]["problems"]) | set(fuzzed["sanitized"]["problems"])
    return [p for p in fuzzed["problems"] if p not in others]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the CI counts instead of the full ones")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {SECTIONS}")
    parser.add_argument("--json", help="write every figure and problem to this file")
    parser.add_argument("--workdir", help="folder for the temporary packs (default: a new temporary folder)")
    parser.add_argument("--fuzz-big-manifest", type=int, metavar="MB",
                        help="the oversized manifest of the field fuzz, in MB (default: 300; 8 with --quick)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message="This DataLoader will create")  # 16 workers on few cores: on purpose
    counts = QUICK if args.quick else FULL
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        source = make_source(work / "src", per_class=counts["per_class"])
        refs = {backend: work / f"ref.{backend}" for backend in ("lmdb", "shards")}
        for ref in refs.values():
            pack_small(source, ref)
        results: dict[str, Any] = {}
        if "kills" in sections:
            results["kills"] = timed("kills", lambda: kills(work, source, refs, counts))
        if "workers" in sections:
            results["workers"] = timed("workers", lambda: workers(refs))
        if "corruption" in sections:
            results["corruption"] = timed("corruption", lambda: corruption(source, refs, work, counts))
        if "hostile" in sections:
            results["hostile"] = timed("hostile", lambda: hostile_suite(refs, work / "hostile"))
        if "fuzz" in sections:
            big = args.fuzz_big_manifest << 20 if args.fuzz_big_manifest else None
            results["fuzz"] = timed("fuzz", lambda: fuzz(work, counts, big))
        if "disk" in sections:
            results["disk"] = timed("disk", lambda: disk(work))
        if "store" in sections:
            results["store"] = timed("store", lambda: store_suite(work / "store", counts))
        if "load" in sections:
            results["load"] = timed("load", lambda: load(refs, counts))
    problems = [p for r in results.values() for p in r.get("problems", [])]
    report = {
        "command": "python benchmarks/reliability.py" + (" --quick" if args.quick else ""),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cores": len(os.sched_getaffinity(0)),
                    "root": os.geteuid() == 0},
        "counts": counts, "seconds": round(time.perf_counter() - started, 1), "problems": problems,
        "results": results,
    }
    lines = summary(results, counts)
    print("\n".join(lines))
    print(f"\n{len(problems)} problem(s) in {report['seconds']} s")
    for problem in problems[:50]:
        print(f"  PROBLEM {problem}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str, ensure_ascii=False) + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
