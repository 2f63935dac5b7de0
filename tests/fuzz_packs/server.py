"""The probe server: one import of torch, a capped address space, and a fresh forked worker per
pack or whenever one dies or hangs; ``ProbeServer`` is the parent's side. Also the resize kernel
built with AddressSanitizer and UBSan, which the server can load in place of the installed one."""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from tests.fuzz_packs.read_paths import PROBE_TIMEOUT, READ_PATHS, run_probe
from tests.fuzz_packs.reference import Reference, unpack_refuses
from tests.reliability.packs import MEMORY_HEADROOM, REPO, child_env

# A worker may allocate MEMORY_HEADROOM bytes beyond the server's size at start: more is absurd.
# The reader's manifest size limit: the workers lower it to half the big case's size (when that is
# lower), so that a scaled-down case tests the same refusal as a real 300 MB manifest.
MANIFEST_LIMIT_HOOK = ("packload.core.manifest", "MANIFEST_LIMIT")
RECYCLE = 3  # a worker's exit status asking the server for a fresh worker (not a death)
JPEG_BOXES_ASAN = "_jpeg_boxes_asan.so"  # the batch decoder's sanitizer build, beside the resize kernel's


def _use_kernel(library: str) -> None:
    """Make ``packload.core.resize_kernel`` load ``library`` (a sanitizer build) instead of the built
    kernel: it imports the module ``packload.core._resize`` and loads the file that module names. The
    batch decoder's sanitizer build beside it (``build_sanitized_kernel``) takes the place of
    ``packload.core._jpeg_boxes`` the same way."""
    import types

    for name, path in (("_resize", Path(library)), ("_jpeg_boxes", Path(library).with_name(JPEG_BOXES_ASAN))):
        if path.exists():
            module = types.ModuleType(f"packload.core.{name}")
            module.__file__ = str(path)
            sys.modules[f"packload.core.{name}"] = module


def serve(mode: str) -> None:
    """The probe server, run as ``python -c``: imports what the probes need once, caps its address
    space, then forks a worker that answers one JSON request a line on stdin (one JSON line each on
    the protocol descriptor); reports a worker that died and forks a new one. ``mode``: ``kernel``,
    ``torch`` (``PACKLOAD_RESIZE=torch`` in the environment) or ``asan:LIBRARY``."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints go to the log, never into the protocol
    if mode.startswith("asan:"):
        _use_kernel(mode[5:])
    import PIL.Image  # noqa: F401 - everything the probes import, imported before the cap
    import torch.utils.data  # noqa: F401

    import packload.cli  # noqa: F401
    import packload.loaders.unpack  # noqa: F401
    import packload.loaders.verify  # noqa: F401
    import packload.merger  # noqa: F401
    from packload.core import resize_kernel

    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + MEMORY_HEADROOM, vm + MEMORY_HEADROOM))
    from packload.core import jpeg_kernel

    kernel = getattr(resize_kernel._lib, "_name", None)
    decoder = getattr(jpeg_kernel._extension_lib(), "_name", None)
    jpeg_kernel.available()  # the library bound (and self-checked) before the address space is capped
    proto.write(json.dumps({"server": os.getpid(), "kernel": kernel, "decoder": decoder,
                            "loaders": packload.loaders.__file__}) + "\n")
    while True:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _work(proto)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            return
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == RECYCLE:
            continue
        if os.WIFSIGNALED(status):
            died = signal.Signals(os.WTERMSIG(status)).name
        else:
            died = f"exit {os.WEXITSTATUS(status)}"
        proto.write(json.dumps({"died": died, "pid": pid}) + "\n")


def _work(proto: Any) -> None:
    """A worker: answers requests until stdin closes. The reference of the latest pack is kept."""
    import faulthandler

    faulthandler.enable(sys.stderr)
    faulthandler.register(signal.SIGUSR1, sys.stderr)  # the parent asks for the stack of a hang
    proto.write(json.dumps({"ready": os.getpid()}) + "\n")
    refs: dict[str, Reference] = {}
    limited = False
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("recycle"):  # a new pack: a fresh worker, untouched by the probes before
            proto.write(json.dumps({"id": request["id"], "recycled": os.getpid()}) + "\n")
            proto.flush()
            os._exit(RECYCLE)
        if request.get("canary"):
            _canary()
            proto.write(json.dumps({"id": request["id"], "outcome": "ok", "findings": [], "refused": []})
                        + "\n")
            continue
        if not limited:
            _limit_manifests(request["manifest_limit"])
            limited = True
        pack = Path(request["pack"])
        print(f"-- probe {request['id']}: {request['path']} on {pack}", file=sys.stderr, flush=True)
        try:
            if request["pack"] not in refs:
                refs.clear()
                refs[request["pack"]] = Reference(pack, request["manifest_limit"])
            ref = refs[request["pack"]]
            probe = run_probe(ref, READ_PATHS[request["path"]], pack, Path(request["scratch"]))
            unpacks = READ_PATHS[request["path"]].get("command") == "unpack"
            unsafe = unpacks and unpack_refuses(ref)
            answer = {"outcome": probe.outcome(), "findings": probe.findings, "refused": probe.refused[:2],
                      "valid": not ref.problems() and not unsafe}
        except Exception:  # noqa: BLE001 - a bug of this harness, not of the reader: reported as such
            answer = {"outcome": "harness error", "refused": [], "findings": [
                {"kind": "harness", "cause": "the fuzz harness itself failed",
                 "detail": traceback.format_exc()[-600:]}]}
        proto.write(json.dumps({"id": request["id"], **answer}) + "\n")


def _canary() -> None:
    """Make the resize kernel read 8 rows past the end of a heap buffer, on purpose: a sanitizer
    build must report it (and abort), which shows that its reports reach the parent."""
    from packload.core import resize_kernel

    height, width, side = 64, 64, 48  # a shrink the kernel takes (not by more than 2x)
    image = np.zeros(height * width * 3, np.uint8)
    out = np.empty((side, side, 3), np.uint8)
    if not resize_kernel.resize_region(image.ctypes.data, width * 3, height + 8, width, out.ctypes.data,
                                       side * 3, side, side):
        raise RuntimeError(f"the resize kernel declined the canary: {resize_kernel.unavailable_reason}")


def _limit_manifests(limit: int) -> None:
    """Lower the reader's manifest size limit (``MANIFEST_LIMIT_HOOK``) to ``limit`` when it is lower,
    in every loaded packload module holding a copy of it (``from packload.core.manifest import ...``)."""
    import importlib

    home, name = MANIFEST_LIMIT_HOOK
    current = getattr(importlib.import_module(home), name, None)
    if not isinstance(current, int) or limit >= current:
        return
    for module_name, module in list(sys.modules.items()):
        if module_name.split(".")[0] == "packload" and getattr(module, name, None) == current:
            setattr(module, name, limit)


class ProbeServer:
    """The parent's side of ``serve``: sends requests, detects a worker's death or hang (killing it,
    after asking faulthandler for its stack), and reports what the log said."""

    def __init__(self, mode: str, log: Path, env: dict[str, str] | None = None,
                 timeout: float = PROBE_TIMEOUT) -> None:
        self.mode, self.log, self.timeout = mode, log, timeout
        self.env = env if env is not None else server_env(mode)
        self.proc: subprocess.Popen[bytes] | None = None
        self.worker: int | None = None
        self.info: dict[str, Any] = {}
        self.deaths = 0
        self._buffer = b""
        self._next = 0

    def start(self) -> None:
        self._log = open(self.log, "ab")  # noqa: SIM115 - held while the server runs
        command = [sys.executable, "-c", f"from tests.fuzz_packs.server import serve; serve({self.mode!r})"]
        self.proc = subprocess.Popen(command, cwd=REPO, env=self.env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log)
        self.info = self._line(PROBE_TIMEOUT * 3) or {}
        if "server" not in self.info:
            raise RuntimeError(f"probe server ({self.mode}) did not start: {self._log_tail(0)[-2000:]}")

    def _line(self, timeout: float) -> dict[str, Any] | None:
        """The next protocol line, or None after ``timeout`` seconds (or if the server is gone)."""
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send one probe request; its answer, or ``{"died": signal}`` / ``{"hang": seconds}``."""
        if self.proc is None or self.proc.poll() is not None:
            self.stop()
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        self._next += 1
        request = dict(request, id=self._next)
        mark = self.log.stat().st_size
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + self.timeout
        while True:
            message = self._line(max(0.0, deadline - time.monotonic()))
            if message is None:
                return self._hang(mark)
            if "ready" in message:
                self.worker = message["ready"]
            elif "died" in message:
                self.deaths += 1
                return {"died": message["died"], "log": _crash_lines(self._log_tail(mark))}
            elif message.get("id") == self._next:
                return message

    def recycle(self) -> None:
        """Have the server replace its worker by a fresh fork (before each pack)."""
        if self.proc is not None and self.proc.poll() is None and self.worker is not None:
            self.ask({"recycle": True})
            self.worker = None

    def _hang(self, mark: int) -> dict[str, Any]:
        if self.worker is not None and self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.worker, signal.SIGUSR1)
                time.sleep(0.5)
                os.kill(self.worker, signal.SIGKILL)
            died = self._line(10.0)
            if died is None or "died" not in died:
                self.stop()
        else:
            self.stop()
        self.deaths += 1
        return {"hang": self.timeout, "log": _crash_lines(self._log_tail(mark))}

    def _log_tail(self, mark: int) -> str:
        self._log.flush()
        with open(self.log, "rb") as f:
            f.seek(max(mark, self.log.stat().st_size - (64 << 10)))
            return f.read().decode("utf-8", "replace")

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
            self._log.close()
        self._buffer = b""
        self.worker = None

    def __enter__(self) -> ProbeServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _crash_lines(log: str) -> str:
    """What a log says about a crash or hang: sanitizer reports, and packload's frames of the stack."""
    lines = log.splitlines()
    wanted = re.compile(r"ERROR: AddressSanitizer|runtime error:|SUMMARY:|Fatal Python|"
                        r"^(Thread|Current thread)|/loaders/|/packer/|/packload/|#\d+ 0x.*_resize")
    keep = [line for line in lines if wanted.search(line)]
    return "\n".join(keep[:14])[:1500]


def server_env(mode: str, asan_runtime: str | None = None) -> dict[str, str]:
    """The environment of a probe server: the repository importable; for ``torch`` the kernel off
    (``PACKLOAD_RESIZE=torch``); for ``asan:`` the sanitizer runtime preloaded."""
    env = child_env()
    env.pop("PACKLOAD_RESIZE", None)
    if mode == "torch":
        env["PACKLOAD_RESIZE"] = "torch"
    if mode.startswith("asan:"):
        env["LD_PRELOAD"] = asan_runtime or sanitizer_runtime()[0] or ""
        env["ASAN_OPTIONS"] = ("detect_leaks=0:abort_on_error=1:halt_on_error=1:allocator_may_return_null=1:"
                               "detect_odr_violation=0:alloc_dealloc_mismatch=0:handle_segv=1")
        env["UBSAN_OPTIONS"] = "halt_on_error=1:abort_on_error=1:print_stacktrace=1"
    return env


# -- sanitizer build of the resize kernel -------------------------------------------------------------------


def sanitizer_runtime() -> tuple[str | None, str]:
    """(the path of libasan to preload, "") or (None, why there is none)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        return None, "no C compiler"
    found = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not found or not os.path.isabs(found) or not os.path.exists(found):
        return None, f"{cc} has no libasan"
    return os.path.realpath(found), ""


def build_sanitized_kernel(dest: Path) -> tuple[Path | None, str]:
    """``packload/core/_resize.c`` built with ``-fsanitize=address,undefined`` into ``dest``: (library, "")
    or (None, why it cannot be built here). The batch decoder (``packload/core/_jpeg_boxes.c``) is
    built the same way beside it, as ``JPEG_BOXES_ASAN``."""
    runtime, why = sanitizer_runtime()
    if runtime is None:
        return None, why
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").is_file():
        return None, f"no Python headers in {include}"
    cc = shutil.which("gcc") or shutil.which("cc")
    dest.mkdir(parents=True, exist_ok=True)
    library = dest / "_resize_asan.so"
    for source, built in (("_resize.c", library), ("_jpeg_boxes.c", dest / JPEG_BOXES_ASAN)):
        command = [str(cc), "-shared", "-fPIC", "-O1", "-g", "-fsanitize=address,undefined",
                   "-fno-omit-frame-pointer", f"-I{include}", str(REPO / "packload" / "core" / source), "-o",
                   str(built)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            return None, f"the sanitizer build of {source} failed: {done.stderr.strip()[-500:]}"
    return library, ""
