"""Observed usage of a run (R-Q34-2), pure: what the provider reported of one call, and
the run's usage as the API projects it.

The run's checkpointed ``usage`` (``runs.usage``) is written with each checkpoint, so it
loses what an attempt asked before it died. Durable runs therefore count provider calls
and tokens from the provider-call record (``provider_calls``, written by the owner before
each call and settled after it): every call actually asked, by any attempt. Tool calls
are counted with each tool intent (``runs.usage.tool_calls``, committed with the intent
itself). Legacy runs (``lifecycle_version`` 1) keep their own counters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["reported_tokens", "run_usage"]


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def reported_tokens(usage: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """``(input_tokens, output_tokens)`` a provider reported in ``StepResult.usage``; None
    for a count it did not report or that is not an int >= 0."""
    return _count(usage.get("input_tokens")), _count(usage.get("output_tokens"))


def run_usage(committed: Mapping[str, Any], observed: Mapping[str, Any] | None, *,
              durable: bool) -> dict[str, Any]:
    """The ``usage`` of a run read (R-READ-1, R-Q34-2): ``committed`` (``runs.usage``) with,
    for a durable run, ``provider_calls``, ``input_tokens`` and ``output_tokens`` taken from
    ``observed`` (the aggregate of its provider-call record, ``qimpl.db.usage``; a token
    total is None, unknown, once a succeeded call did not report it), plus
    ``provider_calls_no_outcome`` (calls whose outcome no owner recorded: in progress, or
    their owner stopped during them: it died, lost its lease, or the run was cancelled), ``tool_calls`` (0 when none was sent) and the wall times in seconds: ``wall_time_s`` from ``accepted_at``
    and ``wall_s`` (kept from earlier versions) from ``started_at``, each to the run's end
    or now, by the database's clock. Keys are only added, never removed."""
    usage = dict(committed)
    if observed is None:
        return usage
    if durable:
        usage["provider_calls"] = int(observed.get("provider_calls") or 0)
        for key in ("input_tokens", "output_tokens"):
            # Unknown (a succeeded call did not report it) is None, never 0 (issue 25, item 9).
            usage[key] = None if observed.get(key) is None else int(observed[key])
        usage["provider_calls_no_outcome"] = int(observed.get("provider_calls_no_outcome") or 0)
        usage.setdefault("tool_calls", 0)
    for key in ("wall_time_s", "wall_s"):
        if observed.get(key) is not None:
            usage[key] = round(max(float(observed[key]), 0.0), 3)
    return usage
