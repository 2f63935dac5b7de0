"""What packload's speed-ups are doing here: the fast JPEG decoder (simplejpeg, a dependency that a
platform without its wheel may lack), the compiled resize kernel and the compiled batch decoder.
``doctor`` reports them, and recommends installing the decoder only where it is missing."""

from __future__ import annotations

import importlib.util

from packload.core import jpeg_kernel, resize_kernel
from packload.diagnose.checks import Check, check

FAST_EXTRA = "pip install simplejpeg (a dependency of packload that is missing here)"
BATCH_DECODER_BUILD_FIX = "install a C compiler (gcc), then reinstall packload: pip install -e ."
BATCH_DECODER_LIBRARY_FIX = ("install Pillow from its wheel (pip install --force-reinstall pillow), which carries "
                             "libjpeg-turbo, or the system's libjpeg-turbo (Debian/Ubuntu: apt-get install "
                             "libjpeg62-turbo)")


def fast_decoder_installed() -> bool:
    """Whether simplejpeg (the fast JPEG decoder) can be imported."""
    return importlib.util.find_spec("simplejpeg") is not None


def fast_hint(prefix: str = "; ") -> str:
    """``"; install the fast JPEG decoder: ..."`` where simplejpeg is missing, else ``""``."""
    return "" if fast_decoder_installed() else f"{prefix}install the fast JPEG decoder: {FAST_EXTRA}"


def software_checks() -> list[Check]:
    """The fast decoder and the compiled resize kernel: there, or why not and what to do."""
    checks = [check("fast_decoder", "ok", "fast JPEG decoder (simplejpeg, libjpeg-turbo) installed")
              if fast_decoder_installed() else
              check("fast_decoder", "info", "fast JPEG decoder (simplejpeg) not installed: JPEGs are decoded by "
                    "PIL, holding the GIL", FAST_EXTRA)]
    reason = resize_kernel.unavailable_reason
    if resize_kernel.available():
        checks.append(check("resize_kernel", "ok", "compiled resize kernel built and in use"))
    elif reason and "not built" in reason:
        checks.append(check("resize_kernel", "warn", f"compiled resize kernel not in use: {reason}; resizing falls "
                            "back to PyTorch (the same pixels, slower for shrinks up to 2x)",
                            "install a C compiler (gcc), then reinstall packload: pip install -e ."))
    else:
        checks.append(check("resize_kernel", "info", f"compiled resize kernel not in use: {reason}"))
    checks.append(batch_decoder_check())
    return checks


def batch_decoder_check() -> Check:
    """The compiled batch decoder: in use and on which libjpeg-turbo, or why not (and what to do)."""
    if jpeg_kernel.available():
        return check("batch_decoder", "ok", "compiled batch decoder in use, on "
                     f"{jpeg_kernel.description()}: PackLoader decodes only each crop's region, a whole batch in "
                     "one call")
    reason = jpeg_kernel.unavailable_reason() or "unknown"
    fallback = "; PackLoader decodes JPEGs one at a time (the same pixels; slower, most of all while a training " \
               "loop holds the GIL)"
    if "not built" in reason:
        return check("batch_decoder", "info", f"compiled batch decoder not in use: {reason}{fallback}",
                     BATCH_DECODER_BUILD_FIX)
    if "libjpeg-turbo" in reason:
        return check("batch_decoder", "info", f"compiled batch decoder not in use: {reason}{fallback}",
                     BATCH_DECODER_LIBRARY_FIX)
    return check("batch_decoder", "info", f"compiled batch decoder not in use: {reason}")
