"""The wait after a counted provider failure (issue 25, item 8; R-EXEC-6, R-EXEC-12)."""

from __future__ import annotations

import pytest

from qimpl.backoff import backoff_left, failure_delay, parse_retry_after


@pytest.mark.req("R-EXEC-6")
def test_failures_are_spaced_exponentially_up_to_the_bound() -> None:
    assert [failure_delay(n) for n in range(1, 7)] == [3.0, 6.0, 12.0, 24.0, 30.0, 30.0]
    # With the default five failures the last ask is 3 + 6 + 12 + 24 = 45 s after the first
    # failure: an outage shorter than that is survived.
    assert sum(failure_delay(n) for n in range(1, 5)) == 45.0
    assert failure_delay(1, base_s=0.2, max_s=1) == 0.2 and failure_delay(9, base_s=0.2, max_s=1) == 1.0
    assert failure_delay(10_000) == 30.0  # no overflow for a huge count


@pytest.mark.req("R-EXEC-6", "R-EXEC-12")
def test_retry_after_is_honoured_within_the_deadline() -> None:
    assert failure_delay(1, retry_after_s=20) == 20.0          # the provider asked for longer
    assert failure_delay(4, retry_after_s=2) == 24.0           # never shorter than the backoff
    assert failure_delay(1, retry_after_s=20, deadline_left_s=5) == 5.0   # never past the deadline
    assert failure_delay(3, deadline_left_s=-1) == 0.0


def test_nonsense_is_refused() -> None:
    for bad in ({"failures": 0}, {"failures": 1, "base_s": -1}):
        with pytest.raises(ValueError):
            failure_delay(**bad)  # type: ignore[arg-type]


def test_retry_after_values() -> None:
    now = 1_800_000_000.0
    assert parse_retry_after("8", now=now) == 8.0
    assert parse_retry_after("Fri, 15 Jan 2027 08:00:20 GMT", now=1_800_000_000.0) is not None
    date = "Thu, 01 Jan 1970 00:01:40 GMT"  # 100 s after the epoch
    assert parse_retry_after(date, now=40.0) == 60.0 and parse_retry_after(date, now=400.0) == 0.0
    for bad in (None, "", "soon", "-3", "1.5e9x"):
        assert parse_retry_after(bad, now=now) is None, bad


@pytest.mark.req("R-EXEC-6")
def test_a_retry_waits_what_is_left_of_the_backoff() -> None:
    assert backoff_left(0, 0.1) == 0.0                      # no counted failure
    assert backoff_left(1, None) == 0.0                     # no failed call recorded
    assert backoff_left(1, 1.0, base_s=3, max_s=30) == 2.0  # a retry 1 s after the failure
    assert backoff_left(3, 5.0, base_s=3, max_s=30) == 7.0  # the third failure waits 12 s
    assert backoff_left(1, 4.0, base_s=3, max_s=30) == 0.0  # Temporal's delay already passed
    assert backoff_left(9, 0.0, base_s=3, max_s=30) == 30.0
    # The provider's Retry-After, kept on the failed call's record, when above the backoff.
    assert backoff_left(1, 1.0, base_s=3, max_s=30, retry_after_s=8) == 7.0
    assert backoff_left(1, 1.0, base_s=3, max_s=30, retry_after_s=2) == 2.0  # the backoff is longer
    assert backoff_left(1, 9.0, base_s=3, max_s=30, retry_after_s=8) == 0.0
