"""Kills: ``pack`` SIGKILLed at chosen points (a record count or a phase of finishing), then
``--resume``; a DataLoader worker SIGKILLed mid-epoch, then a loader resumed from the sampler's state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from tests.reliability.packs import REPO, SHARD_SIZE, child_env, cli, one_line_error, pack_small, records_of

# Packs slowly (a pause per file) and says where it is: the number of files encoded so far, and
# the phases of finishing (index, manifest, publish), pausing at each so a kill lands there.
_KILL_CHILD = textwrap.dedent("""
    import sys, time
    import packload.packer.encode_stream as es
    import packload.packer.pipeline as p
    import packload.packer.write_shards as ws
    from packload.packer.pack_destination import PackDestination
    from tests.reliability.packs import small_chunk_writer
    src, dst, delay, pause = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    p.LmdbWriter = small_chunk_writer()
    real_encode, done = es.encode_chunk, 0
    def slow(root, samples, options):
        global done
        out = []
        for s in samples:
            time.sleep(delay)
            out.extend(real_encode(root, [s], options))
            done += 1
            print(done, flush=True)
        return out
    def phase(name):
        print(name, flush=True)
        time.sleep(pause)
    real_atomic = ws.write_file_atomic
    def atomic(path, data):
        if path.name != ws.PROGRESS_NAME:
            phase("before " + path.name)
        real_atomic(path, data)
        if path.name != ws.PROGRESS_NAME:
            phase("after " + path.name)
    real_finish = p.LmdbWriter.finish
    def finish(self, manifest):
        phase("before lmdb finish")
        return real_finish(self, manifest)
    real_publish = PackDestination.publish
    def publish(self):
        phase("before publish")
        real_publish(self)
    es.encode_chunk, es.CHUNK_FILES, ws.write_file_atomic, PackDestination.publish = slow, 3, atomic, publish
    p.LmdbWriter.finish = finish
    p.pack(src, dst, workers=1, progress=False, checkpoint_every=7, shard_size=int(sys.argv[5]))
    print("done", flush=True)
""")

SHARDS_PHASES = ("before index.bin", "before manifest.json", "after manifest.json", "before publish")
LMDB_PHASES = ("before lmdb finish", "before publish")


def kill_pack(source: Path, dst: Path, point: int | str, delay: float = 0.005, timeout: float = 120.0) -> bool:
    """Run a slow ``pack`` and SIGKILL it at ``point``: once it has encoded that many files (int)
    or when it reaches that phase of finishing (str). True if it was killed before it finished."""
    proc = subprocess.Popen([sys.executable, "-c", _KILL_CHILD, str(source), str(dst), str(delay), "0.5",
                             str(SHARD_SIZE)], cwd=REPO, env=child_env(), stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    killed = False
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            line = line.strip()
            hit = (line.isdigit() and int(line) >= point) if isinstance(point, int) else line == point
            if hit:
                proc.send_signal(signal.SIGKILL)
                killed = True
                break
            if line == "done" or time.monotonic() > deadline:
                break
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
    return killed and proc.returncode == -signal.SIGKILL


def kill_and_resume(source: Path, dst: Path, reference: Path, point: int | str) -> dict[str, Any]:
    """Kill ``pack`` at ``point``, check that nothing complete is left and that every reader refuses
    the partial output, then ``--resume`` and compare with the uninterrupted ``reference``."""
    from packload import PackedImageFolder, PackReader
    from packload.core.errors import PackloadError
    from packload.loaders.verify import verify
    from packload.packer.destination import partial_path, remove_ours
    from packload.packer.pipeline import nothing_to_resume

    problems: list[str] = []
    killed = kill_pack(source, dst, point)
    if not killed:
        problems.append(f"pack finished before the kill point {point}")
    partial = partial_path(dst)
    if dst.exists():
        problems.append(f"{dst.name} exists after the kill")
    messages = {}
    for target in (dst, partial) if partial.exists() else (dst,):
        for name, open_it in (("PackReader", PackReader), ("PackedImageFolder", PackedImageFolder)):
            try:
                open_it(target).close()
                problems.append(f"{name} accepted {target.name}")
            except PackloadError as exc:
                messages[f"{name} {target.name}"] = str(exc)
        for command in (["info", str(target)], ["verify", "--quiet", str(target)]):
            problem = one_line_error(*cli(command))
            if problem:
                problems.append(f"packload {command[0]} {target.name}: {problem}")
    # Killed before a record a resume would keep: the same command simply starts again. Else it is
    # refused, naming --resume, and the pack is resumed.
    fresh = partial.exists() and nothing_to_resume(partial)
    code, err = cli(["pack", str(source), str(dst), "--quiet"])
    if fresh:
        if code != 0:
            problems.append(f"pack over an unfinished pack holding nothing to resume: exit {code}, {err.strip()!r}")
        remove_ours(dst)
        summary = pack_small(source, dst)
    else:
        if partial.exists() and (code != 2 or "--resume" not in err):
            problems.append(f"pack without --resume over an unfinished pack: exit {code}, {err.strip()!r}")
        summary = pack_small(source, dst, resume=True)
    if partial.exists() or Path(str(partial) + "-lock").exists():
        problems.append("resume left the unfinished pack behind")
    identical = records_of(dst) == records_of(reference)
    if not identical:
        problems.append("resumed pack differs from the uninterrupted one, record by record")
    with PackReader(dst) as got, PackReader(reference) as want:
        if got.index_bytes() != want.index_bytes():
            problems.append("resumed pack's index differs")
        for key in ("skipped", "class_counts", "records", "payload_bytes"):
            if got.manifest[key] != want.manifest[key]:
                problems.append(f"resumed manifest {key} differs")
    if not verify(dst, progress=False)["ok"]:
        problems.append("resumed pack does not verify")
    return {"point": point, "killed": killed, "resumed_at": summary["resumed_at"], "identical": identical,
            "messages": messages, "problems": problems}


def kill_points(records: int, count: int, backend: str) -> list[int | str]:
    """``count`` kill points: record counts spread over the run, then each phase of finishing."""
    phases = SHARDS_PHASES if backend == "shards" else LMDB_PHASES
    spread = max(0, count - len(phases))
    numbers = sorted({max(1, round(records * (k + 0.5) / spread)) for k in range(spread)})
    return [*numbers, *phases][:count]


# -- DataLoader worker killed ------------------------------------------------------------------------


def collate_list(batch: list[Any]) -> list[Any]:
    """Keep a batch as a list (payload bytes of different lengths)."""
    return batch


def worker_kill_resume(pack: Path, workers: int = 2, batch_size: int = 4, kill_after: int = 3,
                       start_method: str = "fork", seed: int = 3, epoch: int = 1) -> dict[str, Any]:
    """Kill a DataLoader worker mid-epoch: the error reaching the loop must name it, and a new loader
    resumed from ``sampler.state_dict`` must deliver exactly the rest of the epoch's order."""
    from torch.utils.data import DataLoader

    from packload import PackedImageFolder

    ds = PackedImageFolder(pack, output="bytes", verify=True)
    expected_records = ds.sampler(shuffle=True, seed=seed).epoch_order(epoch).tolist()
    expected = [ds[i] for i in expected_records]

    def loader_for(sampler: Any) -> DataLoader:
        return DataLoader(ds, batch_size=batch_size, sampler=sampler, num_workers=workers, collate_fn=collate_list,
                          multiprocessing_context=start_method, timeout=120)

    sampler = ds.sampler(shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    got: list[Any] = []
    batches = 0
    iterator = iter(loader_for(sampler))
    error = None
    victim = None
    try:
        for batch in iterator:
            got.extend(batch)
            batches += 1
            if batches == kill_after:
                victim = iterator._workers[0].pid  # type: ignore[attr-defined]
                os.kill(victim, signal.SIGKILL)
    except RuntimeError as exc:
        error = str(exc)
    finally:
        iterator._shutdown_workers()  # type: ignore[attr-defined]
    problems = []
    if error is None and len(got) < len(expected):
        problems.append("killing a worker raised nothing in the training loop, yet samples are missing")
    elif error is not None and str(victim) not in error:
        problems.append(f"the error does not name the killed worker (pid {victim}): {error!r}")
    state = json.loads(json.dumps(sampler.state_dict(consumed=len(got))))
    resumed = ds.sampler(shuffle=True, seed=seed)
    resumed.load_state_dict(state)
    rest = [item for batch in loader_for(resumed) for item in batch]
    if got + rest != expected:
        problems.append("the resumed loader did not deliver the rest of the epoch in the same order")
    return {"victim": victim, "error": error, "batches_before": batches, "delivered": len(got) + len(rest),
            "expected": len(expected), "problems": problems}
