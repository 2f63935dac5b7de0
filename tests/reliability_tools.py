"""Shared code of the reliability suite: kills, corruption, full disks, hostile packs, many readers.

The CI tests (``tests/test_reliability_*.py``) call these functions with small counts;
``benchmarks/reliability.py`` calls the very same functions with the full counts and prints the
figures that RELIABILITY.md records. Each check returns plain data (counts and a list of
problems); an empty problem list is a pass.

Nothing here imports torch at module level: the SIGKILL and checker child processes import only
what they need, so they start fast.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import random
import re
import resource
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHARD_SIZE = 1 << 16  # small shards, so a small pack has several
LMDB_CHUNK = 16 << 10  # small LMDB chunks, so a small pack has several
MEMORY_HEADROOM = 2 << 30  # a checker child may allocate this much beyond its start: more is "absurd"
CHECK_TIMEOUT = 60.0  # seconds one check may take before it counts as a hang


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


# -- sources and packs -------------------------------------------------------------------------------


def make_source(root: Path, per_class: int = 30, seed: int = 5, big: int = 0) -> Path:
    """An ImageFolder tree of 3 classes (JPEG and PNG), broken files in class ``b`` (skipped when
    packing) and ``big`` large PNGs in class ``a`` (to make a pack of several MB)."""
    from PIL import Image

    from tests.image_factory import make_image_folder, textured_rgb, write_broken_files

    make_image_folder(root, classes=("a", "b", "c"), per_class=per_class, seed=seed)
    write_broken_files(root / "b")
    for k in range(big):
        Image.fromarray(textured_rgb((300, 300), seed=100 + k)).save(root / "a" / f"big{k}.png")
    return root


def small_chunk_writer() -> type:
    """``LmdbWriter`` with ``LMDB_CHUNK``-byte chunks (the same layout in every run that uses it)."""
    from packload.packer.write_lmdb import LmdbWriter

    class SmallChunks(LmdbWriter):
        def __init__(self, path: Path, map_size: int, chunk_size: int = LMDB_CHUNK) -> None:
            super().__init__(path, map_size, chunk_size)

    return SmallChunks


@contextlib.contextmanager
def small_chunks() -> Iterator[None]:
    """Make ``pack`` write LMDB packs with small chunks while the block runs."""
    import packload.packer.pipeline as pipeline

    saved = pipeline.LmdbWriter
    pipeline.LmdbWriter = small_chunk_writer()
    try:
        yield
    finally:
        pipeline.LmdbWriter = saved


def pack_small(source: Path, dst: Path, **kwargs: Any) -> dict[str, Any]:
    """``pack`` with small shards and chunks, one worker, no progress bar."""
    from packload import pack

    with small_chunks():
        return pack(source, dst, workers=1, progress=False, shard_size=SHARD_SIZE, **kwargs)


def both_backends(root: Path, per_class: int) -> dict[str, Path]:
    """A generated source under ``root`` packed into a small LMDB pack and a small shards pack."""
    return pack_both(make_source(root / "src", per_class=per_class), root)


def pack_both(source: Path, root: Path, stem: str = "p") -> dict[str, Path]:
    """``source`` packed small into ``root/STEM.lmdb`` and ``root/STEM.shards``."""
    out = {}
    for backend in ("lmdb", "shards"):
        out[backend] = root / f"{stem}.{backend}"
        pack_small(source, out[backend])
    return out


def records_of(path: Path) -> list[tuple[str, int, bytes]]:
    """(original path, label, payload) of every record, each payload checked against its CRC."""
    from packload import PackReader

    with PackReader(path) as reader:
        return [(reader.path_of(i), int(reader.entries["label"][i]), bytes(reader.payload(i, verify=True)))
                for i in range(reader.records)]


def cli(args: list[str], stdout: io.StringIO | None = None) -> tuple[int, str]:
    """Run ``packload ARGS`` in this process; (exit code, stderr), stdout into ``stdout`` if given.
    An exception escaping the command line (a traceback for the user) is returned as exit code -1
    with the exception's text."""
    from packload.cli import main

    err, out = io.StringIO(), stdout if stdout is not None else io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(args)
    except Exception as exc:  # noqa: BLE001 - what we are looking for
        return -1, f"traceback: {type(exc).__name__}: {exc}"
    return code, err.getvalue()


def one_line_error(code: int, stderr: str) -> str | None:
    """None if a failed command ended as it should (non-zero exit, one line on stderr that says
    ``error``); else what was wrong."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    if code == 0:
        return "exit code 0"
    if code < 0:
        return stderr
    if len(lines) != 1 or "error" not in lines[0] or "Traceback" in stderr:
        return f"not a one-line error: {stderr.strip()[:300]!r}"
    return None


# -- kills ---------------------------------------------------------------------------------------------

# Packs slowly (a pause per file) and says where it is: the number of files encoded so far, and
# the phases of finishing (index, manifest, publish), pausing at each so a kill lands there.
_KILL_CHILD = textwrap.dedent("""
    import sys, time
    import packload.packer.pipeline as p
    import packload.packer.write_shards as ws
    from tests.reliability_tools import small_chunk_writer
    src, dst, delay, pause = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    p.LmdbWriter = small_chunk_writer()
    real_encode, done = p.encode_chunk, 0
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
    real_publish = p._publish
    def publish(tmp, final):
        phase("before publish")
        real_publish(tmp, final)
    p.encode_chunk, p.CHUNK_FILES, ws.write_file_atomic, p._publish = slow, 3, atomic, publish
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
                             str(SHARD_SIZE)], cwd=REPO, env=_env(), stdout=subprocess.PIPE, text=True)
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
    from packload.packer.pipeline import partial_path

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
    code, err = cli(["pack", str(source), str(dst), "--quiet"])
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


# -- corruption ----------------------------------------------------------------------------------------


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


def _expected_samples(pack: str) -> dict[str, Any]:
    """What an intact pack gives: pixels (EXIF-transposed), labels, paths and classes."""
    from packload import PackedImageFolder

    ds = PackedImageFolder(pack, output="numpy", exif_transpose=True)
    pixels = [ds[i][0] for i in range(len(ds))]
    out = {"pixels": pixels, "targets": list(ds.targets), "paths": [ds.path(i) for i in range(len(ds))],
           "classes": list(ds.classes)}
    ds.close()
    return out


def _read_all(pack: str, verify: bool, expected: dict[str, Any]) -> dict[str, Any]:
    """Read every record as a training loop would (batches of 8, then one by one after an error) and
    compare with ``expected``. Counts records read right, refused with our error, returned WRONG
    without an error, and exceptions other than ours."""
    from packload import PackedImageFolder
    from packload.core.errors import PackloadError

    result: dict[str, Any] = {"open_error": None, "right": 0, "refused": 0, "wrong": [], "wrong_meta": [],
                              "foreign": []}
    try:
        ds = PackedImageFolder(pack, output="numpy", exif_transpose=True, verify=verify)
    except PackloadError as exc:
        result["open_error"] = str(exc)
        return result
    except Exception as exc:  # noqa: BLE001 - a traceback a user would see: what we look for
        result["foreign"].append(f"open: {type(exc).__name__}: {exc}")
        return result
    try:
        if ds.targets != expected["targets"]:
            result["wrong_meta"].append("targets")
        if ds.classes != expected["classes"]:
            result["wrong_meta"].append("classes")
        n = len(ds)
        for lo in range(0, n, 8):
            indices = list(range(lo, min(n, lo + 8)))
            try:
                items = list(zip(indices, ds.__getitems__(indices), strict=True))
            except PackloadError:
                items = []
                for i in indices:
                    try:
                        items.append((i, ds[i]))
                    except PackloadError:
                        result["refused"] += 1
                    except Exception as exc:  # noqa: BLE001
                        result["foreign"].append(f"record {i}: {type(exc).__name__}: {exc}")
            except Exception as exc:  # noqa: BLE001
                result["foreign"].append(f"batch {lo}: {type(exc).__name__}: {exc}")
                continue
            for i, (image, label) in items:
                want = expected["pixels"][i]
                if image.shape != want.shape or not np.array_equal(image, want) or label != expected["targets"][i]:
                    result["wrong"].append(i)
                else:
                    result["right"] += 1
    finally:
        ds.close()
    return result


def check_pack(pack: str, expected: dict[str, Any]) -> dict[str, Any]:
    """``verify`` the pack, then read it with checksums on and off (see ``_read_all``)."""
    from packload.core.errors import PackloadError
    from packload.loaders.verify import verify

    report: dict[str, Any] = {"verify_error": None, "verify_ok": None, "bad_records": [], "bad_files": [],
                              "foreign": []}
    try:
        result = verify(pack, progress=False)
        report["verify_ok"] = result["ok"]
        report["bad_records"] = [[bad["record"], bad["path"]] for bad in result["bad_records"]]
        report["bad_files"] = [bad["file"] for bad in result["bad_files"]]
    except PackloadError as exc:
        report["verify_error"] = str(exc)
    except Exception as exc:  # noqa: BLE001
        report["foreign"].append(f"verify: {type(exc).__name__}: {exc}")
    report["checked"] = _read_all(pack, True, expected)
    report["unchecked"] = _read_all(pack, False, expected)
    gc.collect()
    return report


def serve_checks() -> None:
    """The checker child: reads one JSON command a line (``expect`` or ``check``), answers one line.
    Its address space is capped, so an absurd allocation fails here rather than passing unseen."""
    import packload.loaders  # noqa: F401 - imported before the cap: torch maps a lot of address space
    import packload.loaders.verify  # noqa: F401

    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + MEMORY_HEADROOM, vm + MEMORY_HEADROOM))
    expected: dict[str, Any] = {}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        try:
            if command["op"] == "expect":
                expected = _expected_samples(command["pack"])
                answer: dict[str, Any] = {"records": len(expected["targets"])}
            else:
                answer = check_pack(command["pack"], expected)
        except MemoryError as exc:
            answer = {"memory_error": str(exc)}
        print(json.dumps(answer), flush=True)


class Checker:
    """A long-lived checker child (see ``serve_checks``); restarted after a crash or a hang."""

    def __init__(self, pack: Path) -> None:
        self.pack = pack
        self.proc: subprocess.Popen[str] | None = None
        self.starts = 0

    def _start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", "from tests.reliability_tools import serve_checks; "
                                      "serve_checks()"], cwd=REPO, env=_env(), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.starts += 1
        ready = self._answer(CHECK_TIMEOUT * 2)
        if "ready" not in ready:
            raise RuntimeError(f"checker did not start: {ready}")
        answer = self.ask({"op": "expect", "pack": str(self.pack)})
        if "records" not in answer:
            raise RuntimeError(f"checker could not read the intact pack: {answer}")

    def _answer(self, timeout: float) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.stop()
            return {"hang": f"no answer within {timeout:.0f} s"}
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            self.proc = None
            name = signal.Signals(-code).name if code < 0 else f"exit {code}"
            return {"crash": name}
        return json.loads(line)

    def ensure(self) -> None:
        """Start the child if it is not running; call only while the pack is intact, since the
        child learns what the pack should give from it."""
        if self.proc is None:
            self._start()

    def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        """Send one command; the answer, or ``{"crash": ...}`` / ``{"hang": ...}``."""
        if self.proc is None:
            raise RuntimeError("the checker is not running: call ensure() while the pack is intact")
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self._answer(CHECK_TIMEOUT)

    def check(self) -> dict[str, Any]:
        return self.ask({"op": "check", "pack": str(self.pack)})

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def __enter__(self) -> Checker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


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


# -- hostile packs ---------------------------------------------------------------------------------------


def copy_pack(pack: Path, dst: Path) -> Path:
    """A copy of ``pack`` at ``dst`` (a folder or a file)."""
    if pack.is_dir():
        shutil.copytree(pack, dst)
    else:
        shutil.copyfile(pack, dst)
    return dst


def _lmdb_put(pack: Path, values: dict[bytes, bytes]) -> None:
    import lmdb

    env = lmdb.open(str(pack), subdir=False, map_size=max(1 << 24, 4 * pack.stat().st_size), lock=False)
    try:
        with env.begin(write=True) as txn:
            for key, value in values.items():
                txn.put(key, value)
        env.sync(True)
    finally:
        env.close()


def rewrite(pack: Path, index: bytes | None = None, manifest: dict[str, Any] | bytes | None = None,
            fix_sha: bool = True) -> None:
    """Replace a pack's index and/or manifest, keeping the manifest's index sha256 and size in
    step with the new index (so only the damage meant is there)."""
    import hashlib

    from packload import PackReader
    from packload.core.format import LMDB_INDEX_KEY, LMDB_MANIFEST_KEY, encode_manifest

    with PackReader(pack) as reader:
        old_manifest = dict(reader.manifest)
        old_index = reader.index_bytes()
    index_bytes = old_index if index is None else index
    if isinstance(manifest, bytes):
        manifest_bytes = manifest
    else:
        new = dict(old_manifest if manifest is None else manifest)
        if fix_sha and isinstance(new.get("index"), dict):
            new["index"] = dict(new["index"], sha256=hashlib.sha256(index_bytes).hexdigest(), size=len(index_bytes))
        manifest_bytes = encode_manifest(new)
    if pack.is_dir():
        (pack / "index.bin").write_bytes(index_bytes)
        (pack / "manifest.json").write_bytes(manifest_bytes)
    else:
        _lmdb_put(pack, {LMDB_INDEX_KEY: index_bytes, LMDB_MANIFEST_KEY: manifest_bytes})


def index_with(pack: Path, **fields: Any) -> bytes:
    """The pack's index with entry fields replaced: ``field=(record, value)``; ``count=N`` or
    ``version=V`` set the header."""
    from packload import PackReader
    from packload.core.format import INDEX_ENTRY, INDEX_HEADER

    with PackReader(pack) as reader:
        raw = bytearray(reader.index_bytes())
    header = np.frombuffer(bytes(raw[: INDEX_HEADER.itemsize]), INDEX_HEADER).copy()
    count = int(header[0]["count"])
    entries = np.frombuffer(bytes(raw), INDEX_ENTRY, count=count, offset=INDEX_HEADER.itemsize).copy()
    for name, value in fields.items():
        if name in INDEX_HEADER.names:
            header[0][name] = value
        else:
            record, new = value
            entries[record][name] = new
    return header.tobytes() + entries.tobytes() + bytes(raw[INDEX_HEADER.itemsize + count * INDEX_ENTRY.itemsize :])


def craft_pack(dst: Path, items: list[tuple[str, int, bytes]], classes: list[str] | None = None,
               encoding: str = "keep") -> Path:
    """A pack whose every checksum is right but whose content is chosen by the caller: ``items``
    are (path, label, image file bytes), written as-is (hostile paths, bombs...)."""
    from PIL import Image

    from packload.packer.encode import Encoded
    from packload.packer.write_shards import ShardsWriter

    classes = ["a"] if classes is None else classes
    backend = "lmdb" if dst.suffix == ".lmdb" else "shards"
    if backend == "lmdb":
        writer: Any = small_chunk_writer()(dst, 1 << 24)
    else:
        dst.mkdir()
        writer = ShardsWriter(dst, SHARD_SIZE)
    limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None  # a bomb's header is recorded as it claims
    for path, label, payload in items:
        try:
            image = Image.open(io.BytesIO(payload))
            size, mode, fmt = image.size, image.mode, image.format or "other"
        except Exception:  # noqa: BLE001 - junk: a size no reader may trust
            size, mode, fmt = (1, 1), "RGB", "other"
        writer.write(Encoded(path, label, payload, size[0], size[1], mode, fmt, 0, len(payload), zlib.crc32(payload)))
    Image.MAX_IMAGE_PIXELS = limit
    writer.finish({"format": "packload", "version": 1, "backend": backend, "encoding": encoding,
                   "records": writer.index.count, "classes": classes, "skipped": [], "labelled": True,
                   "class_counts": {c: sum(1 for _, lab, _ in items if lab == k) for k, c in enumerate(classes)},
                   "payload_bytes": sum(len(p) for _, _, p in items)})
    return dst


def jpeg_bytes(size: tuple[int, int] = (48, 40), seed: int = 0) -> bytes:
    """A small real JPEG."""
    from PIL import Image

    from tests.image_factory import textured_rgb

    out = io.BytesIO()
    Image.fromarray(textured_rgb(size, seed)).save(out, "JPEG", quality=85)
    return out.getvalue()


def jpeg_bomb(width: int = 60000, height: int = 60000) -> bytes:
    """A small JPEG whose frame header claims ``width`` x ``height`` pixels."""
    data = bytearray(jpeg_bytes())
    at = data.find(b"\xff\xc0")
    data[at + 5 : at + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    return bytes(data)


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


# -- fuzzing ---------------------------------------------------------------------------------------------


def fuzz_decoders(examples: int, seed: int = 0) -> dict[str, Any]:
    """Hypothesis over the record-header, index and manifest decoders: each input either decodes or
    raises ``PackFormatError``; anything else is a problem. Returns examples run and problems."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed
    from hypothesis import strategies as st

    from packload.core.errors import PackFormatError
    from packload.core.format import (
        FORMAT_VERSION,
        INDEX_ENTRY,
        INDEX_MAGIC,
        RECORD_MAGIC,
        check_entries_fit,
        decode_index,
        decode_manifest,
        decode_record_header,
        entry_path,
    )

    counts = {"record header": 0, "index": 0, "manifest": 0}
    problems: list[str] = []
    config = settings(max_examples=examples, deadline=None, database=None, derandomize=False,
                      suppress_health_check=list(HealthCheck))

    def guard(kind: str, call: Callable[[], Any]) -> None:
        counts[kind] += 1
        try:
            call()
        except PackFormatError:
            pass
        except Exception as exc:  # noqa: BLE001 - what the fuzz looks for
            problems.append(f"{kind}: {type(exc).__name__}: {exc}")

    def forged(body: bytes, path: bytes, tail: bytes) -> bytes:
        body = (body + bytes(48))[:48]
        body = body[:32] + len(path).to_bytes(2, "little") + body[34:]
        return RECORD_MAGIC + zlib.crc32(path, zlib.crc32(body)).to_bytes(4, "little") + body + path + tail

    records = st.one_of(st.binary(max_size=300), st.binary(max_size=300).map(lambda b: RECORD_MAGIC + b),
                        st.builds(forged, st.binary(min_size=48, max_size=48), st.binary(max_size=40),
                                  st.binary(max_size=120)))

    @hseed(seed)
    @config
    @given(records, st.integers(-8, 80))
    def record_case(buf: bytes, offset: int) -> None:
        def run() -> None:
            meta, start, length, _ = decode_record_header(memoryview(buf), offset)
            assert 0 <= offset and start + length <= len(buf) and isinstance(meta.path, str)
        guard("record header", run)

    def index_blob(count: int, paths_len: int, body: bytes, version: int) -> bytes:
        need = count * INDEX_ENTRY.itemsize + paths_len
        body = (body * (need // max(len(body), 1) + 1))[:need] if body else bytes(need)
        return (INDEX_MAGIC + version.to_bytes(4, "little") + count.to_bytes(8, "little") + (64).to_bytes(4, "little")
                + bytes(4) + paths_len.to_bytes(8, "little") + body)

    indexes = st.one_of(st.binary(max_size=400),
                        st.builds(index_blob, st.integers(0, 5), st.integers(0, 60), st.binary(max_size=400),
                                  st.sampled_from([FORMAT_VERSION, FORMAT_VERSION, 0, 2, 2**32 - 1])))

    @hseed(seed)
    @config
    @given(indexes, st.lists(st.integers(0, 2**64 - 1), max_size=4))
    def index_case(buf: bytes, parts: list[int]) -> None:
        def run() -> None:
            entries, paths = decode_index(buf, "fuzz")
            for i in range(len(entries)):
                entry_path(entries, paths, i)
            check_entries_fit(entries, np.array(parts, dtype=np.uint64), "fuzz")
        guard("index", run)

    json_values = st.recursive(
        st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=12)
    valid = {"format": "packload", "version": 1, "backend": "shards", "encoding": "keep", "records": 2,
             "classes": ["a"], "skipped": [], "class_counts": {"a": 2}, "payload_bytes": 10,
             "index": {"name": "index.bin", "size": 160, "sha256": "0" * 64},
             "parts": [{"name": "shard-00000.bin", "size": 100, "sha256": "0" * 64, "records": 2}],
             "ignored": [], "source": {"name": "s", "files": 2, "bytes": 10}, "options": {}, "labelled": True}

    def mutated(key: str, value: Any) -> bytes:
        return json.dumps(dict(valid, **{key: value})).encode()

    manifests = st.one_of(st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode()),
                          st.builds(mutated, st.sampled_from(sorted(valid)), json_values))

    @hseed(seed)
    @config
    @given(manifests)
    def manifest_case(raw: bytes) -> None:
        def run() -> None:
            manifest = decode_manifest(raw, "fuzz")
            _use_manifest(manifest)
        guard("manifest", run)

    record_case()
    index_case()
    manifest_case()
    return {"examples": counts, "problems": sorted(set(problems))}


def _use_manifest(manifest: dict[str, Any]) -> None:
    """A decoded manifest must have the documented types in every field that info and verify use."""
    def kind(key: str, types: type | tuple[type, ...], default: Any = None) -> Any:
        value = manifest.get(key, default)
        assert isinstance(value, types), f"decoded manifest has {key} = {value!r}"
        return value

    counts = kind("class_counts", dict, {})
    assert all(isinstance(v, int) for v in counts.values()), f"class_counts = {counts!r}"
    kind("payload_bytes", (int, type(None)))
    index = kind("index", dict, {})
    assert isinstance(index.get("sha256", ""), str), f"index = {index!r}"
    kind("ignored", list, [])
    kind("source", dict, {})
    kind("options", dict, {})
    if manifest["backend"] == "shards":
        parts = kind("parts", list, [])
        assert all(isinstance(p, dict) and isinstance(p.get("name"), str) for p in parts), f"parts = {parts!r}"
    else:
        kind("parts", dict, {})


# -- full disk ---------------------------------------------------------------------------------------------


def snapshot(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _run_pack(args: list[str], preexec: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
    script = ("import sys; from tests.reliability_tools import small_chunks; from packload.cli import module_main\n"
              "with small_chunks(): code = module_main(sys.argv[1:])\nsys.exit(code)")
    return subprocess.run([sys.executable, "-c", script, *args, "--quiet", "--shard-size", str(SHARD_SIZE),
                           "--workers", "1"], cwd=REPO, env=_env(), capture_output=True, text=True,
                          preexec_fn=preexec, timeout=300)


def write_limit_check(source: Path, workdir: Path, reference: Path, backend: str, kind: str,
                      limit: int) -> dict[str, Any]:
    """Pack ``source`` into a space of ``limit`` bytes (``kind`` ``tmpfs``, needs root) or under a
    file-size limit of ``limit`` bytes (``fsize``): one-line error, non-zero exit, nothing at the
    destination, partial output refused, source untouched; then, with room again, ``--resume``
    gives the same records as ``reference``."""
    from packload import PackReader
    from packload.core.errors import PackloadError
    from packload.packer.pipeline import partial_path

    problems: list[str] = []
    before = snapshot(source)
    where = workdir / f"{kind}-{limit}"
    where.mkdir()
    mounted = False
    if kind == "tmpfs":
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={limit}", "tmpfs", str(where)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            return {"skipped": f"cannot mount tmpfs: {done.stderr.strip()}", "problems": []}
        mounted = True
    dst = where / f"x.{backend}"
    try:
        def cap() -> None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        result = _run_pack([str(source), str(dst)], cap if kind == "fsize" else None)
        problem = one_line_error(result.returncode, result.stderr)
        if problem:
            problems.append(f"pack: {problem}")
        elif not any(s in result.stderr for s in ("No space", "too large", "File too large", "free")):
            problems.append(f"the error does not say what ran out: {result.stderr.strip()!r}")
        elif "--resume" not in result.stderr:
            problems.append(f"the error does not say how to go on: {result.stderr.strip()!r}")
        if dst.exists():
            problems.append("something was published at the destination")
        partial = partial_path(dst)
        try:
            PackReader(partial).close()
            problems.append("the partial output opens as a pack")
        except PackloadError:
            pass
        except Exception as exc:  # noqa: BLE001
            problems.append(f"opening the partial output: {type(exc).__name__}: {exc}")
        if snapshot(source) != before:
            problems.append("the source changed")
        if kind == "tmpfs":
            subprocess.run(["mount", "-o", "remount,size=256m", str(where)], check=True)
        resumed = _run_pack([str(source), str(dst), "--resume"])
        if resumed.returncode != 0:
            problems.append(f"--resume after freeing room failed: {resumed.stderr.strip()!r}")
        elif records_of(dst) != records_of(reference):
            problems.append("the resumed pack differs from the uninterrupted one")
        return {"backend": backend, "kind": kind, "limit": limit, "exit": result.returncode,
                "error": result.stderr.strip(), "problems": problems}
    finally:
        if mounted:
            subprocess.run(["umount", str(where)], check=False)


def lmdb_map_growth_check(source: Path, dst: Path, reference: Path) -> dict[str, Any]:
    """``pack`` into an LMDB map far smaller than the data: the map grows, the pack completes, and
    its records equal ``reference``'s."""
    import packload.packer.pipeline as pipeline

    base = small_chunk_writer()
    grown: list[int] = []

    class TinyMap(base):  # type: ignore[misc, valid-type]
        def __init__(self, path: Path, map_size: int, chunk_size: int = LMDB_CHUNK) -> None:
            super().__init__(path, 64 << 10, chunk_size)

        def finish(self, manifest: dict[str, Any]) -> dict[str, Any]:
            self._commits().commit({})  # everything so far committed: the map has grown as it needed
            grown.append(self.env.info()["map_size"])
            return super().finish(manifest)

    saved = pipeline.LmdbWriter
    pipeline.LmdbWriter = TinyMap
    try:
        from packload import pack

        pack(source, dst, workers=1, progress=False, shard_size=SHARD_SIZE)
    finally:
        pipeline.LmdbWriter = saved
    problems = [] if records_of(dst) == records_of(reference) else ["records differ after the map grew"]
    return {"start_map": 64 << 10, "final_map": grown[0], "pack_bytes": dst.stat().st_size, "problems": problems}


# -- many readers ------------------------------------------------------------------------------------------


def fd_count() -> int:
    """Open file descriptors of this process."""
    return len(os.listdir("/proc/self/fd"))


def file_fd_count() -> int:
    """Open descriptors of files (not pipes, sockets or the shared memory that DataLoader workers
    pass tensors through, whose number varies with the batches in flight)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/") and not target.startswith(("/dev/shm", "/proc/")) and "(deleted)" not in target:
            count += 1
    return count


def pack_maps(root: str) -> int:
    """Memory maps of files under ``root`` in this process."""
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if root in line)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class ProbeDataset:
    """A ``PackedImageFolder`` (checksums on) that also reports, per sample, the worker's pid, open
    file descriptors and resident memory."""

    def __init__(self, root: str) -> None:
        from packload import PackedImageFolder

        self.root = str(Path(root).resolve())
        self.ds = PackedImageFolder(root, output="numpy", verify=True)

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> tuple[int, int, int, int, int, int, int]:
        image, label = self.ds[i]
        return (i, label, zlib.crc32(image.tobytes()), os.getpid(), file_fd_count(), pack_maps(self.root),
                rss_bytes())


def load_check(pack: Path, workers: int, epochs: int, persistent: bool, start_method: str,
               batch_size: int = 8) -> dict[str, Any]:
    """``workers`` DataLoader workers over one pack for ``epochs`` epochs: every record each epoch
    with the right pixels, and file descriptors (parent and workers) and RSS per epoch."""
    from torch.utils.data import DataLoader

    from packload import PackedImageFolder

    ds = ProbeDataset(str(pack))
    reference = PackedImageFolder(pack, output="numpy")
    crcs = [zlib.crc32(reference[i][0].tobytes()) for i in range(len(reference))]
    labels = list(reference.targets)
    reference.close()
    sampler = reference.sampler(shuffle=True, seed=1)
    loader = DataLoader(ds, batch_size=batch_size, sampler=sampler, num_workers=workers,  # type: ignore[arg-type]
                        persistent_workers=persistent, multiprocessing_context=start_method, timeout=300)
    per_epoch = []
    problems: list[str] = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        seen: list[int] = []
        worker_fds: dict[int, int] = {}
        worker_rss: dict[int, int] = {}
        worker_maps: dict[int, int] = {}
        for index, label, crc, pid, fds, maps, rss in loader:
            for i, y, c, p, f, m, r in zip(index.tolist(), label.tolist(), crc.tolist(), pid.tolist(), fds.tolist(),
                                           maps.tolist(), rss.tolist(), strict=True):
                seen.append(i)
                if y != labels[i] or c != crcs[i]:
                    problems.append(f"epoch {epoch}: record {i} read wrong")
                worker_fds[p] = max(worker_fds.get(p, 0), f)
                worker_maps[p] = max(worker_maps.get(p, 0), m)
                worker_rss[p] = max(worker_rss.get(p, 0), r)
        gc.collect()
        if per_epoch:  # workers that just exited may take a moment to release their pipes
            deadline = time.monotonic() + 2.0
            while fd_count() > per_epoch[0]["parent_fds"] and time.monotonic() < deadline:
                time.sleep(0.05)
        if sorted(seen) != list(range(len(labels))):
            problems.append(f"epoch {epoch}: {len(seen)} samples, not each of the {len(labels)} records once")
        per_epoch.append({"parent_fds": fd_count(), "parent_rss_mb": round(rss_bytes() / 2**20, 1),
                          "workers_seen": len(worker_fds), "worker_fds_max": max(worker_fds.values()),
                          "worker_pack_maps_max": max(worker_maps.values()),
                          "worker_rss_mb_max": round(max(worker_rss.values()) / 2**20, 1)})
    del loader
    gc.collect()
    first, last = per_epoch[min(1, epochs - 1)], per_epoch[-1]
    if last["parent_fds"] > first["parent_fds"]:
        problems.append(f"parent file descriptors grew: {[e['parent_fds'] for e in per_epoch]}")
    if last["worker_fds_max"] > first["worker_fds_max"]:
        problems.append(f"worker file descriptors grew: {[e['worker_fds_max'] for e in per_epoch]}")
    if last["worker_pack_maps_max"] > first["worker_pack_maps_max"]:
        problems.append(f"worker maps of the pack grew: {[e['worker_pack_maps_max'] for e in per_epoch]}")
    if last["worker_rss_mb_max"] > first["worker_rss_mb_max"] + 64:
        problems.append(f"worker RSS grew: {[e['worker_rss_mb_max'] for e in per_epoch]} MB")
    if last["parent_rss_mb"] > first["parent_rss_mb"] + 64:
        problems.append(f"parent RSS grew: {[e['parent_rss_mb'] for e in per_epoch]} MB")
    if any(e["workers_seen"] > workers for e in per_epoch):
        problems.append("more worker processes than asked for")
    return {"backend": "lmdb" if pack.is_file() else "shards", "workers": workers, "epochs": epochs,
            "persistent": persistent, "start_method": start_method, "per_epoch": per_epoch,
            "problems": problems}


# -- hostile packs, all together ---------------------------------------------------------------------------


@contextlib.contextmanager
def address_space_cap(headroom: int = MEMORY_HEADROOM) -> Iterator[None]:
    """Cap this process's address space at its size now plus ``headroom`` while the block runs, so
    an absurd allocation raises MemoryError instead of exhausting the machine."""
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm + headroom, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _index_cases() -> dict[str, dict[str, Any]]:
    """Crafted index fields (with the manifest's index sha256 made to match): name → fields."""
    return {
        "index count 2**40": {"count": 2**40},
        "negative payload offset": {"payload_offset": (0, 2**64 - 8)},
        "payload length 2**63": {"payload_len": (1, 2**63)},
        "record offset past the part": {"record_offset": (0, 10**12)},
        "part 10**6": {"part": (0, 10**6)},
        "path offset past the blob": {"path_offset": (0, 10**9)},
        "label 99 of 3 classes": {"label": (0, 99)},
        "label -7": {"label": (1, -7)},
        "payload format code 200": {"format": (0, 200)},
        "index version 2": {"version": 2},
    }


def _manifest_cases(backend: str) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
    cases: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
        "manifest records 10**12": lambda m: dict(m, records=10**12),
        "manifest records -1": lambda m: dict(m, records=-1),
        "manifest version 2": lambda m: dict(m, version=2),
        "manifest format other": lambda m: dict(m, format="other"),
        "manifest backend zip": lambda m: dict(m, backend="zip"),
        "manifest class_counts a list": lambda m: dict(m, class_counts=[1, 2]),
        "manifest payload_bytes a string": lambda m: dict(m, payload_bytes="many"),
        "manifest index a list": lambda m: dict(m, index=[1]),
        "manifest parts a string": lambda m: dict(m, parts="all"),
    }
    if backend == "shards":
        def part(m: dict[str, Any], **fields: Any) -> dict[str, Any]:
            return dict(m, parts=[dict(m["parts"][0], **fields), *m["parts"][1:]])

        cases.update({
            "shard name ../../outside.bin": lambda m: part(m, name="../../outside.bin"),
            "shard name absolute": lambda m: part(m, name="/etc/hostname"),
            "shard size 2**62": lambda m: part(m, size=2**62),
            "shard size -5": lambda m: part(m, size=-5),
        })
    else:
        cases["manifest chunks -1"] = lambda m: dict(m, parts={"chunks": -1, "chunk_size": 1})
    return cases


def _exercise(pack: Path, workdir: Path) -> dict[str, Any]:
    """Open, read (checksums on and off), info, verify, verify --decode and unpack a hostile pack.
    Returns each step's outcome: ``ok``, ``refused: message`` or ``FOREIGN: exception``."""
    from packload import PackedImageFolder
    from packload.core.errors import PackloadError

    steps: dict[str, str] = {}
    for verify in (True, False):
        name = f"read (checksums {'on' if verify else 'off'})"
        try:
            ds = PackedImageFolder(pack, verify=verify, output="numpy")
            try:
                for lo in range(0, len(ds), 8):
                    ds.__getitems__(list(range(lo, min(len(ds), lo + 8))))
                steps[name] = "ok"
            finally:
                ds.close()
        except PackloadError as exc:
            steps[name] = f"refused: {exc}"
        except Exception as exc:  # noqa: BLE001
            steps[name] = f"FOREIGN: {type(exc).__name__}: {exc}"
    out = workdir / "unpacked" / pack.name
    for key, command in (("info", ["info", str(pack)]), ("verify", ["verify", "--quiet", str(pack)]),
                         ("verify --decode", ["verify", "--decode", "--quiet", str(pack)]),
                         ("unpack", ["unpack", "--quiet", str(pack), str(out)])):
        stdout = io.StringIO()
        code, err = cli(command, stdout)
        if code == 0:
            steps[key] = "ok"
        elif key.startswith("verify") and code == 1 and not err.strip():
            steps[key] = "reported: " + " | ".join(stdout.getvalue().strip().splitlines()[1:4])
        else:
            problem = one_line_error(code, err)
            steps[key] = f"FOREIGN: {problem}" if problem else f"refused: {err.strip()}"
    return steps


def _tiny_source(workdir: Path) -> Path:
    src = workdir / "tiny-src"
    if not src.is_dir():
        make_source(src, per_class=2)
    return src


def _raw_options() -> Any:
    from packload.packer.encode import EncodeOptions

    return EncodeOptions(encoding="raw", size=(8, 8))


def pack_time_bombs(workdir: Path) -> dict[str, Any]:
    """A source holding decompression bombs (a PNG and a JPEG whose headers claim billions of
    pixels): ``pack`` skips each with a reason that names ``--max-pixels``; ``--strict`` stops with a
    one-line error that does too. Every check mode and encoding is tried."""
    from packload import PackReader, pack
    from packload.packer.encode import EncodeOptions
    from tests.image_factory import decompression_bomb_png

    src = workdir / "bomb-src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "fine.jpg").write_bytes(jpeg_bytes())
    (src / "a" / "bomb.png").write_bytes(decompression_bomb_png())
    (src / "a" / "bomb.jpg").write_bytes(jpeg_bomb())
    problems: list[str] = []
    runs = 0
    for k, (check, encoding) in enumerate([("fast", "keep"), ("full", "keep"), ("fast", "jpeg"), ("fast", "raw")]):
        for backend in ("lmdb", "shards"):
            runs += 1
            dst = workdir / f"bombs-{k}.{backend}"
            size = (8, 8) if encoding == "raw" else None
            with address_space_cap():
                summary = pack(src, dst, options=EncodeOptions(encoding=encoding, check=check, size=size), workers=1,
                               progress=False)
            with PackReader(dst) as reader:
                reasons = {item["path"]: item["reason"] for item in reader.manifest["skipped"]}
            if summary["records"] != 1 or sorted(reasons) != ["a/bomb.jpg", "a/bomb.png"]:
                problems.append(f"{check}/{encoding}/{backend}: packed {summary['records']}, skipped {sorted(reasons)}")
            problems += [f"{check}/{encoding}/{backend}: {path}: reason does not say how to raise the limit: {why}"
                         for path, why in reasons.items() if "--max-pixels" not in why]
        code, err = cli(["pack", str(src), str(workdir / f"strict-{k}.shards"), "--strict", "--quiet",
                         "--check", check, "--encoding", encoding, *(["--size", "8x8"] if size else [])])
        runs += 1
        problem = one_line_error(code, err)
        if problem or "--max-pixels" not in err:
            problems.append(f"--strict {check}/{encoding}: {problem or err.strip()}")
    return {"runs": runs, "problems": problems}


def hostile_suite(base: dict[str, Path], workdir: Path) -> dict[str, Any]:
    """Crafted indexes, manifests, record paths and bombs against copies of the packs in ``base``
    (backend → pack). Every case must be refused by every command, with our one-line error, nothing
    written outside the unpack folder, nothing unpickled. Returns per-case outcomes and problems."""
    import pickle

    from tests.image_factory import decompression_bomb_png

    outcomes: dict[str, dict[str, str]] = {}
    problems: list[str] = []
    cases: list[tuple[str, Path, bool]] = []  # name, pack, must every command refuse it
    workdir.mkdir(parents=True, exist_ok=True)
    for backend, pack in base.items():
        for name, fields in _index_cases().items():
            copy = copy_pack(pack, workdir / f"{backend}-{len(cases)}{pack.suffix}")
            rewrite(copy, index=index_with(copy, **fields))
            cases.append((f"{backend}: {name}", copy, True))
        from packload import PackReader

        with PackReader(pack) as reader:
            manifest = dict(reader.manifest)
        for name, change in _manifest_cases(backend).items():
            copy = copy_pack(pack, workdir / f"{backend}-{len(cases)}{pack.suffix}")
            rewrite(copy, manifest=change(manifest))
            cases.append((f"{backend}: {name}", copy, True))
        copy = copy_pack(pack, workdir / f"{backend}-{len(cases)}{pack.suffix}")  # huge but harmless: read
        rewrite(copy, manifest=dict(manifest, classes=[str(k) for k in range(10**5)]))
        cases.append((f"{backend}: manifest with 10**5 classes (labels still in range)", copy, False))
        if backend == "shards":
            copy = copy_pack(pack, workdir / f"{backend}-{len(cases)}{pack.suffix}")
            with open(copy / "shard-00000.bin", "r+b") as f:
                f.seek(4)
                f.write((2).to_bytes(4, "little"))
            cases.append((f"{backend}: shard header version 2", copy, True))
        for path in ("../escape.png", str(workdir / "absolute.png"), "a/../../up.png", "a\\..\\win.png", "a//b.png",
                     "./dot.png", "a/nul\0.png", ""):
            crafted = craft_pack(workdir / f"{backend}-{len(cases)}{pack.suffix}",
                                 [("a/fine.jpg", 0, jpeg_bytes()), (path, 0, jpeg_bytes(seed=1))])
            cases.append((f"{backend}: record path {path!r}", crafted, False))
        raw = workdir / f"{backend}-raw{pack.suffix}"
        pack_small(_tiny_source(workdir), raw, options=_raw_options())
        for name, fields in {"raw width 1 too large": {"width": (0, 9)},
                             "raw height 2**32-1": {"height": (1, 2**32 - 1)}}.items():
            copy = copy_pack(raw, workdir / f"{backend}-{len(cases)}{pack.suffix}")
            rewrite(copy, index=index_with(copy, **fields))
            cases.append((f"{backend}: {name}", copy, True))
        bombs = craft_pack(workdir / f"{backend}-bombs{pack.suffix}",
                           [("a/png-bomb.png", 0, decompression_bomb_png()), ("a/jpeg-bomb.jpg", 0, jpeg_bomb())])
        cases.append((f"{backend}: decompression bombs", bombs, False))
    before = files_under(workdir)
    real = (pickle.loads, pickle.load)

    def no_unpickling(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a pack made packload unpickle something")

    pickle.loads = pickle.load = no_unpickling  # type: ignore[assignment]
    try:
        with address_space_cap():
            for name, pack, all_refuse in cases:
                steps = _exercise(pack, workdir)
                outcomes[name] = steps
                for step, outcome in steps.items():
                    if outcome.startswith("FOREIGN"):
                        problems.append(f"{name}: {step}: {outcome}")
                must = ("read (checksums on)", "verify", "unpack") if all_refuse else ()
                must += ("unpack",) if "record path" in name else ()
                must += ("read (checksums on)", "read (checksums off)", "verify --decode") if "bombs" in name else ()
                problems += [f"{name}: {step} accepted it" for step in must if steps[step] == "ok"]
                if "bombs" in name:
                    for step in ("read (checksums on)", "read (checksums off)", "verify --decode"):
                        if "MAX_IMAGE_PIXELS" not in steps[step]:
                            problems.append(f"{name}: {step} does not say how to raise the limit: {steps[step]}")
    finally:
        pickle.loads, pickle.load = real  # type: ignore[assignment]
    unpacked = workdir / "unpacked"
    escaped = sorted(str(p) for p in files_under(workdir) - before if p != unpacked and unpacked not in p.parents)
    escaped += [p for p in ("absolute.png", "escape.png", "up.png") if (workdir.parent / p).exists()]
    if escaped:
        problems.append(f"files written outside the unpack folders: {escaped}")
    bombs = pack_time_bombs(workdir / "pack-time")
    problems += [f"pack-time bombs: {p}" for p in bombs["problems"]]
    return {"cases": len(cases), "outcomes": outcomes, "pack_time_bomb_runs": bombs["runs"], "problems": problems}
