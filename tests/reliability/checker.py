"""The checker child of the corruption campaign: it learns what an intact pack gives, then
verifies and reads each damaged copy (checksums on and off), in a process whose address space is
capped and which is restarted after a crash or a hang."""

from __future__ import annotations

import gc
import json
import resource
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from tests.reliability.packs import MEMORY_HEADROOM, REPO, child_env

CHECK_TIMEOUT = 60.0  # seconds one check may take before it counts as a hang


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
        self.proc = subprocess.Popen([sys.executable, "-c", "from tests.reliability.checker import serve_checks; "
                                      "serve_checks()"], cwd=REPO, env=child_env(), stdin=subprocess.PIPE,
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
