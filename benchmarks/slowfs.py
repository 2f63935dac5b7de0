"""An emulated slow disk: a read-only passthrough FUSE filesystem that adds latency to requests.

    python benchmarks/slowfs.py SRC MOUNTPOINT --latency-ms 2 [--mbps 200] [--meta-latency-ms 0] [--server auto|c|python]

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

From Python (needs root or fusermount, ``/dev/fuse``, libfuse2, and libfuse-dev with a C compiler
for the compiled server or ``pip install -e ".[slowfs]"`` for the Python one)::

    with SlowFS("data", "mnt", latency_ms=2) as fs:
        before = fs.stats()
        ...read files under mnt...
        print(fs.stats().minus(before).mean_read_kb)

Mounting runs in a child process; leaving the ``with`` block unmounts (``fusermount -u`` or
``umount``, lazily if busy) and waits for that process, also when the block raises.

Two servers with the same semantics, chosen with ``--server`` (``SlowFS(..., server=...)``; default
``auto``, or the ``SLOWFS_SERVER`` environment variable): ``c``, the compiled ``benchmarks/slowfs.c``
(built on first use with ``cc`` and ``pkg-config fuse``, i.e. libfuse-dev, into
``~/.cache/packload/``, rebuilt when the source changes), and ``python``, this file on fusepy, which
spends two to three times the CPU per request (and holds the GIL), CPU that a reader on the same
few cores then lacks. The kernel sends both the same requests. ``auto`` takes the compiled one when
it builds, else the Python one, and ``SlowFS.describe()`` says which ran and why; the compiled one
needs neither fusepy nor Python in the data path.
"""

from __future__ import annotations

import argparse
import errno
import functools
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATS_NAME = ".slowfs-stats"
MOUNT_TIMEOUT_S = 20.0
_STATS_FH = 1 << 62  # file handle of the counters file (never a real descriptor)
SERVERS = ("auto", "c", "python")
C_SOURCE = Path(__file__).resolve().with_name("slowfs.c")
_REPO = C_SOURCE.parent.parent


def _default_server() -> str:
    server = os.environ.get("SLOWFS_SERVER", "auto") or "auto"
    if server not in SERVERS:
        raise ValueError(f"SLOWFS_SERVER={server!r}: expected one of {', '.join(SERVERS)}")
    return server


def unavailable(server: str | None = None) -> str | None:
    """None when a slowfs can be mounted here, else why not (for skips and benchmark notes).

    ``server`` (default ``auto``): ``python`` needs fusepy, ``c`` a compiled server (see
    :func:`c_server`), ``auto`` either one."""
    server = server or _default_server()
    if not sys.platform.startswith("linux"):
        return f"FUSE mounts are only supported on Linux here, not {sys.platform}"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse (the kernel's FUSE device; containers need --device /dev/fuse)"
    if os.geteuid() != 0 and shutil.which("fusermount") is None:
        return "not root and no fusermount to mount as a user (apt-get install fuse)"
    if server == "c":
        return c_server()[1]
    reason = _fusepy_unavailable()
    if reason is not None and server == "auto" and c_server()[0] is not None:
        return None
    return reason


def _fusepy_unavailable() -> str | None:
    try:
        import fuse  # noqa: F401  (fusepy; raises OSError when libfuse2 is missing)
    except ImportError:
        return 'fusepy is not installed (pip install -e ".[slowfs]")'
    except OSError as exc:
        return f"libfuse2 is missing ({exc}); apt-get install libfuse2"
    return None


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


# ---------------------------------------------------------------- the filesystem


def _operations(root: Path, latency_s: float, mbps: float | None, meta_latency_s: float) -> Any:
    """A fusepy ``Operations`` object serving ``root`` read-only with the given delays."""
    from fuse import FuseOSError, Operations

    class SlowOps(Operations):
        use_ns = True

        def __init__(self) -> None:
            self.root = root
            self.stats = Stats()
            self._mutex = threading.Lock()
            self.in_flight = 0
            self.link_free = 0.0  # when the bandwidth-capped link is next idle (monotonic seconds)

        def _real(self, path: str) -> str:
            return os.path.join(self.root, path.lstrip("/"))

        def _wait(self, seconds: float) -> None:
            if seconds > 0:
                time.sleep(seconds)
                with self._mutex:
                    self.stats.delay_s += seconds

        def stats_bytes(self) -> bytes:
            with self._mutex:
                return json.dumps(self.stats.to_json()).encode()

        # -- metadata
        def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
            if path == "/" + STATS_NAME:
                now = time.time_ns()
                return {"st_mode": stat.S_IFREG | 0o444, "st_nlink": 1, "st_size": 0,
                        "st_atime": now, "st_mtime": now, "st_ctime": now}
            self._wait(meta_latency_s)
            with self._mutex:
                self.stats.getattrs += 1
            try:
                st = os.stat(self._real(path))  # symlinks followed: shown as what they point to
            except OSError as exc:
                raise FuseOSError(exc.errno or errno.EIO) from None
            out = {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid",
                                                "st_blocks")}
            out.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
            out["st_mode"] &= ~0o222  # read-only
            return out

        def readdir(self, path: str, fh: Any) -> list[str]:
            self._wait(meta_latency_s)
            with self._mutex:
                self.stats.readdirs += 1
            try:
                return [".", "..", *os.listdir(self._real(path))]
            except OSError as exc:
                raise FuseOSError(exc.errno or errno.EIO) from None

        def statfs(self, path: str) -> dict[str, Any]:
            st = os.statvfs(self._real(path))
            return {k: getattr(st, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
                                                "f_files", "f_ffree", "f_favail", "f_flag", "f_namemax")}

        def access(self, path: str, amode: int) -> int:
            if amode & os.W_OK:
                raise FuseOSError(errno.EROFS)
            return 0

        # -- data (raw_fi: ``fi`` is the kernel's fuse_file_info)
        def open(self, path: str, fi: Any) -> int:
            if fi.flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
                raise FuseOSError(errno.EROFS)
            if path == "/" + STATS_NAME:
                fi.fh = _STATS_FH
                fi.direct_io = 1  # never cached: every read sees the current counters
                return 0
            self._wait(latency_s)
            try:
                fi.fh = os.open(self._real(path), os.O_RDONLY)
            except OSError as exc:
                raise FuseOSError(exc.errno or errno.EIO) from None
            with self._mutex:
                self.stats.opens += 1
            return 0

        def read(self, path: str, size: int, offset: int, fi: Any) -> bytes:
            if fi.fh == _STATS_FH:
                return self.stats_bytes()[offset : offset + size]
            start = time.monotonic()
            with self._mutex:
                self.in_flight += 1
                self.stats.max_reads_in_flight = max(self.stats.max_reads_in_flight, self.in_flight)
                done = start + latency_s
                if mbps:  # the link carries one read at a time at the capped rate
                    begin = max(done, self.link_free)
                    done = self.link_free = begin + size / (mbps * 1e6)
            try:
                if done > start:
                    time.sleep(done - start)
                data = os.pread(fi.fh, size, offset)
            except OSError as exc:
                raise FuseOSError(exc.errno or errno.EIO) from None
            finally:
                with self._mutex:
                    self.in_flight -= 1
                    self.stats.delay_s += max(0.0, done - start)
            with self._mutex:
                self.stats.reads += 1
                self.stats.read_bytes += len(data)
                self.stats.read_sizes[size] = self.stats.read_sizes.get(size, 0) + 1
            return data

        def release(self, path: str, fi: Any) -> int:
            if fi.fh != _STATS_FH:
                os.close(fi.fh)
            return 0

    return SlowOps()


def serve(source: str | os.PathLike[str], mountpoint: str | os.PathLike[str], latency_ms: float = 2.0,
          mbps: float | None = None, meta_latency_ms: float = 0.0, stats_file: str | None = None) -> None:
    """Mount and serve in this process until unmounted (or SIGINT/SIGTERM); then write ``stats_file``."""
    from fuse import FUSE

    ops = _operations(Path(source).resolve(), latency_ms / 1000, mbps, meta_latency_ms / 1000)
    try:
        FUSE(ops, str(mountpoint), raw_fi=True, foreground=True, nothreads=False, ro=True,
             allow_other=os.geteuid() == 0, auto_cache=True, fsname=f"slowfs:{Path(source).name}",
             subtype="slowfs")
    finally:
        if stats_file:
            Path(stats_file).write_bytes(ops.stats_bytes())


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
    ``final_stats`` holds those written by the child when it stopped. ``server``: ``auto`` (the
    compiled server when it builds, else the Python one; ``server_note`` says why), ``c`` or
    ``python``; default ``auto`` or the ``SLOWFS_SERVER`` environment variable.
    """

    def __init__(self, source: str | os.PathLike[str], mountpoint: str | os.PathLike[str], latency_ms: float = 2.0,
                 mbps: float | None = None, meta_latency_ms: float = 0.0, server: str | None = None) -> None:
        server = server or _default_server()
        if server not in SERVERS:
            raise ValueError(f"server={server!r}: expected one of {', '.join(SERVERS)}")
        self.source = Path(source)
        self.mountpoint = Path(mountpoint)
        self.latency_ms = latency_ms
        self.mbps = mbps
        self.meta_latency_ms = meta_latency_ms
        self.server = server
        self.server_used: str | None = None  # "c" or "python", once chosen
        self.server_note: str | None = None  # why ``auto`` fell back to the Python server
        self._binary: Path | None = None
        self.final_stats: Stats | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._stats_file: str | None = None
        self._log: Any = None
        self.last_log = ""

    def describe(self) -> dict[str, Any]:
        """The settings and the server that serves (or will serve) them, for results files."""
        if self.server_used is None:
            self._choose_server()
        out = {"latency_ms": self.latency_ms, "mbps": self.mbps, "meta_latency_ms": self.meta_latency_ms,
               "delayed": "every open and read request" + (", getattr and readdir" if self.meta_latency_ms else ""),
               "server": self.server_used}
        if self.server_note:
            out["server_note"] = self.server_note
        return out

    def _choose_server(self) -> None:
        """Settle ``server_used`` (once: a remount keeps it); raises RuntimeError if ``c`` does not build."""
        if self.server_used is not None:
            return
        if self.server == "python":
            self.server_used = "python"
            return
        binary, why = c_server()
        if binary is not None:
            self.server_used, self._binary = "c", binary
        elif self.server == "c":
            raise RuntimeError(f"cannot mount a slowfs with the compiled server: {why}")
        else:
            self.server_used, self.server_note = "python", f"compiled server unavailable: {why}"

    def mount(self) -> SlowFS:
        """Start the child and wait until the mount is live; raises RuntimeError with the reason if not."""
        self._choose_server()
        reason = unavailable(self.server_used)
        if reason is not None:
            raise RuntimeError(f"cannot mount a slowfs: {reason}")
        if not self.source.is_dir():
            raise RuntimeError(f"{self.source}: not a folder; give the folder to serve slowly")
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        if os.path.ismount(self.mountpoint):
            raise RuntimeError(f"{self.mountpoint}: something is mounted there already; unmount it first")
        fd, self._stats_file = tempfile.mkstemp(prefix="slowfs-", suffix=".json")
        os.close(fd)
        server = [str(self._binary)] if self.server_used == "c" else \
            [sys.executable, str(Path(__file__).resolve()), "--server", "python"]
        cmd = [*server, str(self.source), str(self.mountpoint),
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
        """The end of what the child wrote to stdout/stderr (libfuse's and fusepy's error messages)."""
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
    p.add_argument("--server", choices=SERVERS, default=None,
                   help="compiled (c) or fusepy (python) server; auto (default, or SLOWFS_SERVER): c when it builds")
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
    try:
        server = args.server or _default_server()
    except ValueError as exc:
        p.error(str(exc))
    binary, why = c_server() if server != "python" else (None, None)
    if server == "c" and binary is None:
        print(f"slowfs: cannot mount with the compiled server: {why}", file=sys.stderr)
        return 2
    reason = unavailable("c" if binary is not None else "python")
    if reason is not None:
        print(f"slowfs: cannot mount: {reason}", file=sys.stderr)
        return 2
    if binary is not None:  # the compiled server takes over this process: signals and exit code are its own
        os.execv(binary, [str(binary), str(args.source), str(args.mountpoint), "--latency-ms", str(args.latency_ms),
                          "--meta-latency-ms", str(args.meta_latency_ms),
                          *(["--mbps", str(args.mbps)] if args.mbps else []),
                          *(["--stats-file", args.stats_file] if args.stats_file else [])])
    if server == "auto":
        print(f"slowfs: serving with the Python server ({why})", file=sys.stderr)
    try:
        serve(args.source, args.mountpoint, args.latency_ms, args.mbps, args.meta_latency_ms, args.stats_file)
    except RuntimeError as exc:  # fusepy: "1" when libfuse could not mount
        print(f"slowfs: {args.mountpoint}: mount failed ({exc}); is it empty and not mounted already?",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
