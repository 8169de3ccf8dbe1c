"""aenv_ray.retry: the one backoff loop, on a virtual clock (nothing here waits)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from aenv_ray.retry import Backoff, aretry, retry


class Clock:
    """Virtual time: ``sleep`` advances it and records the pause."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)


class Flaky:
    """Raises the given errors in turn, then answers ``"ok"``; counts the tries."""

    def __init__(self, *errors: Exception) -> None:
        self.errors: Iterator[Exception] = iter(errors)
        self.tries = 0

    def __call__(self) -> str:
        self.tries += 1
        error = next(self.errors, None)
        if error is not None:
            raise error
        return "ok"

    async def acall(self) -> str:
        return self()


def refused(exc: Exception) -> bool:
    return isinstance(exc, ConnectionRefusedError)


def test_pauses_grow_exponentially_up_to_the_cap() -> None:
    backoff = Backoff(first=0.5, factor=2, most=3.0, jitter=0)
    assert [backoff.pause(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_jitter_stays_within_its_fraction_and_varies() -> None:
    backoff = Backoff(first=1.0, most=1.0, jitter=0.2)
    rng = random.Random(7)
    pauses = [backoff.pause(1, rng) for _ in range(200)]
    assert all(0.8 <= p <= 1.2 for p in pauses)
    assert len({round(p, 6) for p in pauses}) > 100  # spread, not one value


def test_retries_until_the_call_answers() -> None:
    clock, call = Clock(), Flaky(ConnectionRefusedError("a"), ConnectionRefusedError("b"))
    result = retry(
        call,
        Backoff(first=0.1, jitter=0, tries=5),
        retryable=refused,
        sleep=clock.sleep,
        clock=clock,
    )
    assert result == "ok"
    assert call.tries == 3
    assert clock.slept == [0.1, 0.2]


def test_an_error_that_is_not_retryable_is_raised_at_once() -> None:
    clock, call = Clock(), Flaky(PermissionError("no"))
    with pytest.raises(PermissionError, match="no"):
        retry(call, Backoff(tries=5), retryable=refused, sleep=clock.sleep, clock=clock)
    assert call.tries == 1
    assert clock.slept == []


def test_tries_spent_raise_the_last_error_unchanged() -> None:
    errors = [ConnectionRefusedError(f"try {n}") for n in range(1, 6)]
    clock, call = Clock(), Flaky(*errors)
    with pytest.raises(ConnectionRefusedError) as raised:
        retry(
            call,
            Backoff(first=0.1, jitter=0, tries=3),
            retryable=refused,
            sleep=clock.sleep,
            clock=clock,
        )
    assert raised.value is errors[2]  # the third try's own error, not a wrapper
    assert raised.value.__context__ is None  # nothing chained from the earlier tries
    assert call.tries == 3
    assert clock.slept == [0.1, 0.2]


def test_the_deadline_stops_before_a_pause_that_would_pass_it() -> None:
    clock, call = Clock(), Flaky(*[ConnectionRefusedError("down")] * 20)
    with pytest.raises(ConnectionRefusedError):
        retry(
            call,
            Backoff(first=0.1, most=1.0, jitter=0, within=1.0),
            retryable=refused,
            sleep=clock.sleep,
            clock=clock,
        )
    # 0.1 + 0.2 + 0.4 = 0.7 s; the next pause (0.8) would end at 1.5 s, past the deadline
    assert clock.slept == [0.1, 0.2, 0.4]
    assert call.tries == 4


def test_time_spent_in_the_calls_counts_against_the_deadline() -> None:
    clock = Clock()

    def slow() -> str:
        clock.now += 0.6  # each try takes 0.6 s of (virtual) time
        raise ConnectionRefusedError("down")

    with pytest.raises(ConnectionRefusedError):
        retry(
            slow,
            Backoff(first=0.1, jitter=0, within=1.0),
            retryable=refused,
            sleep=clock.sleep,
            clock=clock,
        )
    assert clock.slept == [0.1]  # 0.6 + 0.1 + 0.6 = 1.3 s: no third try


def test_a_wait_hint_replaces_the_computed_pause() -> None:
    clock = Clock()
    call = Flaky(ConnectionRefusedError("busy"), ConnectionRefusedError("down"))
    retry(
        call,
        Backoff(first=0.1, jitter=0, tries=5),
        retryable=refused,
        wait_hint=lambda exc: 7.0 if str(exc) == "busy" else None,
        sleep=clock.sleep,
        clock=clock,
    )
    assert clock.slept == [7.0, 0.2]


def test_on_retry_sees_each_error_its_number_and_pause() -> None:
    clock = Clock()
    first, second = ConnectionRefusedError("a"), ConnectionRefusedError("b")
    seen: list[tuple[Exception, int, float]] = []
    retry(
        Flaky(first, second),
        Backoff(first=0.1, jitter=0, tries=5),
        retryable=refused,
        on_retry=lambda exc, n, pause: seen.append((exc, n, pause)),
        sleep=clock.sleep,
        clock=clock,
    )
    assert seen == [(first, 1, 0.1), (second, 2, 0.2)]


def test_a_seeded_rng_makes_jittered_pauses_reproducible() -> None:
    def run() -> list[float]:
        clock = Clock()
        retry(
            Flaky(*[ConnectionRefusedError("x")] * 4),
            Backoff(first=0.1, jitter=0.5, tries=5),
            retryable=refused,
            sleep=clock.sleep,
            clock=clock,
            rng=random.Random(3),
        )
        return clock.slept

    first, second = run(), run()
    assert first == second
    assert first != [0.1, 0.2, 0.4, 0.8]  # jittered
    assert all(0.5 * b <= p <= 1.5 * b for p, b in zip(first, [0.1, 0.2, 0.4, 0.8], strict=True))


async def test_the_async_twin_behaves_the_same() -> None:
    clock = Clock()
    call = Flaky(ConnectionRefusedError("a"), ConnectionRefusedError("b"), ConnectionRefusedError())
    with pytest.raises(ConnectionRefusedError):
        await aretry(
            call.acall,
            Backoff(first=0.1, jitter=0, tries=3),
            retryable=refused,
            sleep=clock.asleep,
            clock=clock,
        )
    assert call.tries == 3
    assert clock.slept == [0.1, 0.2]
    again = Flaky(ConnectionRefusedError("a"))
    assert (
        await aretry(
            again.acall, Backoff(first=0.1, jitter=0), retryable=refused, sleep=clock.asleep
        )
        == "ok"
    )


def test_cancellation_and_keyboard_interrupt_are_never_retried() -> None:
    clock, call = Clock(), Flaky()

    def interrupted() -> str:
        call()
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        retry(interrupted, Backoff(tries=5), retryable=lambda e: True, sleep=clock.sleep)
    assert call.tries == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"first": -1.0},
        {"factor": 0.5},
        {"jitter": 1.5},
        {"tries": 0},
    ],
)
def test_a_nonsensical_backoff_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="Backoff"):
        Backoff(**bad)  # type: ignore[arg-type]
