"""The wait after a counted provider failure (issue 25, item 8; R-EXEC-6, R-EXEC-12)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from qimpl.backoff import MAX_RETRY_AFTER_S, backoff_left, failure_delay, parse_retry_after


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


NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z
_OWS = st.text(alphabet=" \t", max_size=3)
_DATES = st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59),
                      timezones=st.just(UTC)).map(lambda d: d.replace(microsecond=0))


def _expected(when: datetime, now: float = NOW) -> float:
    return min(max(when.timestamp() - now, 0.0), MAX_RETRY_AFTER_S)


@pytest.mark.req("R-EXEC-6", "R-PROV-1")
@given(st.one_of(st.text(), st.text(alphabet=st.characters(codec="latin-1")),
                 st.from_regex(r"\A[0-9.,+\- eE]{1,30}\Z")))
@example("\u00b9")  # issue 56 item 10: isdigit() true, float() refuses it
@example("\u0663")  # ARABIC-INDIC DIGIT THREE: float() reads it, RFC 9110 does not
@example("9" * 5000)  # more digits than int() reads
def test_any_retry_after_value_is_seconds_or_ignored_never_an_exception(value: str) -> None:
    """Issue 56 item 10: whatever the header says, the parser answers None or a finite
    number of seconds within [0, MAX_RETRY_AFTER_S]; it never raises."""
    got = parse_retry_after(value, now=NOW)
    assert got is None or (isinstance(got, float) and math.isfinite(got) and 0.0 <= got <= MAX_RETRY_AFTER_S)


@pytest.mark.req("R-EXEC-6")
@given(st.integers(min_value=0, max_value=10**40), st.integers(min_value=0, max_value=3), _OWS, _OWS)
def test_delay_seconds_are_ascii_digits_cut_to_a_day(n: int, zeros: int, before: str, after: str) -> None:
    assert parse_retry_after(f"{before}{'0' * zeros}{n}{after}", now=NOW) == min(float(n), MAX_RETRY_AFTER_S)


@pytest.mark.req("R-EXEC-6")
@given(st.text(alphabet=st.characters(categories=["Nd", "No"]), min_size=1, max_size=5))
def test_digits_of_other_scripts_are_ignored(digits: str) -> None:
    if not digits.isascii():
        assert parse_retry_after(digits, now=NOW) is None


@pytest.mark.req("R-EXEC-6")
@given(_DATES, _OWS)
def test_the_three_http_date_forms_are_read(when: datetime, ows: str) -> None:
    imf = format_datetime(when, usegmt=True)  # IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT
    assert parse_retry_after(f"{ows}{imf}{ows}", now=NOW) == _expected(when)
    asctime = when.strftime("%a %b ") + f"{when.day:2d}" + when.strftime(" %H:%M:%S ") + f"{when.year:04d}"
    assert parse_retry_after(asctime, now=NOW) == _expected(when)
    # rfc850-date: a two-digit year, read as the latest not more than 50 years ahead.
    if 1978 <= when.year <= 2076:
        rfc850 = when.strftime("%A, %d-%b-") + f"{when.year % 100:02d}" + when.strftime(" %H:%M:%S GMT")
        assert parse_retry_after(rfc850, now=NOW) == _expected(when)


@pytest.mark.req("R-EXEC-6")
@pytest.mark.parametrize(("value", "seconds"), [
    ("8", 8.0),
    ("0", 0.0),
    (" 12\t", 12.0),                                   # the field's spaces are not the value
    ("007", 7.0),
    ("600", 600.0),
    ("86401", MAX_RETRY_AFTER_S),                       # more than a day: a day
    ("1" * 400, MAX_RETRY_AFTER_S),                     # float() would read inf
    ("9" * 5000, MAX_RETRY_AFTER_S),                    # int() would refuse it
    ("Fri, 15 Jan 2027 08:00:20 GMT", 20.0),            # IMF-fixdate
    ("Friday, 15-Jan-27 08:00:20 GMT", 20.0),           # rfc850-date
    ("Fri Jan 15 08:00:20 2027", 20.0),                 # asctime-date
    ("Fri Jan  5 08:00:20 2027", 0.0),                  # a date past: at once
    ("Fri, 15 Jan 2027 08:00:60 GMT", 59.0),            # a leap second
    ("Sat, 15 Jan 2028 08:00:00 GMT", MAX_RETRY_AFTER_S),
    ("\u00b9", None),                                   # SUPERSCRIPT ONE (the bug)
    ("\u0663", None),                                   # ARABIC-INDIC DIGIT THREE
    ("\uff18", None),                                   # FULLWIDTH DIGIT EIGHT
    ("1.5", None), ("-3", None), ("+3", None), ("1e3", None), ("0x10", None), ("3, 4", None),
    ("3 4", None), ("", None), ("   ", None), (None, None), ("soon", None), ("1.5e9x", None),
    ("Fri, 31 Feb 2027 08:00:00 GMT", None),            # no such day
    ("Fri, 15 Jan 2027 24:00:00 GMT", None),
    ("fri, 15 jan 2027 08:00:20 gmt", None),            # HTTP-date is case-sensitive
    ("Fri, 15 Jan 2027 08:00:20 +0000", None),          # not an HTTP-date
    ("Fri, 15 Jan 0000 08:00:20 GMT", None),            # year 0
    ("Fri, 15 Jan 2027 08:00:20 GMT, Fri, 15 Jan 2027 08:00:30 GMT", None),
])
def test_named_retry_after_values(value: str | None, seconds: float | None) -> None:
    assert parse_retry_after(value, now=NOW) == seconds


def test_a_two_digit_year_more_than_fifty_years_ahead_is_in_the_past() -> None:
    # now is 2027: "99" is 1999 (2099 is more than 50 years ahead), "77" is 2077.
    assert parse_retry_after("Friday, 15-Jan-99 08:00:20 GMT", now=NOW) == 0.0
    ahead = datetime(2077, 1, 15, 8, 0, 20, tzinfo=UTC)
    assert parse_retry_after("Friday, 15-Jan-77 08:00:20 GMT", now=NOW) == _expected(ahead)
    assert parse_retry_after("Friday, 15-Jan-27 08:00:20 GMT", now=1e300) is None  # no year for now
    assert _expected(datetime(2027, 1, 15, 8, 0, 0, tzinfo=UTC) + timedelta(seconds=5)) == 5.0
