"""What packload's speed-ups are doing here (``packload.diagnose.software``): the fast JPEG decoder,
the compiled resize kernel and the compiled batch decoder, read from the real modules (and switched
off for real with their own ``set_enabled``). The messages for a kernel that was not built or a
libjpeg-turbo that does not fit are in ``tests/diagnose/test_doctor.py``."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator

import pytest

from packload.core import jpeg_kernel, resize_kernel
from packload.diagnose.checks import STATUSES
from packload.diagnose.software import (
    FAST_EXTRA,
    batch_decoder_check,
    fast_decoder_installed,
    fast_hint,
    software_checks,
)

NAMES = ["fast_decoder", "resize_kernel", "batch_decoder"]


def by_name() -> dict[str, dict]:
    return {c["name"]: dict(c) for c in software_checks()}


@pytest.fixture
def kernels_restored() -> Iterator[None]:
    """Switch the kernels back on after a test that switched them off."""
    yield
    resize_kernel.set_enabled(True)
    jpeg_kernel.set_enabled(True)


def test_the_fast_decoder_is_there_exactly_when_simplejpeg_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    assert fast_decoder_installed() is (importlib.util.find_spec("simplejpeg") is not None)
    monkeypatch.setitem(sys.modules, "simplejpeg", None)  # as if it could not be imported
    assert fast_decoder_installed() is False
    assert fast_hint() == f"; install the fast JPEG decoder: {FAST_EXTRA}"
    assert fast_hint(prefix=". ") == f". install the fast JPEG decoder: {FAST_EXTRA}"
    [decoder] = [c for c in software_checks() if c["name"] == "fast_decoder"]
    assert decoder == {"name": "fast_decoder", "status": "info", "fix": FAST_EXTRA,
                       "message": "fast JPEG decoder (simplejpeg) not installed: JPEGs are decoded by PIL, "
                                  "holding the GIL"}


def test_the_fast_hint_is_empty_where_the_decoder_is_installed() -> None:
    pytest.importorskip("simplejpeg")
    assert fast_hint() == "" and fast_hint(prefix="xyz") == ""
    assert by_name()["fast_decoder"]["status"] == "ok" and by_name()["fast_decoder"]["fix"] is None


def test_three_checks_in_order_each_a_check() -> None:
    checks = software_checks()
    assert [c["name"] for c in checks] == NAMES
    for c in checks:
        assert set(c) == {"name", "status", "message", "fix"} and c["status"] in STATUSES
        if c["status"] == "ok":
            assert c["fix"] is None  # nothing to fix
    assert checks[-1] == batch_decoder_check()  # the last is the batch decoder's own check


def test_the_checks_say_what_the_kernels_are_doing_here() -> None:
    """On this machine, as the modules themselves report: ok where available, else why not."""
    checks = by_name()
    assert (checks["resize_kernel"]["status"] == "ok") is resize_kernel.available()
    assert (checks["batch_decoder"]["status"] == "ok") is jpeg_kernel.available()
    if jpeg_kernel.available():
        assert jpeg_kernel.description() in checks["batch_decoder"]["message"]
    else:
        assert jpeg_kernel.unavailable_reason() in checks["batch_decoder"]["message"]


@pytest.mark.skipif(not resize_kernel.available(), reason="the resize kernel is not built here")
def test_a_resize_kernel_switched_off_is_information_and_the_batch_decoder_follows(kernels_restored: None) -> None:
    """``set_enabled(False)``: not a fault to fix (no fix offered), and the batch decoder, which needs
    the resize kernel, says that is why it is not in use either."""
    resize_kernel.set_enabled(False)
    checks = by_name()
    assert checks["resize_kernel"] == {
        "name": "resize_kernel", "status": "info", "fix": None,
        "message": "compiled resize kernel not in use: disabled by resize_kernel.set_enabled(False)"}
    assert checks["batch_decoder"]["status"] == "info" and checks["batch_decoder"]["fix"] is None
    assert checks["batch_decoder"]["message"] == ("compiled batch decoder not in use: the resize kernel is not in "
                                                  "use: disabled by resize_kernel.set_enabled(False)")
    resize_kernel.set_enabled(True)
    assert by_name()["resize_kernel"]["status"] == "ok"


@pytest.mark.skipif(not jpeg_kernel.available(), reason="the batch decoder is not in use here")
def test_a_batch_decoder_switched_off_is_information_only(kernels_restored: None) -> None:
    jpeg_kernel.set_enabled(False)
    assert batch_decoder_check() == {"name": "batch_decoder", "status": "info", "fix": None,
                                     "message": "compiled batch decoder not in use: disabled by "
                                                "jpeg_kernel.set_enabled(False)"}
    jpeg_kernel.set_enabled(True)
    check = batch_decoder_check()
    assert check["status"] == "ok" and check["message"].startswith(
        f"compiled batch decoder in use, on {jpeg_kernel.description()}: ")


def test_a_batch_decoder_with_no_reason_says_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jpeg_kernel, "available", lambda: False)
    monkeypatch.setattr(jpeg_kernel, "unavailable_reason", lambda: None)
    assert batch_decoder_check() == {"name": "batch_decoder", "status": "info", "fix": None,
                                     "message": "compiled batch decoder not in use: unknown"}

