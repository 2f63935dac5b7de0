"""Worker processes end when the command that started them is killed outright (``kill -9``)
(``packload.core.workers``): the pack pipeline's process pool, the synthetic image writer's pool,
and the portable fallback (a thread watching the parent) where Linux's parent-death signal is not
available."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from PIL import Image

from tests.image_factory import textured_rgb
from tests.reliability.packs import REPO, child_env

GONE_WITHIN = 5.0  # seconds the workers may take to end after their parent is killed


def children_of(pid: int) -> list[int]:
    """The pids of the live children of ``pid`` (through /proc where it exists, else psutil)."""
    tasks = Path(f"/proc/{pid}/task")
    if tasks.is_dir():
        found: list[int] = []
        for task in tasks.iterdir():
            try:
                found += [int(word) for word in (task / "children").read_text().split()]
            except OSError:
                pass  # a thread that ended meanwhile
        return found
    return [child.pid for child in psutil.Process(pid).children()]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_and_wait(proc: subprocess.Popen[bytes], workers: int, timeout: float = 120.0) -> list[int]:
    """Wait until ``proc`` has ``workers`` children, SIGKILL it, and return the children still
    running ``GONE_WITHIN`` seconds later."""
    deadline = time.monotonic() + timeout
    children: list[int] = []
    while time.monotonic() < deadline and proc.poll() is None:
        children = children_of(proc.pid)
        if len(children) >= workers:
            break
        time.sleep(0.05)
    if proc.poll() is not None:
        pytest.fail(f"the command ended (exit {proc.returncode}) before its {workers} workers were seen")
    assert len(children) >= workers, f"only {children} seen"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + GONE_WITHIN
    while time.monotonic() < deadline and any(alive(pid) for pid in children):
        time.sleep(0.1)
    left = [pid for pid in children if alive(pid)]
    for pid in left:  # do not leave them running after a failure
        os.kill(pid, signal.SIGKILL)
    return left


@pytest.fixture(scope="module")
def png_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """PNG files (so re-encoding them runs in worker processes, not threads): enough that packing
    them takes several seconds."""
    root = tmp_path_factory.mktemp("orphans") / "src"
    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
        for seed in range(3):
            Image.fromarray(textured_rgb((256, 256), seed=seed)).save(root / label / f"seed{seed}.png")
        first = [(root / label / f"seed{seed}.png").read_bytes() for seed in range(3)]
        for k in range(600):
            (root / label / f"img{k:04d}.png").write_bytes(first[k % 3])
    return root


@pytest.mark.parametrize("backend", ["lmdb", "shards"])
def test_pack_workers_end_when_pack_is_killed(png_source: Path, tmp_path: Path, backend: str) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "packload", "pack", str(png_source), str(tmp_path / f"x.{backend}"),
                             "--encoding", "png", "--check", "full", "--workers", "2", "--quiet"],
                            cwd=REPO, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert kill_and_wait(proc, workers=2) == []


# The synthetic image writer with each chunk of images taking ten minutes (workers busy, not
# waiting on their parent).
_SYNTHETIC_CHILD = textwrap.dedent("""
    import sys, time
    import packload.packer.synthetic as s
    def slow_chunk(job):
        time.sleep(600)
        return 0
    s._write_chunk = slow_chunk
    s.make_imagenet_like(sys.argv[1], count=100, workers=2, progress=False)
""")


def test_synthetic_workers_end_when_their_parent_is_killed(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _SYNTHETIC_CHILD, str(tmp_path / "out")], cwd=REPO, env=child_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert kill_and_wait(proc, workers=2) == []


# A process pool whose workers cannot use prctl (as on macOS): the watching thread must end them.
_FALLBACK_CHILD = textwrap.dedent("""
    import time
    import packload.core.workers as w
    w._set_death_signal = lambda: False
    pool = w.process_pool(2)
    futures = [pool.submit(time.sleep, 600) for _ in range(2)]
    time.sleep(600)
""")


def test_the_fallback_watcher_ends_workers_too() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _FALLBACK_CHILD], cwd=REPO, env=child_env())
    assert kill_and_wait(proc, workers=2) == []


def test_a_worker_whose_parent_is_already_gone_ends_at_once() -> None:
    """The parent may die before the worker sets its death signal: the worker then sees another
    parent than the one it was given, and ends."""
    script = "import sys; from packload.core.workers import die_with_parent; die_with_parent(int(sys.argv[1])); print('ran')"
    not_its_parent = os.getpid() + 1  # its parent is this process
    result = subprocess.run([sys.executable, "-c", script, str(not_its_parent)], cwd=REPO, env=child_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "ran" not in result.stdout
