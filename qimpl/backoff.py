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

import email.utils

__all__ = ["DEFAULT_BASE_S", "DEFAULT_MAX_S", "backoff_left", "failure_delay", "parse_retry_after"]

DEFAULT_BASE_S = 3.0
DEFAULT_MAX_S = 30.0


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


def parse_retry_after(value: str | None, *, now: float) -> float | None:
    """An HTTP ``Retry-After`` value (RFC 9110: delay seconds, or an HTTP date) as seconds
    from ``now`` (epoch s); None for a missing or unreadable value. Never negative."""
    if not value or not value.strip():
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(when.timestamp() - now, 0.0)
