"""Disposable stacks: PostgreSQL + Temporal, started and always torn down (R-Q-1).

``make_stack`` picks the kind: ``qualify.stack._embedded`` (the default: both servers
booted by the harness) or ``qualify.stack._others`` (an existing deployment, or
containers); neither module imports the other's stack.
"""

from __future__ import annotations

from typing import Any

from qualify.errors import HarnessError, UsageError
from qualify.stack._embedded import EmbeddedStack, StackInfo, open_stack
from qualify.stack.temporal import TUNED_DYNAMIC_CONFIG

__all__ = ["TIMER_MODES", "EmbeddedStack", "StackInfo", "make_stack", "open_stack"]

#: ``--temporal-timers``: ``tuned`` gives a stack's dev server ``TUNED_DYNAMIC_CONFIG``
#: (the scenarios marked ``default_timers`` still run on a server's defaults);
#: ``default`` runs every scenario on the defaults, as users' servers are.
TIMER_MODES = ("tuned", "default")


def make_stack(kind: str = "embedded", *, pg_dsn: str = "", temporal_address: str = "",
               timers: str = "default") -> Any:
    """The stack of ``kind``: embedded, system, existing or testcontainers. ``timers``
    (``TIMER_MODES``) applies to the stacks the harness boots (embedded, system)."""
    if timers not in TIMER_MODES:
        raise HarnessError(f"unknown temporal timers {timers!r}: {', '.join(TIMER_MODES)}")
    if kind in ("embedded", "system"):
        return EmbeddedStack(kind=kind, temporal_config=TUNED_DYNAMIC_CONFIG if timers == "tuned" else None)
    from qualify.stack._others import ExistingStack, TestcontainersStack

    if kind == "existing":
        return ExistingStack(pg_dsn=pg_dsn, temporal_address=temporal_address)
    if kind == "testcontainers":
        return TestcontainersStack()
    raise UsageError(f"unknown stack {kind!r}: embedded, system, existing or testcontainers")
