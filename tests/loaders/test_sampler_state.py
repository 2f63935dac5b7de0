"""``loaders.sampler_state``: a saved state survives JSON and gives back its seed, epoch and position;
a state of another pack or other options, or a damaged one, is refused in one line that says what
differs and what to do. (Resuming a ``PackSampler`` end to end is tested in test_sampler.py.)"""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Any

import pytest

from packload.loaders.sampler_state import STATE_VERSION, resume_point, saved_state

OPTIONS = {"order": "block", "block_size": 64, "window_blocks": 32, "world_size": 2, "uneven": "pad"}


def saved(**changes: Any) -> dict[str, Any]:
    """A state of seed 7, epoch 3, position 40 of a 1000-record pack, through JSON, with ``changes``."""
    state = json.loads(json.dumps(saved_state(7, 3, 40, 1000, 1, dict(OPTIONS))))
    state.update(changes)
    return state


def refused(state: Any, error: type[Exception] = ValueError, options: dict[str, Any] | None = None) -> str:
    """The one-line message ``resume_point`` refuses ``state`` with (500 samples per rank)."""
    with pytest.raises(error) as caught:
        resume_point(state, 1000, dict(OPTIONS) if options is None else options, 500)
    text = str(caught.value)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize("position", [0, 1, 40, 499, 500])
def test_a_state_round_trips_through_json(position: int) -> None:
    state = saved_state(2**40, 12, position, 1000, 1, dict(OPTIONS))
    assert state == {"version": STATE_VERSION, "seed": 2**40, "epoch": 12, "position": position,
                     "num_records": 1000, "rank": 1, "options": OPTIONS}
    assert resume_point(json.loads(json.dumps(state)), 1000, dict(OPTIONS), 500) == (2**40, 12, position)


def test_the_rank_saved_is_not_checked() -> None:
    """Every rank consumes the same count, so rank 0's state is loaded on all ranks; a state saved
    without a rank loads too. A read-only mapping is as good as a dict."""
    assert resume_point(saved(rank=0), 1000, dict(OPTIONS), 500) == (7, 3, 40)
    assert resume_point({k: v for k, v in saved().items() if k != "rank"}, 1000, dict(OPTIONS), 500) == (7, 3, 40)
    assert resume_point(MappingProxyType(saved()), 1000, dict(OPTIONS), 500) == (7, 3, 40)


def test_a_state_of_another_pack_is_refused() -> None:
    assert refused(saved(num_records=999)) == ("state mismatch: num_records was 999 when saved but is 1000 now; "
                                               "resume only over the same pack")


def test_every_option_that_differs_is_named_at_once() -> None:
    """In key order, each with its saved and current value; an option one side lacks shows as None."""
    options = {**OPTIONS, "block_size": 16, "uneven": "drop", "sizes": [600, 400]}
    del options["window_blocks"]
    assert refused(saved(), options=options) == (
        "state mismatch: block_size=64 when saved but 16 now; sizes=None when saved but [600, 400] now; "
        "uneven='pad' when saved but 'drop' now; window_blocks=32 when saved but None now; "
        "build the sampler with the saved options")


@pytest.mark.parametrize(("state", "error", "message"), [
    ("{}", TypeError, "state must be a dict from PackSampler.state_dict(), got str"),
    ({}, ValueError, "state is missing ['epoch', 'num_records', 'options', 'position', 'seed', 'version']; "
                     "pass a dict from PackSampler.state_dict()"),
    ({"version": 1, "seed": 0}, ValueError, "state is missing ['epoch', 'num_records', 'options', 'position']; "
                                            "pass a dict from PackSampler.state_dict()"),
    (saved(version=2), ValueError, f"unsupported state version 2; expected {STATE_VERSION}"),
    (saved(version="1"), ValueError, f"unsupported state version '1'; expected {STATE_VERSION}"),
    (saved(options=list(OPTIONS.items())), ValueError, "state['options'] must be a dict, got list"),
    (saved(seed=-1), ValueError, "state['seed'] must be >= 0, got -1"),
    (saved(seed=7.0), TypeError, "state['seed'] must be an int, got float (7.0)"),
    (saved(epoch=True), TypeError, "state['epoch'] must be an int, got bool (True)"),
    (saved(epoch="3"), TypeError, "state['epoch'] must be an int, got str ('3')"),
    (saved(position=-1), ValueError, "state['position'] must be >= 0, got -1"),
    (saved(position=501), ValueError, "state['position']=501 exceeds the 500 samples this rank has per epoch"),
    (saved(position=None), TypeError, "state['position'] must be an int, got NoneType (None)"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_damaged_state_is_refused(state: Any, error: type[Exception], message: str) -> None:
    assert refused(state, error) == message
