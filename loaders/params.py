"""Checks of the numbers a caller gives the loaders: crop sizes, ranges, decode sizes.

Each refuses a wrong value at once, where it is given, with a one-line ``UsageError`` (a
``ValueError``) that names the parameter, the value and the valid range, rather than letting it
reach NumPy, torch or libjpeg-turbo as an odd crop, an overflow or an allocation failure. ``bool`` is
refused where a number is asked for (``True`` is an int to Python, never a size to a caller).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral, Real
from typing import Any

from packload.core.errors import UsageError
from packload.core.format import MAX_SIDE
from packload.core.memory import memory_status

MAX_CROP_SIDE = 65_535
"""The largest crop side: JPEG's own largest side. A batch of B crops of side S takes B x 3 x S x S
bytes (12.9 GB per image at this bound), which ``check_batch_memory`` compares with the memory
there is; past this bound no image the packer stores would be decoded at that size either."""


def check_int(value: Any, name: str, low: int, high: int) -> int:
    """``value`` as an int within [``low``, ``high``]; ``UsageError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise UsageError(f"{name} must be an int in {low}..{high}, got {value!r} ({type(value).__name__})")
    if not low <= value <= high:
        raise UsageError(f"{name} must be in {low}..{high}, got {value!r}")
    return int(value)


def check_side(value: Any, name: str) -> int:
    """An output side in pixels: an int in 1..``MAX_CROP_SIDE``."""
    return check_int(value, name, 1, MAX_CROP_SIDE)


def check_real(value: Any, name: str, valid: str) -> float:
    """``value`` as a finite float (``valid`` says the range, for the message)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise UsageError(f"{name} must be a number {valid}, got {value!r} ({type(value).__name__})")
    number = float(value)
    if not math.isfinite(number):
        raise UsageError(f"{name} must be a finite number {valid}, got {value!r}")
    return number


def check_pair(value: Any, name: str, low: float, high: float, *, low_open: bool, valid: str) -> tuple[float, float]:
    """``(a, b)`` of finite numbers with ``low`` < (or <=, without ``low_open``) a <= b <= ``high``."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
        raise UsageError(f"{name} must be a pair (low, high) {valid}, got {value!r}")
    a, b = (check_real(v, name, valid) for v in value)
    if not ((low < a) if low_open else (low <= a)) or not a <= b <= high:
        raise UsageError(f"{name} must be (low, high) {valid}, got {value!r}")
    return a, b


def check_decode_size(value: Any, name: str = "decode_size") -> tuple[int, int] | None:
    """``decode_size``: None, or (height, width) of ints in 1..``MAX_SIDE`` (the largest side a pack
    stores; a size past an image's own decodes it in full)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
        raise UsageError(f"{name} must be (height, width) in pixels, two ints in 1..{MAX_SIDE}, or None; "
                         f"got {value!r}")
    height, width = (check_int(v, name, 1, MAX_SIDE) for v in value)
    return height, width


def check_batch_memory(count: int, side: int, name: str) -> None:
    """Refuse a batch of ``count`` crops of ``side`` pixels (uint8 RGB) that needs more bytes than this
    process has memory (RAM, or its cgroup's limit); batches under 1 GiB are not asked about."""
    need = count * 3 * side * side
    if need <= _ALWAYS_ROOM:
        return
    total = memory_status().get("total")
    if total is not None and need > total:
        raise UsageError(f"{name} {side} with a batch of {count} needs {need / 2**30:.1f} GiB per batch, more "
                         f"than the {total / 2**30:.1f} GiB of memory here; give a smaller crop or batch")


_ALWAYS_ROOM = 1 << 30  # a batch this small is not worth reading /proc/meminfo for
