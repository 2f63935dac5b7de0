"""A sampler's saved state, to resume an epoch mid-way: what is saved, and the checks that a state
loaded is of the same order (the same pack and options) before its position is trusted."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packload.loaders.sampler_args import check_int

STATE_VERSION = 1


def saved_state(seed: int, epoch: int, position: int, num_records: int, rank: int,
                options: dict[str, Any]) -> dict[str, Any]:
    """The JSON-serialisable state of a sampler at ``position`` of ``epoch``."""
    return {
        "version": STATE_VERSION,
        "seed": seed,
        "epoch": epoch,
        "position": position,
        "num_records": num_records,
        "rank": rank,
        "options": options,
    }


def resume_point(state: Mapping[str, Any], num_records: int, options: dict[str, Any],
                 per_rank: int) -> tuple[int, int, int]:
    """(seed, epoch, position) of ``state``, checked against a sampler of ``num_records`` records, these
    ``options`` and ``per_rank`` samples per epoch; ValueError (or TypeError) saying what differs."""
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a dict from PackSampler.state_dict(), got {type(state).__name__}")
    missing = sorted({"version", "seed", "epoch", "position", "num_records", "options"} - state.keys())
    if missing:
        raise ValueError(f"state is missing {missing}; pass a dict from PackSampler.state_dict()")
    if state["version"] != STATE_VERSION:
        raise ValueError(f"unsupported state version {state['version']!r}; expected {STATE_VERSION}")
    if state["num_records"] != num_records:
        raise ValueError(
            f"state mismatch: num_records was {state['num_records']!r} when saved but is "
            f"{num_records} now; resume only over the same pack"
        )
    _check_options(state["options"], options)
    seed = check_int("state['seed']", state["seed"], 0)
    epoch = check_int("state['epoch']", state["epoch"], 0)
    position = check_position("state['position']", state["position"], per_rank)
    return seed, epoch, position


def check_position(name: str, value: Any, per_rank: int) -> int:
    """Validate a position within a rank's epoch of ``per_rank`` samples (0..per_rank inclusive)."""
    position = check_int(name, value, 0)
    if position > per_rank:
        raise ValueError(f"{name}={position} exceeds the {per_rank} samples this rank has per epoch")
    return position


def _check_options(saved: Any, options: dict[str, Any]) -> None:
    """Raise a ValueError naming every option that differs between ``saved`` and ``options``."""
    if not isinstance(saved, Mapping):
        raise ValueError(f"state['options'] must be a dict, got {type(saved).__name__}")
    keys = sorted(set(saved) | set(options))
    diffs = [
        f"{key}={saved.get(key)!r} when saved but {options.get(key)!r} now"
        for key in keys
        if saved.get(key) != options.get(key)
    ]
    if diffs:
        raise ValueError(
            "state mismatch: " + "; ".join(diffs) + "; build the sampler with the saved options"
        )
