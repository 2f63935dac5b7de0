"""The lines of a diagnosis (``packload.diagnose.checks``)."""

from __future__ import annotations

import pytest

from packload.diagnose.checks import GIB, check, human_bytes


def test_a_check_and_its_fix() -> None:
    assert check("shm", "warn", "too small", "grow it") == {"name": "shm", "status": "warn", "message": "too small",
                                                           "fix": "grow it"}
    with pytest.raises(ValueError, match="unknown status"):
        check("shm", "bad", "x")  # type: ignore[arg-type]


def test_sizes_in_binary_units() -> None:
    assert human_bytes(None) == "unknown" and human_bytes(512) == "512 B"
    assert human_bytes(1536) == "1.5 KiB" and human_bytes(3 * GIB) == "3.0 GiB"
