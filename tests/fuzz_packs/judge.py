"""A probe's verdicts: what one read path returned for one pack, judged against the reference
(records it must not return, values that are not what the pack says, exceptions not packload's)."""

from __future__ import annotations

import re
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from tests.fuzz_packs.reference import Reference, RefRecord


class Probe:
    """One read path against one pack: its findings (rules broken) and what it refused."""

    MAX_FINDINGS = 4

    def __init__(self, ref: Reference, spec: dict[str, Any]) -> None:
        self.ref, self.spec = ref, spec
        self.findings: list[dict[str, str]] = []
        self.refused: list[str] = []
        self.notes: list[str] = []
        self.returned = 0
        self.accepted_bad = False

    def fail(self, kind: str, cause: str, detail: str = "") -> None:
        if len(self.findings) < self.MAX_FINDINGS and not any(f["cause"] == cause for f in self.findings):
            self.findings.append({"kind": kind, "cause": cause, "detail": detail[:300]})

    def exception(self, exc: BaseException, what: str) -> None:
        """Judge an exception raised by a read path: ours (a refusal), or a failure."""
        from packload.core.errors import PackloadError

        if isinstance(exc, PackloadError):
            self.refused.append(f"{what}: {str(exc)[:200]}")
            return
        kind, cause = _classify(exc)
        first = str(exc).splitlines()[0][:240] if str(exc) else ""
        self.fail(kind, cause, f"{what}: {type(exc).__name__}: {first}")

    def opened(self, length: int, verify: bool) -> None:
        """A dataset opened: it must not have, for a pack every reader must refuse."""
        ref = self.ref
        if ref.pack_bad:
            self.accepted_bad = True
            self.fail("accepted", "opened a pack every reader must refuse", ref.pack_bad)
        elif verify and not ref.index_sha_ok:
            self.accepted_bad = True
            self.fail("accepted", "verify=True opened a pack whose index fails the manifest's sha256")
        elif length != len(ref.records):
            self.fail("wrong", "the dataset's length is not the index's count",
                      f"{length} != {len(ref.records)}")

    def allowed(self, i: int, verify: bool) -> RefRecord | None:
        """Record ``i`` as the reference has it, if a reader may return it; else a finding and None."""
        ref = self.ref
        self.returned += 1
        if ref.pack_bad or self.accepted_bad:
            if not self.accepted_bad:
                self.fail("wrong", "returned data from a pack every reader must refuse", ref.pack_bad or "")
            return None
        rec = ref.records[i]
        if rec.bad:
            self.fail("wrong", f"returned a record although {rec.bad}", f"record {i}")
            return None
        if verify and not rec.crc_ok:
            self.fail("wrong", "verify=True returned a payload that fails its CRC", f"record {i}")
            return None
        return rec

    def item(self, i: int, value: Any, label: Any, output: str, verify: bool) -> None:
        """Judge ``(value, label)`` returned for record ``i`` as ``output``."""
        rec = self.allowed(i, verify)
        if rec is None:
            return
        if int(label) != rec.label:
            self.fail("wrong", "the label is not the index's", f"record {i}: {label} != {rec.label}")
        problem = _check_value(rec, value, output)
        if problem:
            self.fail("wrong", problem[0], f"record {i}: {problem[1]}")

    def outcome(self) -> str:
        if self.findings:
            return "failed"
        return "refused" if self.refused else "ok"


def _check_value(rec: RefRecord, value: Any, output: str) -> tuple[str, str] | None:
    """(cause, detail) of what is wrong with a returned value, or None."""
    import torch
    from PIL import Image

    h, w = rec.height, rec.width
    if output == "bytes":
        if not isinstance(value, bytes) or value != rec.payload:
            return "bytes differ from those the index names", f"{type(value).__name__} returned"
        return None
    if output == "pil":
        if not isinstance(value, Image.Image) or value.mode != "RGB":
            return "not an RGB PIL image", type(value).__name__
        shape, array = (value.size[1], value.size[0]), np.asarray(value)
    elif output == "tensor":
        if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8 or value.shape[:1] != (3,) \
                or value.ndim != 3:
            return "not a 3xHxW uint8 tensor", repr(getattr(value, "shape", type(value)))
        shape, array = tuple(value.shape[1:]), value.permute(1, 2, 0).numpy()
    else:
        if not isinstance(value, np.ndarray) or value.dtype != np.uint8 or value.ndim != 3 \
                or value.shape[2] != 3:
            return "not an HxWx3 uint8 array", repr(getattr(value, "shape", type(value)))
        shape, array = value.shape[:2], value
    if tuple(shape) != (h, w):
        return "the decoded image's size is not the index's width and height", f"{shape} != {(h, w)}"
    pixels = rec.pixels()
    if rec.fmt == 0 and (pixels is None or not np.array_equal(array, pixels)):
        return "raw pixels differ from the stored bytes", ""
    return None


def _classify(exc: BaseException) -> tuple[str, str]:
    """(kind, cause) of an exception that is not ours: where it was raised, for grouping."""
    message = str(exc)
    if isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and "allocate" in message):
        return "memory", f"{type(exc).__name__} (absurd allocation) at {_where(exc)}"
    if isinstance(exc, RuntimeError) and "DataLoader worker" in message and (
            "killed by signal" in message or "exited unexpectedly" in message):
        return "signal", f"a DataLoader worker died: {message.split(':')[-1].strip()[:60]}"
    if isinstance(exc, RuntimeError) and "DataLoader timed out" in message:
        return "hang", "a DataLoader worker hung"
    inner = re.search(r"Caught (\w+) in DataLoader worker", message)
    if inner:
        return "foreign", f"{inner.group(1)} (in a DataLoader worker) at {_where_in_text(message)}"
    return "foreign", f"{type(exc).__name__} at {_where(exc)}"


def _where(exc: BaseException) -> str:
    """The innermost frame of the exception's traceback in packload's code."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if any(top in f.filename for top in _OURS)]
    frame = (ours or frames or [None])[-1]
    if frame is None:
        return "?"
    return f"{_short(frame.filename)}:{frame.lineno} ({frame.name})"


def _where_in_text(text: str) -> str:
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', text)
    ours = [f for f in frames if any(top in f[0] for top in _OURS)] or frames
    return f"{_short(ours[-1][0])}:{ours[-1][1]} ({ours[-1][2]})" if ours else "?"


_OURS = ("/loaders/", "/packer/", "/packload/")  # the folders of packload's code


def _short(filename: str) -> str:
    for top in _OURS:
        if top in filename:
            return top[1:] + filename.split(top, 1)[1]
    return Path(filename).name
