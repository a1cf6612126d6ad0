"""Follow a run's event stream to its end (R-EVENT-2, R-EVENT-3), over httpx.

``follow_run`` reads ``GET …/runs/{run}/events`` and, when the connection drops (an API
instance died, a proxy cut it), reconnects with ``Last-Event-ID`` to the next of several
API base URLs, with backoff: every event arrives once, in order. It ends at the
``terminal`` event, or at 204 (the terminal event was already seen). A stream that ends
without a terminal event proves nothing about the run (R-EVENT-3): then — reconnections
exhausted, the deadline passed, or the stream pruned (410 ``event_stream_pruned``,
R-EVENT-5) — the helper reads the run record (with the API key, when given) and returns it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = ["FollowResult", "StreamError", "StreamEvent", "follow_run", "parse_sse", "read_events"]

EVENTS_PATH = "/v1/agents/{agent_id}/runs/{run_id}/events"
RUN_PATH = "/v1/agents/{agent_id}/runs/{run_id}"


class StreamError(Exception):
    """The API refused the stream (``code``: ``stream_key_required``, ``run_not_found``, …,
    or ``http_<status>`` when the body has no code): reconnecting will not help."""

    def __init__(self, status: int, code: str, message: str = "") -> None:
        super().__init__(f"{status} {code}: {message}".rstrip(": "))
        self.status = status
        self.code = code


@dataclass(frozen=True)
class StreamEvent:
    """One SSE event: ``id`` (the run's sequence number), ``event`` (kind), ``data`` (JSON)."""

    id: int
    event: str
    data: dict[str, Any]


@dataclass
class FollowResult:
    """What following a run gave: the events in order, the terminal one (None when the
    stream never delivered it), the run record when it had to be read (no terminal event,
    or a pruned stream), the base URLs connected to, why it stopped (``terminal``,
    ``done`` (204), ``pruned``, ``gave_up``), and the ids of events a server sent again
    after they were delivered (``resent``: skipped, never handed on twice, but a server
    that resends is broken, R-EVENT-2)."""

    events: list[StreamEvent] = field(default_factory=list)
    terminal: StreamEvent | None = None
    run: dict[str, Any] | None = None
    connections: list[str] = field(default_factory=list)
    ended: str = ""
    resent: list[int] = field(default_factory=list)


def parse_sse(lines: Iterable[str]) -> Iterator[StreamEvent]:
    """SSE lines (without line endings) as events (pure): ``id``, ``event`` and ``data``
    fields (several ``data`` lines joined with ``\\n``), comments (keep-alive pings) and
    events without an id skipped. Raises ``ValueError`` for data that is not JSON."""
    fields: dict[str, list[str]] = {}
    for line in lines:
        if not line:
            if "id" in fields and "data" in fields:
                yield StreamEvent(id=int(fields["id"][-1]), event=(fields.get("event") or ["message"])[-1],
                                  data=json.loads("\n".join(fields["data"])))
            fields = {}
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        fields.setdefault(name, []).append(value[1:] if value.startswith(" ") else value)


def _refusal(resp: httpx.Response) -> StreamError:
    try:
        body = json.loads(resp.read() or b"{}")
    except ValueError:
        body = {}
    return StreamError(resp.status_code, str(body.get("code") or f"http_{resp.status_code}"),
                       str(body.get("message", "")))


def _headers(stream_key: str, last_event_id: int | None) -> dict[str, str]:
    headers = {"X-Stream-Key": stream_key, "Accept": "text/event-stream"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    return headers


def read_events(client: httpx.Client, base_url: str, agent_id: str, run_id: str, *, stream_key: str,
                last_event_id: int | None = None) -> Iterator[StreamEvent]:
    """The events of one connection, as they arrive; returns quietly at 204 (nothing more)
    and when the server ends the stream. Raises ``StreamError`` when refused (a status
    other than 200 and 204), ``httpx.HTTPError`` when the connection fails or drops."""
    url = base_url.rstrip("/") + EVENTS_PATH.format(agent_id=agent_id, run_id=run_id)
    with client.stream("GET", url, headers=_headers(stream_key, last_event_id)) as resp:
        if resp.status_code == 204:
            return
        if resp.status_code != 200:
            raise _refusal(resp)
        yield from parse_sse(resp.iter_lines())


def follow_run(base_urls: Sequence[str], agent_id: str, run_id: str, *, stream_key: str,
               api_key: str | None = None, last_event_id: int | None = None,
               on_event: Callable[[StreamEvent, str], None] | None = None,
               max_reconnects: int = 20, backoff_s: tuple[float, float] = (0.1, 2.0),
               deadline_s: float = 300.0, client: httpx.Client | None = None) -> FollowResult:
    """Follow ``run_id``'s stream to its terminal event across ``base_urls`` (tried in
    turn, starting with the first, reconnecting with ``Last-Event-ID`` after a drop);
    ``on_event(event, base_url)`` sees each event as it arrives. ``deadline_s`` bounds the
    whole follow, an open stream included (then ``ended`` is ``gave_up`` and the run is
    read). The client's read timeout should exceed the API's keep-alive interval. A 5xx or 429 answer (a database outage's
    503, a proxy's 502 for a dead instance, ``too_many_streams``) is followed like a
    dropped connection. Raises ``StreamError`` when the API refuses the stream (404, 401:
    reconnecting will not help) and ``ValueError`` when ``base_urls`` is empty, a string
    rather than a list of them, or names one that is not an ``http(s)://host`` URL (a
    mistake of the caller's, not a dropped connection to retry until the deadline)."""
    if isinstance(base_urls, (str, bytes)):
        raise ValueError(f"follow_run takes a list of base URLs, not one string: [{base_urls!r}]")
    if not base_urls:
        raise ValueError("follow_run needs at least one base URL")
    for base in base_urls:
        try:
            parsed = httpx.URL(base)
        except (httpx.InvalidURL, TypeError):
            parsed = None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(f"not a base URL (http://host[:port]): {base!r}")
    own = client is None
    http = client or httpx.Client(timeout=httpx.Timeout(10.0, read=60.0))
    result = FollowResult()
    last = last_event_id
    delay = backoff_s[0]
    stop_at = time.monotonic() + deadline_s
    try:
        for attempt in range(max_reconnects + 1):
            base = base_urls[attempt % len(base_urls)]
            result.connections.append(base)
            url = base.rstrip("/") + EVENTS_PATH.format(agent_id=agent_id, run_id=run_id)
            try:
                with http.stream("GET", url, headers=_headers(stream_key, last),
                                 timeout=_bounded(http.timeout, stop_at)) as resp:
                    if resp.status_code == 204:  # the terminal event was already delivered
                        result.ended = "done"
                        return result
                    if resp.status_code != 200:
                        raise _refusal(resp)
                    for event in parse_sse(_until(resp.iter_lines(), stop_at)):
                        if last is not None and event.id <= last:
                            result.resent.append(event.id)
                            continue  # never twice, whatever a server sends
                        last = event.id
                        result.events.append(event)
                        if on_event is not None:
                            on_event(event, base)
                        if event.event == "terminal":
                            result.terminal, result.ended = event, "terminal"
                            return result
                        delay = backoff_s[0]  # progress: the next reconnect is quick again
            except StreamError as exc:
                if exc.code == "event_stream_pruned":
                    result.ended = "pruned"
                    break
                if not _passing(exc.status):
                    raise
                # 503 database_unavailable, a proxy's 502/504 for a dead instance, 429
                # too_many_streams: the next instance, or this one a moment later, may serve it
            except (httpx.HTTPError, ValueError):
                pass  # dropped or garbled: reconnect (elsewhere) after the last event seen
            if time.monotonic() + delay > stop_at:
                break
            time.sleep(delay)
            delay = min(delay * 2, backoff_s[1])
        result.ended = result.ended or "gave_up"
        if api_key is not None:
            result.run = _read_run(http, base_urls, agent_id, run_id, api_key)
        return result
    finally:
        if own:
            http.close()


def _bounded(timeout: httpx.Timeout, stop_at: float) -> httpx.Timeout:
    """``timeout`` with its read timeout cut to what is left until ``stop_at``: a stream
    that sends nothing more ends by the deadline."""
    left = max(stop_at - time.monotonic(), 0.001)
    read = left if timeout.read is None else min(timeout.read, left)
    return httpx.Timeout(connect=timeout.connect, read=read, write=timeout.write, pool=timeout.pool)


def _until(lines: Iterable[str], stop_at: float) -> Iterator[str]:
    """``lines`` until ``stop_at`` (monotonic): a stream kept open by keep-alive pings
    ends at the deadline as if the server had ended it."""
    for line in lines:
        if time.monotonic() > stop_at:
            return
        yield line


def _passing(status: int) -> bool:
    """Whether a refusal with this status may pass: a server error (a 503 with
    ``Retry-After``, a load balancer's 502 or 504) or 429, unlike a 401, 404 or 422."""
    return status >= 500 or status == 429


def _read_run(http: httpx.Client, base_urls: Sequence[str], agent_id: str, run_id: str,
              api_key: str) -> dict[str, Any] | None:
    """The run record from the first API that answers it (R-EVENT-3), None if none does."""
    for base in base_urls:
        try:
            resp = http.get(base.rstrip("/") + RUN_PATH.format(agent_id=agent_id, run_id=run_id),
                            headers={"Authorization": f"Bearer {api_key}"})
        except httpx.HTTPError:
            continue
        if resp.status_code == 200:
            record: dict[str, Any] = resp.json()
            return record
    return None
