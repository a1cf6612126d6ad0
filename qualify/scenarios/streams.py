"""A scenario's client of the run's event stream (R-EVENT-1): one SSE connection read and
recorded in the history (``stream_open``, ``stream_event``), shared by the scenario
modules that read streams."""

from __future__ import annotations

import json
from typing import Any

from qimpl.client.stream import StreamEvent, parse_sse
from qualify import http
from qualify.processes import ManagedProcess
from qualify.scenarios.base import ScenarioContext

__all__ = ["NOTIFY_ONLY", "PATH", "read_stream", "record_stream_event"]

PATH = "/v1/agents/agent-1/runs/{run_id}/events"
#: No fallback read within a scenario: a stream learns of new events only from NOTIFY
#: (or the catch-up after its listener resubscribes).
NOTIFY_ONLY = {"QIMPL_EVENT_FALLBACK_POLL_S": "600"}


def read_stream(ctx: ScenarioContext, api: ManagedProcess, run_id: str, key: str, *,
                last_event_id: str | None = None, stop_after: int | None = None,
                client: str = "") -> list[dict[str, Any]]:
    """Read SSE events of one connection (recording each in the history) until the stream
    ends or ``stop_after`` events; returns them as ``{id, event, data}``, or a refusal as
    ``[{status, body}]``."""
    headers = {"X-Stream-Key": key, **({"Last-Event-ID": last_event_id} if last_event_id else {})}
    # Where this client's stream begins: a client that opens with Last-Event-ID L owes
    # only the events after L (the stream checker reads it).
    ctx.history.record("stream_open", run_id=run_id, client=client, process=api.name,
                       after=int(last_event_id) if last_event_id and last_event_id.isdigit() else 0)
    got: list[dict[str, Any]] = []
    with http.stream("GET", f"{api.base_url}{PATH.format(run_id=run_id)}", headers=headers,
                      timeout=60) as resp:
        if resp.status_code != 200:
            return [{"status": resp.status_code, "body": resp.read().decode()[:200]}]
        for event in parse_sse(resp.iter_lines()):
            record_stream_event(ctx, run_id, event, api.name, client)
            got.append({"id": str(event.id), "event": event.event, "data": json.dumps(event.data)})
            if stop_after is not None and len(got) >= stop_after:
                break
        else:
            # The server ended this stream (the client did not stop reading): the stream
            # checker then owes it the terminal event of a run that had ended by now.
            ctx.history.record("stream_end", run_id=run_id, client=client, process=api.name,
                               events=len(got))
    return got


def record_stream_event(ctx: ScenarioContext, run_id: str, event: StreamEvent, process: str, client: str) -> None:
    ctx.history.record("stream_event", run_id=run_id, event_id=event.id, event=event.event,
                       state=event.data.get("state"), process=process, client=client)
