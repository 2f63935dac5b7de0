"""The encoding options a pack notes in its manifest and checkpoints: read back into
``EncodeOptions``, and compared for ``pack --resume`` in the flags the user typed."""

from __future__ import annotations

from typing import Any

from packload.packer.encode import EncodeOptions

# The flag of ``pack`` that sets each field of an options record.
OPTION_FLAGS = {"backend": "--format", "encoding": "--encoding", "quality": "--quality", "max_side": "--max-side",
                "size": "--size", "check": "--check", "max_pixels": "--max-pixels", "labels": "--labels"}


def options_changed(before: dict[str, Any], now: dict[str, Any]) -> str:
    """``--encoding was keep, now jpeg`` for each option that differs between two records."""
    def shown(value: Any) -> str:
        if isinstance(value, (list, tuple)):
            return "x".join(str(v) for v in value)
        return "unset" if value is None else str(value)

    changes = [f"{OPTION_FLAGS.get(key, key)} was {shown(before.get(key))}, now {shown(now.get(key))}"
               for key in sorted(set(before) | set(now), key=lambda k: list(OPTION_FLAGS).index(k)
                                 if k in OPTION_FLAGS else len(OPTION_FLAGS))
               if before.get(key) != now.get(key)]
    return "; ".join(changes) or "unknown"


def options_from_record(record: dict[str, Any]) -> EncodeOptions:
    """The ``EncodeOptions`` noted in a manifest's or progress record's ``options``."""
    fields = {k: v for k, v in record.items() if k in EncodeOptions.__dataclass_fields__}
    if fields.get("size") is not None:
        fields["size"] = tuple(fields["size"])
    return EncodeOptions(**fields)
