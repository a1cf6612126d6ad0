"""How long a run waits after a counted provider failure before it asks again (R-EXEC-6,
R-EXEC-12), pure.

The n-th counted failure of a run waits ``base_s * 2 ** (n - 1)`` seconds, at most
``max_s``: with the defaults (3 s, 30 s) and ``QIMPL_PROVIDER_MAX_FAILURES`` 5 the asks
after the first failure come 3, 6, 12 and 24 s apart, so the fifth and last ask is 45 s
after the first failure and a model server that is down for less than that costs the run
nothing but time. A provider that said when to come back (HTTP 429/503 ``Retry-After``)
is waited for at least that long. No wait reaches past the run's deadline: a run is asked
again before it expires, or expires.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

__all__ = ["DEFAULT_BASE_S", "DEFAULT_MAX_S", "MAX_RETRY_AFTER_S", "backoff_left", "failure_delay",
           "parse_retry_after"]

DEFAULT_BASE_S = 3.0
DEFAULT_MAX_S = 30.0
#: The longest ``Retry-After`` kept, seconds: a day, the longest deadline a run can have
#: (R-EXEC-8). A longer one is cut to it (and ``failure_delay`` cuts it to the deadline).
MAX_RETRY_AFTER_S = 86_400.0


def failure_delay(failures: int, *, base_s: float = DEFAULT_BASE_S, max_s: float = DEFAULT_MAX_S,
                  retry_after_s: float | None = None, deadline_left_s: float | None = None) -> float:
    """Seconds to wait after the run's ``failures``-th counted failure (>= 1): the
    exponential backoff, raised to ``retry_after_s`` when the provider asked for longer,
    and cut to ``deadline_left_s`` (never negative). ValueError for ``failures`` < 1 or a
    negative base or bound."""
    if failures < 1:
        raise ValueError("failures counts from 1")
    if base_s < 0 or max_s < 0:
        raise ValueError("backoff seconds must not be negative")
    delay = min(max_s, base_s * 2.0 ** min(failures - 1, 62))
    if retry_after_s is not None and retry_after_s > delay:
        delay = float(retry_after_s)
    if deadline_left_s is not None:
        delay = min(delay, max(deadline_left_s, 0.0))
    return max(delay, 0.0)


def backoff_left(failures: int, since_failure_s: float | None, *, base_s: float = DEFAULT_BASE_S,
                 max_s: float = DEFAULT_MAX_S, retry_after_s: float | None = None) -> float:
    """Seconds a new attempt still waits before it asks (R-EXEC-6): the delay of the
    run's ``failures``-th counted failure (``failure_delay``: the backoff, or the
    ``retry_after_s`` its provider asked for when longer) less ``since_failure_s``, the
    seconds since that failure's call ended by the database's clock; 0 with no counted
    failure or no failed call recorded. An attempt retried without Temporal's delay (the
    failing attempt's own report lost to a takeover of its lease, a crash right after
    the count, an operator reset) so still waits the whole delay out."""
    if failures < 1 or since_failure_s is None:
        return 0.0
    delay = failure_delay(failures, base_s=base_s, max_s=max_s, retry_after_s=retry_after_s)
    return max(delay - since_failure_s, 0.0)


_DAYS = "Mon|Tue|Wed|Thu|Fri|Sat|Sun"
_LONG_DAYS = "Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday"
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MONTH = "|".join(_MONTHS)
_TIME = r"([0-9]{2}):([0-9]{2}):([0-9]{2})"
# RFC 9110, section 5.6.7: the three HTTP-date forms, case-sensitive, ASCII digits only
# (``[0-9]``, never ``\d``, which matches any script's digits).
_IMF_FIXDATE = re.compile(rf"(?:{_DAYS}), ([0-9]{{2}}) ({_MONTH}) ([0-9]{{4}}) {_TIME} GMT")
_RFC850_DATE = re.compile(rf"(?:{_LONG_DAYS}), ([0-9]{{2}})-({_MONTH})-([0-9]{{2}}) {_TIME} GMT")
_ASCTIME_DATE = re.compile(rf"(?:{_DAYS}) ({_MONTH}) ([0-9 ][0-9]) {_TIME} ([0-9]{{4}})")
_DELAY_SECONDS = re.compile(r"[0-9]+")


def _http_date(text: str, *, now: float) -> float | None:
    """``text`` as an HTTP-date (RFC 9110, 5.6.7), epoch seconds; None when it is not one
    (or names no real time: 31 Feb, hour 24, year 0). A two-digit rfc850 year that would be
    more than 50 years ahead of ``now`` is the latest such year in the past, as the RFC
    says; a leap second (``:60``) is read as ``:59``."""
    if m := _IMF_FIXDATE.fullmatch(text):
        day, month, year, hh, mm, ss = m.groups()
    elif m := _RFC850_DATE.fullmatch(text):
        day, month, yy, hh, mm, ss = m.groups()
        try:
            this_year = datetime.fromtimestamp(now, UTC).year
        except (ValueError, OverflowError, OSError):
            return None
        year = str(this_year - this_year % 100 + int(yy))
        if int(year) > this_year + 50:
            year = str(int(year) - 100)
    elif m := _ASCTIME_DATE.fullmatch(text):
        month, day, hh, mm, ss, year = m.groups()
    else:
        return None
    try:
        when = datetime(int(year), _MONTHS.index(month) + 1, int(day), int(hh), int(mm),
                        min(int(ss), 59), tzinfo=UTC)
    except ValueError:
        return None
    return when.timestamp()


def parse_retry_after(value: str | None, *, now: float) -> float | None:
    """An HTTP ``Retry-After`` value as seconds from ``now`` (epoch s), as RFC 9110
    (section 10.2.3) reads it: ``delay-seconds`` (``1*DIGIT``, ASCII digits only) or an
    HTTP-date (``_http_date``), with the field's surrounding spaces and tabs dropped.
    Anything else (a fraction, a sign, an exponent, another script's digits such as
    ``¹`` or ``٣``, two values, garbage) is None: ignored, never an exception. Never
    negative (a date past is 0) and never above ``MAX_RETRY_AFTER_S``."""
    if value is None:
        return None
    text = value.strip(" \t")
    if _DELAY_SECONDS.fullmatch(text):
        digits = text.lstrip("0")
        # Compared by length first: int() refuses strings of more than 4,300 digits.
        if len(digits) > len(str(int(MAX_RETRY_AFTER_S))):
            return MAX_RETRY_AFTER_S
        return min(float(int(digits or "0")), MAX_RETRY_AFTER_S)
    when = _http_date(text, now=now)
    if when is None:
        return None
    return min(max(when - now, 0.0), MAX_RETRY_AFTER_S)
