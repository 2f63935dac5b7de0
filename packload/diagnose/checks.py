"""One line of the diagnosis (``Check``): what was checked, how it stands, and the fix when it is wrong."""

from __future__ import annotations

from typing import Literal, TypedDict

Status = Literal["ok", "warn", "info"]

STATUSES: tuple[str, ...] = ("ok", "warn", "info")


class Check(TypedDict):
    """One line of the diagnosis: what was checked, how it stands, and the fix when it is wrong."""

    name: str
    status: Status
    message: str
    fix: str | None

def check(name: str, status: Status, message: str, fix: str | None = None) -> Check:
    """A ``Check`` (the status must be one of ok, warn, info)."""
    if status not in STATUSES:
        raise ValueError(f"unknown status {status!r}")
    return {"name": name, "status": status, "message": message, "fix": fix}


KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


def human_bytes(n: float | None) -> str:
    """``1.5 GiB``-style sizes (binary units, as RAM and ``--shm-size`` count)."""
    if n is None:
        return "unknown"
    for unit, size in (("TiB", 1 << 40), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"
