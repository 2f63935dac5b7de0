"""``pack --engine ray --resume``: what an interrupted Ray pack left, and whether it may go on.

When the tasks are about to start, the driver writes a run record, ``ray-run.json``, beside the
task folders: the options (as ``pack --resume`` compares them), the shard size, a digest of the
scanned file list and the ranges. A resumed run reads it back and refuses, in one line naming the
option, a run with other options or another source; it keeps the ranges recorded (the cluster may
have another number of CPUs now) and every task whose folder holds a valid done marker, and every
placement that left its marker. Everything else is done again, which gives the same bytes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from packload.core.errors import UsageError
from packload.core.format import PROGRESS_NAME, RAY_RUN_NAME
from packload.core.scan import Sample
from packload.packer.destination import exists, remove_ours
from packload.packer.ray_tasks import done_result, placed_result, task_name
from packload.packer.resume_options import options_changed
from packload.packer.write_shards import write_file_atomic


def source_digest(samples: list[Sample]) -> str:
    """SHA-256 of the scanned file list (paths and labels, in order): a resume needs the same one."""
    digest = hashlib.sha256()
    for sample in samples:
        digest.update(f"{sample.label}\0{sample.path}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def run_record(options_record: dict[str, Any], shard_size: int, samples: list[Sample]) -> dict[str, Any]:
    """The run record of a pack with these options over these files (its ranges added later)."""
    return {"engine": "ray", "options": options_record, "shard_size": shard_size,
            "source": {"files": len(samples), "sha256": source_digest(samples)}}


def write_run_record(staging: Path, record: dict[str, Any]) -> None:
    write_file_atomic(staging / RAY_RUN_NAME, json.dumps(record).encode("utf-8"))


def previous_run(staging: Path, tmp: Path, now: dict[str, Any], task_files: int | None, resume: bool,
                 overwrite: bool, root: Path) -> dict[str, Any] | None:
    """The run record to resume, or None to start afresh. Without ``resume`` an unfinished pack is
    refused (removed under ``overwrite``); with it, one started with other options or over another
    file list is refused in one line. Call with the destination's lock held, after ``check_partial``."""
    leftovers = [path for path in dict.fromkeys((tmp, staging)) if exists(path)]
    if not leftovers:
        return None
    if not resume:
        if not overwrite:
            raise UsageError(f"{leftovers[0]}: an unfinished pack is there; add --resume to finish it, "
                             "or --overwrite to start over")
        for path in leftovers:
            remove_ours(path)
        return None
    try:
        before = json.loads((staging / RAY_RUN_NAME).read_bytes())
    except FileNotFoundError:
        if (tmp / PROGRESS_NAME).exists():
            raise UsageError(f"{tmp}: this unfinished pack was started without --engine ray; resume it the same "
                             "way (drop --engine ray), or start over with --overwrite") from None
        for path in leftovers:  # stopped before its tasks started: nothing to keep
            remove_ours(path)
        return None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{staging / RAY_RUN_NAME}: cannot be read ({exc}); start over with --overwrite") from None
    check_same_run(before, now, task_files, root)
    return before


def check_same_run(before: dict[str, Any], now: dict[str, Any], task_files: int | None, root: object) -> None:
    """Refuse in one line naming the option to resume the run recorded ``before`` with other
    options (``now``, ``task_files``) or over another file list of the source ``root``."""
    if before.get("options") != now["options"]:
        raise UsageError(f"the unfinished pack was started with other options: "
                         f"{options_changed(before.get('options') or {}, now['options'])}; "
                         "resume with the same options, or start over with --overwrite")
    if before.get("shard_size") != now["shard_size"]:
        raise UsageError(f"the unfinished pack was started with other options: --shard-size was "
                         f"{before.get('shard_size')}, now {now['shard_size']}; resume with the same options, "
                         "or start over with --overwrite")
    if task_files is not None and before.get("task_files") != task_files:
        raise UsageError(f"the unfinished pack was started with other options: --task-files was "
                         f"{before.get('task_files')}, now {task_files}; resume with the same options "
                         "(or leave out --task-files), or start over with --overwrite")
    if before.get("source") != now["source"]:
        was, files = before.get("source") or {}, now["source"]["files"]
        raise UsageError(f"{root}: the source folder changed since the pack was interrupted ({was.get('files')} "
                         f"image files then, {files} now, or other names); start over with --overwrite")


def kept_tasks(staging: Path, ranges: list[tuple[int, int]], place_into: Path | None
               ) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]]]:
    """The results of the tasks that finished before (by their done markers), and the placements
    that finished (by theirs), by task number. Shards are placed only once every range before them
    has finished, so only the finished tasks before the first unfinished one can have been placed."""
    results: dict[int, dict[str, Any]] = {}
    placed: dict[int, dict[str, Any]] = {}
    part_base = record_base = 0
    in_order = place_into is not None
    for k, span in enumerate(ranges):
        folder = staging / task_name(k)
        result = done_result(folder, k, span, place_into if in_order else None, part_base)
        if result is None:
            in_order = False
            continue
        results[k] = result
        if in_order and place_into is not None:
            done = placed_result(folder, place_into, part_base, record_base)
            if done is not None:
                placed[k] = done
        part_base += len(result["parts"])
        record_base += result["records"]
    return results, placed
