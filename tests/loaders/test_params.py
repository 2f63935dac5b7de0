"""``loaders.params`` on its own: the checks behind every crop, range and decode size, at the edges
of their ranges and with the number types callers pass (NumPy's, ``Fraction``), and the batch memory
check against a machine whose memory the test states. (The crops' and loaders' use of them, with
their parameter names, is tested in test_crop_params.py.)"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from packload.core.errors import UsageError
from packload.core.format import MAX_SIDE
from packload.loaders import params
from packload.loaders.params import check_batch_memory, check_decode_size, check_int, check_pair, check_real

GIB = 1 << 30


def one_line(call: Any, *args: Any, **kwargs: Any) -> str:
    """The message of the ``UsageError`` (a ``ValueError``) that ``call`` raises, checked to be one line."""
    with pytest.raises(UsageError) as caught:
        call(*args, **kwargs)
    assert isinstance(caught.value, ValueError)
    text = str(caught.value)
    assert "\n" not in text, text
    return text


def test_int_within_its_bounds() -> None:
    for value in (-3, 0, 7, np.int8(-3), np.uint16(7)):
        got = check_int(value, "shift", -3, 7)
        assert got == int(value) and type(got) is int
    assert one_line(check_int, -4, "shift", -3, 7) == "shift must be in -3..7, got -4"
    assert one_line(check_int, np.int64(8), "shift", -3, 7) == f"shift must be in -3..7, got {np.int64(8)!r}"
    assert one_line(check_int, True, "shift", -3, 7) == "shift must be an int in -3..7, got True (bool)"
    assert one_line(check_int, 2.0, "shift", -3, 7) == "shift must be an int in -3..7, got 2.0 (float)"


def test_real_numbers_of_any_kind_become_floats() -> None:
    for value, expected in ((1, 1.0), (Fraction(1, 4), 0.25), (np.float32(0.5), 0.5), (np.int64(3), 3.0),
                            (-0.0, 0.0)):
        got = check_real(value, "flip", "in [0, 1]")
        assert got == expected and type(got) is float
    assert one_line(check_real, math.inf, "flip", "in [0, 1]") == "flip must be a finite number in [0, 1], got inf"
    assert one_line(check_real, np.float64("nan"), "flip", "in [0, 1]").startswith("flip must be a finite number")
    assert one_line(check_real, False, "flip", "in [0, 1]") == "flip must be a number in [0, 1], got False (bool)"
    assert one_line(check_real, Decimal("0.5"), "flip", "in [0, 1]") == (
        "flip must be a number in [0, 1], got Decimal('0.5') (Decimal)")


@pytest.mark.parametrize("low_open", [True, False])
def test_pair_bounds(low_open: bool) -> None:
    """``low`` itself is in the range only when it is closed; ``high`` always is; a == b is a pair."""
    valid = "(0 < low <= high <= 1)"
    assert check_pair([0.25, 1], "scale", 0, 1, low_open=low_open, valid=valid) == (0.25, 1.0)
    assert check_pair((np.float32(0.5), Fraction(1, 2)), "scale", 0, 1, low_open=low_open, valid=valid) == (0.5, 0.5)
    if low_open:
        assert one_line(check_pair, (0, 1), "scale", 0, 1, low_open=True, valid=valid) == (
            f"scale must be (low, high) {valid}, got (0, 1)")
    else:
        assert check_pair((0, 1), "scale", 0, 1, low_open=False, valid=valid) == (0.0, 1.0)
    for bad in ((0.5, 0.25), (0.5, 1.5), (-1, 0.5)):
        assert one_line(check_pair, bad, "scale", 0, 1, low_open=low_open, valid=valid) == (
            f"scale must be (low, high) {valid}, got {bad!r}")
    for shape in ("01", b"01", (0.5,), (0.1, 0.2, 0.3), {0.1, 0.2}, 0.5):
        assert one_line(check_pair, shape, "scale", 0, 1, low_open=low_open, valid=valid) == (
            f"scale must be a pair (low, high) {valid}, got {shape!r}")


def test_decode_size_under_its_own_name() -> None:
    assert check_decode_size(None) is None
    got = check_decode_size([np.int32(MAX_SIDE), 1], "size")
    assert got == (MAX_SIDE, 1) and all(type(side) is int for side in got)
    assert one_line(check_decode_size, (MAX_SIDE + 1, 1), "size") == f"size must be in 1..{MAX_SIDE}, got {MAX_SIDE + 1}"
    assert one_line(check_decode_size, "32x32", "size") == (
        f"size must be (height, width) in pixels, two ints in 1..{MAX_SIDE}, or None; got '32x32'")


def test_batch_memory_against_the_memory_there_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """Up to 1 GiB a batch is not measured at all; past it, it is refused only when it needs more
    than the machine's (or cgroup's) total, and let through when the total is not known."""
    asked: list[int] = []

    def machine(total: int | None) -> None:
        def status() -> dict[str, int]:
            asked.append(1)
            return {} if total is None else {"total": total, "available": total}
        monkeypatch.setattr(params, "memory_status", status)

    machine(1)  # a 1-byte machine: every measured batch would be refused
    check_batch_memory(GIB // (3 * 64 * 64), 64, "crop size")  # exactly 1 GiB (count * 3 * side * side)
    check_batch_memory(0, 65_535, "crop size")
    assert asked == []
    machine(6 * GIB)
    check_batch_memory(2048, 1024, "crop size")  # 2048 x 3 x 1024 x 1024: exactly the total, fits
    assert one_line(check_batch_memory, 2049, 1024, "crop size").startswith("crop size 1024 with a batch of 2049")
    assert one_line(check_batch_memory, 4097, 1024, "crop size") == (
        "crop size 1024 with a batch of 4097 needs 12.0 GiB per batch, more than the 6.0 GiB of memory here; "
        "give a smaller crop or batch")
    machine(None)
    check_batch_memory(4097, 1024, "crop size")
    assert len(asked) == 4
