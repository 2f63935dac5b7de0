"""One writer per destination: a second ``pack``, ``pack --resume`` or ``merge`` of a destination
that another packload process is writing is refused at once, in one line naming that process, and
the first one finishes undisturbed (its pack complete at DEST, nothing else left beside it).

The first command runs in a child process that stops at a chosen point (while encoding, or with
the finished pack about to be renamed into place) until the test lets it go on.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from packload.core.errors import UsageError
from packload.loaders.verify import verify
from packload.packer.destination import lock_path
from packload.packer.destination_lock import DestinationLock
from tests.image_factory import make_image_folder
from tests.reliability.packs import REPO, child_env, cli, one_line_error, records_of

# Runs ``packload ARGS`` and stops once, at PHASE ("encode": before the first files are encoded;
# "publish": with the finished pack about to be renamed into place), printing "holding" and
# waiting there until the file RELEASE exists.
HOLDING_CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import packload.packer.encode_stream as p
    from packload.packer.pack_destination import PackDestination
    from packload.cli import main

    release, phase, argv = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    def hold():
        print("holding", flush=True)
        deadline = time.monotonic() + 120
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    if phase == "publish":
        real_publish = PackDestination.publish  # pack's and merge's
        def publish(self):
            hold()
            real_publish(self)
        PackDestination.publish = publish
    else:
        real_encode, held = p.encode_chunk, []
        def encode_chunk(root, samples, options):
            if not held:
                held.append(1)
                hold()
            return real_encode(root, samples, options)
        p.encode_chunk = encode_chunk
    sys.exit(main(argv))
""")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A source folder and, for merges, two packs of it (one per backend)."""
    base = tmp_path_factory.mktemp("writers")
    make_image_folder(base / "src", classes=("a", "b"), per_class=6, seed=7)
    out = {"src": base / "src"}
    for backend in ("lmdb", "shards"):
        out[backend] = base / f"in.{backend}"
        assert cli(["pack", str(out["src"]), str(out[backend]), "--quiet"])[0] == 0
    return out


def command(kind: str, inputs: dict[str, Path], dst: Path) -> list[str]:
    if kind == "merge":
        return ["merge", str(dst), str(inputs["lmdb"]), str(inputs["shards"]), "--quiet"]
    flags = ["--resume"] if kind == "resume" else ["--overwrite"] if kind == "overwrite" else []
    return ["pack", str(inputs["src"]), str(dst), "--workers", "1", "--quiet", *flags]


def start_holding(args: list[str], phase: str, release: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDING_CHILD, str(release), phase, *args], cwd=REPO, env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip() if proc.stdout else ""
    if line != "holding":
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"the first command did not get to {phase}: {line!r} {err}")
    assert proc.poll() is None, "the first command must still be running, held at its phase"
    return proc


# (first, second, where the first is held): pack/pack, pack/--resume, pack/merge, merge/pack, merge/merge
CASES = [("pack", "pack", "encode"), ("pack", "overwrite", "publish"), ("pack", "resume", "encode"),
         ("pack", "resume", "publish"), ("pack", "merge", "encode"), ("merge", "overwrite", "publish"),
         ("merge", "merge", "publish")]


@pytest.mark.parametrize("backend", ["lmdb", "shards"])
@pytest.mark.parametrize(("first", "second", "phase"), CASES)
def test_a_second_writer_is_refused_and_the_first_finishes(inputs: dict[str, Path], tmp_path: Path, backend: str,
                                                           first: str, second: str, phase: str) -> None:
    dst = tmp_path / f"out.{backend}"
    release = tmp_path / "release"
    proc = start_holding(command(first, inputs, dst), phase, release)
    try:
        code, err = cli(command(second, inputs, dst))
        assert one_line_error(code, err) is None, err
        assert code == 2, err
        assert f"another packload command (pid {proc.pid}) is writing {dst}; wait for it to finish" in err
    finally:
        release.touch()
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert verify(dst, progress=False)["ok"]
    expected = (records_of(inputs["lmdb"]) + records_of(inputs["shards"]) if first == "merge"
                else records_of(inputs[backend]))
    assert records_of(dst) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([dst.name, "release"])  # no .partial, .lock, .old


def test_a_lock_left_by_a_killed_command_is_taken(inputs: dict[str, Path], tmp_path: Path) -> None:
    dst = tmp_path / "out.lmdb"
    release = tmp_path / "release"
    proc = start_holding(command("pack", inputs, dst), "encode", release)
    proc.kill()
    proc.communicate()
    assert lock_path(dst).exists()  # a SIGKILL leaves the lock file, but not the lock
    assert cli(command("resume", inputs, dst))[0] == 0
    assert verify(dst, progress=False)["ok"] and not lock_path(dst).exists()


class _SlowFlock:
    """``fcntl`` whose ``flock`` waits a moment first: widens the gap between opening the lock file
    and locking it, in which its owner may let go of it and remove it."""

    def __init__(self, seed: int) -> None:
        import fcntl
        import random

        self._fcntl, self._random = fcntl, random.Random(seed)
        self.LOCK_EX, self.LOCK_NB = fcntl.LOCK_EX, fcntl.LOCK_NB

    def flock(self, fd: int, operation: int) -> None:
        time.sleep(self._random.random() * 0.002)
        self._fcntl.flock(fd, operation)


def _take_turns(dst: str, owner: str, rounds: int, errors: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    """Take the lock ``rounds`` times; while holding it, ``owner`` must be ours alone."""
    import packload.packer.destination_lock

    packload.packer.destination_lock.fcntl = _SlowFlock(os.getpid())  # type: ignore[assignment]
    taken = 0
    while taken < rounds:
        lock = DestinationLock(Path(dst))
        try:
            lock.acquire()
        except UsageError:
            time.sleep(0.001)
            continue
        try:
            fd = os.open(owner, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.close(fd)
        except FileExistsError:
            errors.put(f"pid {os.getpid()} holds the lock while another does")
            lock.release()
            return
        time.sleep(0.0005)
        os.unlink(owner)
        lock.release()
        taken += 1


def test_the_lock_file_is_removed_without_letting_two_writers_in(tmp_path: Path) -> None:
    """Each owner removes the lock file as it lets go; one that opened the old file meanwhile must
    notice and lock the new one, so that two never hold the lock at once."""
    context = multiprocessing.get_context("fork")
    errors = context.Queue()
    dst, owner = str(tmp_path / "x.lmdb"), str(tmp_path / "owner")
    workers = [context.Process(target=_take_turns, args=(dst, owner, 60, errors)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert [worker.exitcode for worker in workers] == [0] * 4
    assert errors.empty(), errors.get()
    assert not lock_path(Path(dst)).exists()


@pytest.mark.parametrize("backend", ["lmdb", "shards"])
def test_the_ray_driver_is_refused_too(inputs: dict[str, Path], tmp_path: Path, backend: str) -> None:
    """``pack --engine ray`` takes the same lock, before it starts or reaches Ray."""
    pytest.importorskip("ray", reason="Ray is not installed")
    dst = tmp_path / f"out.{backend}"
    release = tmp_path / "release"
    proc = start_holding(command("pack", inputs, dst), "encode", release)
    try:
        code, err = cli(["pack", str(inputs["src"]), str(dst), "--engine", "ray", "--overwrite", "--quiet"])
        assert code == 2 and f"another packload command (pid {proc.pid}) is writing {dst}" in err, err
    finally:
        release.touch()
        proc.communicate(timeout=120)
    assert proc.returncode == 0 and verify(dst, progress=False)["ok"]
