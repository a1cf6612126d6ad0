"""Client helpers for the durable-runs API (``qimpl.client.stream``: follow a run's events)."""

from qimpl.client.stream import (
    FollowResult,
    StreamError,
    StreamEvent,
    follow_run,
    parse_sse,
    read_events,
)

__all__ = ["FollowResult", "StreamError", "StreamEvent", "follow_run", "parse_sse", "read_events"]
