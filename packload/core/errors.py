"""The errors packload raises, so callers can catch what they can handle.

Every message names the file at fault and, where there is one, the fix. The command line
prints ``str(error)`` on one line and exits non-zero; it never shows a traceback for these.
"""

from __future__ import annotations


class PackloadError(Exception):
    """Base class of every error packload raises on purpose."""


class UsageError(PackloadError, ValueError):
    """A bad argument or option: a missing source, a destination that exists, a wrong value."""


class PackFormatError(PackloadError):
    """A pack that is not one, is of an unknown version, or whose index or manifest is damaged."""


class IncompletePackError(PackFormatError):
    """A pack whose writing did not finish (no manifest); ``pack --resume`` can finish it."""


class PackChangedError(PackFormatError):
    """The path now holds another pack than the one a dataset opened (it was packed again over it)."""


class ChecksumError(PackFormatError):
    """A record whose bytes do not match the checksum stored when it was packed."""


class SkippedFileError(PackloadError):
    """Raised under ``--strict`` when a source file cannot be packed."""


class WriteError(PackloadError, OSError):
    """The destination could not be written (disk full, file-size limit, permissions)."""


class SplitTwiceError(PackloadError, RuntimeError):
    """A sampler already split by rank that a framework splits again: each rank would see a fraction
    of its share, and part of the pack none at all."""
