"""How long a request to an object store may take (``packload.core.remote_deadlines``): the timeout
from the argument, ``$PACKLOAD_TIMEOUT`` or the default; a second more per MiB moved; and, on a
virtual clock, the promises of the module's docstring: at most ``RETRIES`` attempts, pauses of
``RETRY_PAUSE`` doubled after each, and all the attempts of one request stopped ``timeout`` seconds
after the first attempt's deadline. (Bad values of ``$PACKLOAD_TIMEOUT`` and the deadline of an
8 MiB transfer are in tests/core/test_remote.py.)"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from packload.core import remote
from packload.core.errors import PackloadError, UsageError
from packload.core.remote_deadlines import (
    DEFAULT_TIMEOUT,
    MIN_RATE,
    RETRIES,
    RETRY_PAUSE,
    TIMEOUT_VARIABLE,
    attempt_deadline,
    request_timeout,
)


def test_the_default_when_the_variable_is_unset_or_blank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TIMEOUT_VARIABLE, raising=False)
    assert request_timeout() == DEFAULT_TIMEOUT == 20.0
    monkeypatch.setenv(TIMEOUT_VARIABLE, "  \t")
    assert request_timeout() == DEFAULT_TIMEOUT
    monkeypatch.setenv(TIMEOUT_VARIABLE, " 3.5 \n")  # as a shell or a .env file may leave it
    assert request_timeout() == 3.5


def test_an_explicit_timeout_wins_and_the_variable_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TIMEOUT_VARIABLE, "not seconds")
    assert request_timeout(4) == 4.0 and request_timeout(0.25) == 0.25


@pytest.mark.parametrize(("given", "named"), [(0, "timeout 0"), (-1.5, "timeout -1.5"), (float("nan"), "timeout nan"),
                                              (float("inf"), "timeout inf")])
def test_a_bad_explicit_timeout_names_itself_not_the_variable(given: float, named: str) -> None:
    with pytest.raises(UsageError) as info:
        request_timeout(given)
    assert str(info.value) == (f"{named}: give the seconds a request to the object store may take, more than 0, "
                               "for example 20")


def test_a_bad_variable_is_quoted_in_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TIMEOUT_VARIABLE, "nan")
    with pytest.raises(UsageError) as info:
        request_timeout()
    assert str(info.value) == ("PACKLOAD_TIMEOUT='nan': give the seconds a request to the object store may take, "
                               "more than 0, for example 20")


def test_an_attempt_gets_a_second_per_mib() -> None:
    assert MIN_RATE == 1 << 20
    assert attempt_deadline(5.0) == 5.0 and attempt_deadline(5.0, 0) == 5.0
    assert attempt_deadline(5.0, MIN_RATE // 2) == 5.5
    assert attempt_deadline(0.5, 3 * MIN_RATE + 1) == pytest.approx(3.5 + 1 / MIN_RATE)


class Clock:
    """A virtual ``time`` for ``packload.core.remote``: ``sleep`` advances it and is noted."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(remote, "time", fake)
    return fake


def resets(clock: Clock, attempts: list[float]) -> Callable[[], None]:
    """A request whose connection is reset each time, noting when each attempt starts."""
    def reset() -> None:
        attempts.append(clock.now)
        raise ConnectionResetError("connection reset by peer")
    return reset


def test_at_most_retries_attempts_with_doubling_pauses(clock: Clock) -> None:
    attempts: list[float] = []
    with pytest.raises(PackloadError, match=rf"after {RETRIES} attempt\(s\) in 3 s"):
        remote.retried(resets(clock, attempts), "s3://b/x", until=1000.0)
    pauses = [RETRY_PAUSE * 2 ** k for k in range(RETRIES - 1)]
    assert RETRIES == 5 and clock.slept == pytest.approx(pauses) == [0.2, 0.4, 0.8, 1.6]
    assert attempts == pytest.approx([sum(pauses[:k]) for k in range(RETRIES)])


def test_attempts_stop_about_twice_the_timeout_after_the_first(clock: Clock) -> None:
    """Without ``until``, no attempt starts past two timeouts: with a timeout of 1 s, the fifth
    attempt (due at 3.0 s) is not made and the error says four."""
    attempts: list[float] = []
    with pytest.raises(PackloadError, match=r"after 4 attempt\(s\) in 1 s"):
        remote.retried(resets(clock, attempts), "s3://b/x", timeout=1.0)
    assert attempts == pytest.approx([0.0, 0.2, 0.6, 1.4])


def test_a_requests_attempts_share_one_deadline(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request moving 2 MiB with a timeout of 1 s: its first attempt may take 1 + 2 s, and all of
    them end 1 s after that (at 4 s): the second attempt, started at 3.2 s, gets what is left."""
    deadlines: list[float] = []

    def stalls(self: remote.RemoteStore, method: str, *args: object, deadline: float, **kwargs: object) -> None:
        deadlines.append(deadline)
        clock.now += deadline  # the store says nothing until the deadline passes
        raise TimeoutError(f"{method} timed out")

    monkeypatch.setattr(remote.RemoteStore, "_call", stalls)
    monkeypatch.setattr(remote.RemoteStore, "_probe", lambda self: None)  # the endpoint listens
    store = remote.RemoteStore("s3://bkt/p.lmdb", timeout=1.0)
    with pytest.raises(PackloadError) as info:
        store.write_bytes("x", b"\0" * (2 << 20))
    assert deadlines == pytest.approx([3.0, 0.8]) and clock.now == pytest.approx(4.0)
    assert str(info.value).startswith("s3://bkt/p.lmdb/x: the object store did not answer after 2 attempt(s) in 4 s "
                                      "(each may take 1 s, and a second more per MiB moved)")
