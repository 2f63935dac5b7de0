"""Corruption: where each kind of data lies in a pack, bit flips and truncations one at a time,
and how each damaged pack was caught (or not) by ``verify`` and the readers."""

from __future__ import annotations

import contextlib
import os
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tests.reliability.checker import Checker
from tests.reliability.packs import records_of


@dataclass(frozen=True)
class Region:
    """Bytes ``[start, end)`` of ``file`` (relative to the pack), belonging to ``record`` if any."""

    file: str
    start: int
    end: int
    record: int | None = None


def _find_once(data: bytes, value: bytes, what: str) -> int:
    at = data.find(value)
    if at < 0 or data.find(value, at + 1) >= 0:
        raise AssertionError(f"{what} is not stored exactly once, contiguously, in the LMDB file")
    return at


def corruption_regions(pack: Path) -> dict[str, list[Region]]:
    """Where each kind of data lies in the pack's files: payloads and record headers (with their
    path) per record, the index, the manifest, and (shards) each shard's header."""
    from packload import PackReader
    from packload.core.format import LMDB_MANIFEST_KEY

    out: dict[str, list[Region]] = {"payload": [], "record header": [], "index": [], "manifest": []}
    with PackReader(pack) as reader:
        entries = reader.entries.copy()
        if reader.backend == "shards":
            base = {part: (name, 0) for part, name in enumerate(reader.part_names)}
            out["shard header"] = [Region(name, 0, 16) for name in reader.part_names]
            out["index"].append(Region("index.bin", 0, (pack / "index.bin").stat().st_size))
            out["manifest"].append(Region("manifest.json", 0, (pack / "manifest.json").stat().st_size))
        else:
            data = pack.read_bytes()
            chunks = int(reader.manifest["parts"]["chunks"])
            base = {p: ("", _find_once(data, bytes(reader.part_view(p)), f"chunk {p}")) for p in range(chunks)}
            index = reader.index_bytes()
            at = _find_once(data, index, "the index")
            out["index"].append(Region("", at, at + len(index)))
            import lmdb

            env = lmdb.open(str(pack), subdir=False, readonly=True, lock=False)
            with env.begin() as txn:
                manifest = txn.get(LMDB_MANIFEST_KEY)
            env.close()
            at = _find_once(data, manifest, "the manifest")
            out["manifest"].append(Region("", at, at + len(manifest)))
    for i, entry in enumerate(entries):
        name, offset = base[int(entry["part"])]
        record, payload = int(entry["record_offset"]) + offset, int(entry["payload_offset"]) + offset
        out["record header"].append(Region(name, record, payload, i))
        if int(entry["payload_len"]):
            out["payload"].append(Region(name, payload, payload + int(entry["payload_len"]), i))
    if pack.is_file():
        out["lmdb pages"] = _lmdb_structure(pack, [r for regions in out.values() for r in regions])
    return out


def _lmdb_structure(pack: Path, values: list[Region]) -> list[Region]:
    """LMDB's own bytes: meta pages, B-tree pages and page headers, outside every value; only the
    bytes LMDB uses (non-zero ones and the 64 bytes at the top of each page), not empty slack."""
    data = np.frombuffer(pack.read_bytes(), np.uint8)
    used = np.zeros(len(data), dtype=bool)
    for region in values:
        used[region.start : region.end] = True
    offsets = np.arange(len(data))
    candidates = np.flatnonzero(~used & ((data != 0) | (offsets % 4096 < 64)))
    return [Region("", int(i), int(i) + 1) for i in candidates]


def flip_bit(path: Path, offset: int, bit: int) -> None:
    """XOR one bit of ``path`` in place (twice restores it)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))


def manifest_field(raw: bytes, offset: int) -> str:
    """The top-level manifest key whose value holds byte ``offset`` (the packer writes the manifest
    with one-space indentation, so top-level keys start a line with exactly one space)."""
    line_end = raw.find(b"\n", offset)
    keys = re.findall(rb'\n "([^"\n]+)":', raw[: line_end if line_end >= 0 else len(raw)])
    return keys[-1].decode("utf-8", "replace") if keys else "?"


def _judge(kind: str, region: Region | None, answer: dict[str, Any], paths: list[str]) -> tuple[str, list[str]]:
    """Outcome of one damaged pack: how it was caught, and the problems (rules broken)."""
    problems = []
    for bad in ("crash", "hang", "memory_error"):
        if bad in answer:
            return bad, [f"{bad}: {answer[bad]}"]
    problems += answer["foreign"]
    for mode in ("checked", "unchecked"):
        problems += [f"reader ({mode}): {item}" for item in answer[mode]["foreign"]]
    checked = answer["checked"]
    if checked["wrong"]:
        problems.append(f"reader with checksums on returned wrong records {checked['wrong'][:5]} without an error")
    if checked["wrong_meta"] and kind != "manifest":
        problems.append(f"reader with checksums on returned wrong {checked['wrong_meta']}")
    if kind in ("payload", "record header") and region is not None:
        named = [region.record, paths[region.record]] in answer["bad_records"]
        if not named:
            problems.append(f"verify did not name record {region.record} ({paths[region.record]}): "
                            f"{answer['verify_error'] or answer['bad_records'][:3]}")
        elif len(answer["bad_records"]) != 1:
            problems.append(f"verify named other records too: {answer['bad_records'][:5]}")
    if answer["verify_error"] is not None:
        outcome = "refused on open"
    elif answer["bad_records"] or answer["bad_files"]:
        outcome = "reported by verify"
    elif checked["open_error"] or checked["refused"]:
        outcome = "refused by the reader"
    elif checked["wrong_meta"]:
        outcome = f"undetected: changed {'/'.join(checked['wrong_meta'])}"
    else:
        outcome = "undetected, no effect on what is read"
    if kind in ("index", "shard header") and not outcome.startswith(("refused", "reported")):
        problems.append(f"{kind} damage went unnoticed by verify and the reader")
    return outcome, problems


def corruption_campaign(pack: Path, flips: int, truncations: int, seed: int = 0,
                        log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Flip ``flips`` random bits (spread over payloads, record headers, the index, the manifest and
    shard headers) and cut the pack's files at ``truncations`` random lengths, one damage at a
    time, each undone after its check. Returns counts per kind and outcome, and every problem."""
    rng = random.Random(seed)
    regions = corruption_regions(pack)
    kinds = list(regions)
    counts: dict[str, dict[str, int]] = {}
    problems: list[str] = []
    with contextlib.ExitStack() as stack:
        checker = stack.enter_context(Checker(pack))
        paths = [p for p, _, _ in records_of(pack)]
        files = sorted(pack.iterdir()) if pack.is_dir() else [pack]
        manifest_bytes = {}
        for region in regions["manifest"]:
            manifest_bytes = (pack / region.file if region.file else pack).read_bytes()[region.start : region.end]
        for k in range(flips):
            kind = kinds[k % len(kinds)]
            region = rng.choice(regions[kind])
            offset, bit = rng.randrange(region.start, region.end), rng.randrange(8)
            target = pack / region.file if region.file else pack
            checker.ensure()
            flip_bit(target, offset, bit)
            try:
                answer = checker.check()
            finally:
                flip_bit(target, offset, bit)
            outcome, found = _judge(kind, region, answer, paths)
            label = kind
            if kind == "manifest" and outcome.startswith("undetected"):
                outcome += f" (field {manifest_field(manifest_bytes, offset - region.start)})"
            counts.setdefault(label, {}).setdefault(outcome, 0)
            counts[label][outcome] += 1
            problems += [f"{kind} flip at {target.name}+{offset} bit {bit}: {p}" for p in found]
            if log and (k + 1) % 50 == 0:
                log(f"  {k + 1}/{flips} flips, {len(problems)} problems")
        for _ in range(truncations):
            target = rng.choice(files)
            size = target.stat().st_size
            length = rng.randrange(0, size)
            saved = target.read_bytes()
            checker.ensure()
            os.truncate(target, length)
            try:
                answer = checker.check()
            finally:
                target.write_bytes(saved)
            outcome, found = _judge("truncation", None, answer, paths)
            if outcome.startswith("undetected") or not answer.get("checked", {}).get("open_error"):
                if "crash" not in answer and "hang" not in answer and "memory_error" not in answer:
                    found.append(f"truncated pack opened without an error ({outcome})")
            name = "truncation: " + ("shard" if target.name.startswith("shard-") else target.name
                                     if pack.is_dir() else "lmdb file")
            counts.setdefault(name, {}).setdefault(outcome, 0)
            counts[name][outcome] += 1
            problems += [f"{target.name} cut to {length} of {size} bytes: {p}" for p in found]
        starts = checker.starts
    return {"flips": flips, "truncations": truncations, "counts": counts, "problems": problems,
            "checker_starts": starts}
