"""The run state machine: states, allowed transitions, identities and deadline arithmetic.

Pure: imports nothing from the API, database or workflow modules. The database
transition guard (migration ``20261007_230000_run_lifecycle``) mirrors ``TRANSITIONS``;
a test keeps the two in agreement. Implements R-STATE-1 (the table), R-CREATE-5
(workflow ids) and R-EXEC-8 (deadline arithmetic).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum

__all__ = [
    "DEFAULT_DEADLINE_S",
    "MAX_DEADLINE_S",
    "MIN_DEADLINE_S",
    "TERMINAL",
    "TRANSITIONS",
    "RunState",
    "deadline_at",
    "is_allowed",
    "remaining",
    "workflow_id",
]


class RunState(StrEnum):
    """Stored as lowercase VARCHAR with a CHECK (R-STATE-2)."""

    ACCEPTED = "accepted"
    QUEUED = "queued"
    RUNNING = "running"
    AWAITING_INPUT = "awaiting_input"
    AWAITING_APPROVAL = "awaiting_approval"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


S = RunState

TERMINAL: frozenset[RunState] = frozenset({S.COMPLETED, S.FAILED, S.EXPIRED, S.CANCELLED})

#: The spec's state table (section 2). ``running -> running`` is a checkpoint or an
#: ownership takeover by a retried attempt; ``queued -> queued`` records that a generation
#: queued by an approval was confirmed dispatched.
TRANSITIONS: frozenset[tuple[RunState, RunState]] = frozenset(
    {
        (S.ACCEPTED, S.QUEUED),
        (S.ACCEPTED, S.CANCELLED),
        (S.ACCEPTED, S.EXPIRED),
        (S.ACCEPTED, S.FAILED),
        (S.QUEUED, S.QUEUED),
        (S.QUEUED, S.RUNNING),
        (S.QUEUED, S.CANCELLED),
        (S.QUEUED, S.EXPIRED),
        (S.QUEUED, S.FAILED),
        (S.RUNNING, S.RUNNING),
        (S.RUNNING, S.AWAITING_INPUT),
        (S.RUNNING, S.AWAITING_APPROVAL),
        (S.RUNNING, S.COMPLETED),
        (S.RUNNING, S.FAILED),
        (S.RUNNING, S.CANCELLED),
        (S.RUNNING, S.EXPIRED),
        (S.AWAITING_INPUT, S.ACCEPTED),
        (S.AWAITING_INPUT, S.CANCELLED),
        (S.AWAITING_INPUT, S.EXPIRED),
        (S.AWAITING_APPROVAL, S.RUNNING),
        (S.AWAITING_APPROVAL, S.QUEUED),
        (S.AWAITING_APPROVAL, S.CANCELLED),
        (S.AWAITING_APPROVAL, S.EXPIRED),
    }
)

DEFAULT_DEADLINE_S = 3600
MIN_DEADLINE_S = 1
MAX_DEADLINE_S = 86400


def is_allowed(old: RunState, new: RunState) -> bool:
    """True when the guard accepts ``old -> new``; every change to a terminal row is refused."""
    return old not in TERMINAL and (old, new) in TRANSITIONS


def workflow_id(run_id: str, generation: int) -> str:
    """Dispatch identity of one generation: ``agent-run-{run_id}-g{generation}`` (R-CREATE-5)."""
    if generation < 1:
        raise ValueError(f"generation must be >= 1, got {generation}")
    return f"agent-run-{run_id}-g{generation}"


def deadline_at(accepted_at: datetime, deadline_s: int) -> datetime:
    """``accepted_at + deadline_s`` seconds; raises ValueError outside 1..86400 (R-EXEC-8)."""
    if not MIN_DEADLINE_S <= deadline_s <= MAX_DEADLINE_S:
        raise ValueError(f"deadline_seconds must be in {MIN_DEADLINE_S}..{MAX_DEADLINE_S}")
    return accepted_at + timedelta(seconds=deadline_s)


def remaining(deadline: datetime, now: datetime) -> timedelta:
    """Time left before ``deadline``, never negative (Temporal timeouts derive from it)."""
    return max(deadline - now, timedelta(0))
