"""An emulated slow disk: a read-only passthrough FUSE filesystem that adds latency to requests.

    python benchmarks/slowfs.py SRC MOUNTPOINT --latency-ms 2 [--mbps 200] [--meta-latency-ms 0]

mounts SRC read-only at MOUNTPOINT (in the foreground; Ctrl-C or ``umount MOUNTPOINT`` ends it).
Every ``open`` and every ``read`` request the kernel sends waits ``--latency-ms`` before it is
served; ``--mbps`` caps the bandwidth of all reads together (MB/s, 10**6 bytes); ``--meta-latency-ms``
(default 0) delays every ``getattr`` (which also serves the kernel's lookups) and ``readdir``.
Requests are served by many threads, so concurrent requests overlap as on a network disk: latency
adds per request, not per byte. Symlinks under SRC are shown as what they point to, so one folder of
links can gather data and packs from several places behind one mount.

The kernel cuts reads into requests of at most 128 KiB (libfuse 2), caches file pages like NFS
(``auto_cache``: kept across opens while the file is unchanged) and caches attributes for a second.

Counters (opens, read requests, bytes, the size of every read request, the peak number of reads in
flight) are readable while mounted from the hidden file ``MOUNTPOINT/.slowfs-stats`` (JSON; not
listed, not counted, never delayed) and are written to ``--stats-file`` when the filesystem stops.

The server is ``benchmarks/slowfs.c`` (libfuse 2, no Python in the data path, so the CPU it takes
per request, on the same cores as the reader under test, stays small); this file builds it on first
use (``cc`` and ``pkg-config fuse``, i.e. libfuse-dev, into ``~/.cache/packload/``, rebuilt when the
source changes), starts it, and reads its counters. From Python (needs root or fusermount,
``/dev/fuse``, a C compiler and libfuse-dev)::

    with SlowFS("data", "mnt", latency_ms=2) as fs:
        before = fs.stats()
        ...read files under mnt...
        print(fs.stats().minus(before).mean_read_kb)

Mounting runs in a child process; leaving the ``with`` block unmounts (``fusermount -u`` or
``umount``, lazily if busy) and waits for that process, also when the block raises.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATS_NAME = ".slowfs-stats"
MOUNT_TIMEOUT_S = 20.0
C_SOURCE = Path(__file__).resolve().with_name("slowfs.c")
_REPO = C_SOURCE.parent.parent


def unavailable() -> str | None:
    """None when a slowfs can be mounted here, else why not (for skips and benchmark notes)."""
    if not sys.platform.startswith("linux"):
        return f"FUSE mounts are only supported on Linux here, not {sys.platform}"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse (the kernel's FUSE device; containers need --device /dev/fuse)"
    if os.geteuid() != 0 and shutil.which("fusermount") is None:
        return "not root and no fusermount to mount as a user (apt-get install fuse)"
    return c_server()[1]


# ---------------------------------------------------------------- the compiled server


def _cache_dirs() -> list[Path]:
    """Where the compiled server may be cached: the user's cache, else the temp folder (never the repo)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    dirs = [Path(xdg) / "packload"] if xdg else []
    dirs += [Path.home() / ".cache" / "packload", Path(tempfile.gettempdir()) / f"packload-{os.geteuid()}"]
    return [d for d in dirs if not d.resolve().is_relative_to(_REPO)]


@functools.cache
def c_server() -> tuple[Path | None, str | None]:
    """The compiled server: ``(path, None)``, built on first use, or ``(None, why not)``.

    ``cc -O2 slowfs.c $(pkg-config fuse --cflags --libs)`` into a cache folder outside the repository,
    named by a hash of the source and flags, so a changed source is rebuilt and an unchanged one is not."""
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        return None, f"no C compiler ({cc}) to build the compiled server; apt-get install gcc"
    if shutil.which("pkg-config") is None:
        return None, "no pkg-config to find libfuse for the compiled server; apt-get install pkg-config libfuse-dev"
    flags = subprocess.run(["pkg-config", "fuse", "--cflags", "--libs"], capture_output=True, text=True)
    if flags.returncode != 0:
        return None, "pkg-config finds no libfuse 2 headers for the compiled server; apt-get install libfuse-dev"
    try:
        source = C_SOURCE.read_bytes()
    except OSError as exc:
        return None, f"{C_SOURCE.name}: {exc.strerror}"
    key = hashlib.sha256(source + b"\0" + cc.encode() + b"\0" + flags.stdout.encode()).hexdigest()[:16]
    why = "no writable cache folder for the compiled server"
    for folder in _cache_dirs():
        binary = folder / f"slowfs-{key}"
        if os.access(binary, os.X_OK):
            return binary, None
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=binary.name + ".", dir=folder)
            os.close(fd)
        except OSError:
            continue
        try:  # into a temporary name, then renamed: concurrent builds never see half a binary
            run = subprocess.run([cc, "-O2", "-o", tmp, str(C_SOURCE), *flags.stdout.split()],
                                 capture_output=True, text=True, timeout=120)
            if run.returncode != 0:
                last = (run.stderr.strip().splitlines() or ["?"])[-1]
                return None, f"the compiled server does not build ({cc}: {last})"
            os.chmod(tmp, 0o755)
            os.replace(tmp, binary)
            return binary, None
        except (OSError, subprocess.TimeoutExpired) as exc:
            why = f"the compiled server does not build ({exc})"
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return None, why


# ---------------------------------------------------------------- counters


@dataclass
class Stats:
    """What the filesystem served: counts, bytes and the size of every read request."""

    opens: int = 0
    reads: int = 0
    read_bytes: int = 0
    getattrs: int = 0
    readdirs: int = 0
    read_sizes: dict[int, int] = field(default_factory=dict)  # request size in bytes -> count
    max_reads_in_flight: int = 0
    delay_s: float = 0.0  # total time requests were held back (latency and bandwidth)

    @property
    def mean_read_kb(self) -> float:
        """Mean read request size in KiB (0 without reads)."""
        return self.read_bytes / self.reads / 1024 if self.reads else 0.0

    def minus(self, before: Stats) -> Stats:
        """The requests served since ``before`` was taken (the peak in flight is not a count: kept)."""
        sizes = {s: n - before.read_sizes.get(s, 0) for s, n in self.read_sizes.items()}
        return Stats(self.opens - before.opens, self.reads - before.reads, self.read_bytes - before.read_bytes,
                     self.getattrs - before.getattrs, self.readdirs - before.readdirs,
                     {s: n for s, n in sizes.items() if n}, self.max_reads_in_flight, self.delay_s - before.delay_s)

    def to_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["read_sizes"] = {str(s): n for s, n in sorted(self.read_sizes.items())}
        out["mean_read_kb"] = self.mean_read_kb
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Stats:
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["read_sizes"] = {int(s): int(n) for s, n in data.get("read_sizes", {}).items()}
        return cls(**fields)


# ---------------------------------------------------------------- mounting from Python


def unmount(mountpoint: str | os.PathLike[str], lazy: bool = False) -> bool:
    """Unmount a FUSE mount (``fusermount -u``, else ``umount``); True when it is gone."""
    mnt = str(mountpoint)
    tools = [["fusermount", "-u", *(["-z"] if lazy else []), mnt]] if shutil.which("fusermount") else []
    tools.append(["umount", *(["-l"] if lazy else []), mnt])
    for cmd in tools:
        if shutil.which(cmd[0]) and subprocess.run(cmd, capture_output=True).returncode == 0:
            return True
    return not os.path.ismount(mnt)


class SlowFS:
    """Mount ``source`` read-only at ``mountpoint`` with added latency, in a child process.

    Use as a context manager (``with SlowFS(src, mnt, latency_ms=2) as fs:``) or call
    :meth:`mount` and :meth:`close`. ``stats()`` reads the live counters; after closing,
    ``final_stats`` holds those written by the child when it stopped.
    """

    def __init__(self, source: str | os.PathLike[str], mountpoint: str | os.PathLike[str], latency_ms: float = 2.0,
                 mbps: float | None = None, meta_latency_ms: float = 0.0) -> None:
        self.source = Path(source)
        self.mountpoint = Path(mountpoint)
        self.latency_ms = latency_ms
        self.mbps = mbps
        self.meta_latency_ms = meta_latency_ms
        self.final_stats: Stats | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._stats_file: str | None = None
        self._log: Any = None
        self.last_log = ""

    def describe(self) -> dict[str, Any]:
        """The settings, for results files. ``"server": "c"``: the compiled server served (older
        results files may say ``"python"``: a fusepy server, since removed)."""
        return {"latency_ms": self.latency_ms, "mbps": self.mbps, "meta_latency_ms": self.meta_latency_ms,
                "delayed": "every open and read request" + (", getattr and readdir" if self.meta_latency_ms else ""),
                "server": "c"}

    def mount(self) -> SlowFS:
        """Start the child and wait until the mount is live; raises RuntimeError with the reason if not."""
        reason, binary = unavailable(), c_server()[0]
        if reason is not None or binary is None:
            raise RuntimeError(f"cannot mount a slowfs: {reason}")
        if not self.source.is_dir():
            raise RuntimeError(f"{self.source}: not a folder; give the folder to serve slowly")
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        if os.path.ismount(self.mountpoint):
            raise RuntimeError(f"{self.mountpoint}: something is mounted there already; unmount it first")
        fd, self._stats_file = tempfile.mkstemp(prefix="slowfs-", suffix=".json")
        os.close(fd)
        cmd = [str(binary), str(self.source), str(self.mountpoint),
               "--latency-ms", str(self.latency_ms), "--meta-latency-ms", str(self.meta_latency_ms),
               "--stats-file", self._stats_file, *(["--mbps", str(self.mbps)] if self.mbps else [])]
        # A file, not a pipe: a child blocked writing to a full pipe would hang every request.
        self._log = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log)
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not os.path.ismount(self.mountpoint):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                err = self.log_tail() if self._proc.poll() is not None else "timed out"
                self.close()
                raise RuntimeError(f"{self.mountpoint}: slowfs did not mount ({err.splitlines()[-1] if err else '?'})")
            time.sleep(0.02)
        return self

    def log_tail(self, chars: int = 2000) -> str:
        """The end of what the child wrote to stdout/stderr (its and libfuse's error messages)."""
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-chars:].strip()

    def stats(self) -> Stats:
        """The counters now (read from the hidden stats file; that read is not counted). One read
        request: the server writes the counters afresh for each, so a second request could see
        them grown by other readers meanwhile and the two parts would not join up."""
        fd = os.open(self.mountpoint / STATS_NAME, os.O_RDONLY)
        try:
            return Stats.from_json(json.loads(os.read(fd, 1 << 16)))
        finally:
            os.close(fd)

    def close(self) -> None:
        """Unmount (lazily if busy) and wait for the child; safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if os.path.ismount(self.mountpoint) and not unmount(self.mountpoint):
            time.sleep(0.5)
            if not unmount(self.mountpoint):
                unmount(self.mountpoint, lazy=True)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if os.path.ismount(self.mountpoint):  # the server is gone but the mount hangs on: detach it
            unmount(self.mountpoint, lazy=True)
        self.last_log = self.log_tail()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._stats_file:
            try:
                text = Path(self._stats_file).read_text()
                self.final_stats = Stats.from_json(json.loads(text)) if text else None
            finally:
                os.unlink(self._stats_file)
                self._stats_file = None

    def remount(self) -> None:
        """Unmount and mount again: empties every kernel cache of the mount (pages, attributes, entries)."""
        self.close()
        self.mount()

    def __enter__(self) -> SlowFS:
        return self.mount()

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/slowfs.py", description=__doc__.split("\n\n")[0])
    p.add_argument("source", type=Path, help="folder to serve")
    p.add_argument("mountpoint", type=Path, help="empty folder to mount it on")
    p.add_argument("--latency-ms", type=float, default=2.0, help="added to every open and read request")
    p.add_argument("--mbps", type=float, default=None, help="bandwidth cap of all reads together, MB/s")
    p.add_argument("--meta-latency-ms", type=float, default=0.0, help="added to every getattr/lookup and readdir")
    p.add_argument("--stats-file", default=None, help="write the counters here (JSON) when unmounted")
    args = p.parse_args(argv)
    if not args.source.is_dir():
        print(f"slowfs: {args.source}: not a folder; give the folder to serve", file=sys.stderr)
        return 2
    if not args.mountpoint.is_dir():
        print(f"slowfs: {args.mountpoint}: no such folder; create an empty folder to mount on", file=sys.stderr)
        return 2
    if args.latency_ms < 0 or args.meta_latency_ms < 0 or (args.mbps is not None and args.mbps <= 0):
        print("slowfs: latencies must be >= 0 and --mbps > 0", file=sys.stderr)
        return 2
    reason, binary = unavailable(), c_server()[0]
    if reason is not None or binary is None:
        print(f"slowfs: cannot mount: {reason}", file=sys.stderr)
        return 2
    # the compiled server takes over this process: signals and exit code are its own
    os.execv(binary, [str(binary), str(args.source), str(args.mountpoint), "--latency-ms", str(args.latency_ms),
                      "--meta-latency-ms", str(args.meta_latency_ms),
                      *(["--mbps", str(args.mbps)] if args.mbps else []),
                      *(["--stats-file", args.stats_file] if args.stats_file else [])])
    return 0  # not reached: execv returns only by raising


if __name__ == "__main__":
    sys.exit(main())
