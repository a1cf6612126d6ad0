"""The stream client helper (R-EVENT-2, R-EVENT-3, R-EVENT-5): reconnects with
Last-Event-ID to another base URL, delivers every event once and in order, and reads the
run record when a stream ends without its terminal event."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from qimpl.client.stream import FollowResult, StreamError, follow_run, parse_sse

RUN = "00000000-0000-0000-0000-000000000001"


def sse(seq: int, kind: str, state: str = "running") -> bytes:
    return f"id: {seq}\nevent: {kind}\ndata: {json.dumps({'state': state})}\n\n".encode()


class Dropping(httpx.SyncByteStream):
    """A body that sends ``chunks`` and then, if ``drop``, fails like a killed server."""

    def __init__(self, chunks: list[bytes], *, drop: bool) -> None:
        self.chunks, self.drop = chunks, drop

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks
        if self.drop:
            raise httpx.ReadError("connection reset by peer")


def test_parse_sse_skips_comments_and_joins_data_lines() -> None:
    lines = [": ping", "id: 3", "event: output", "data: {\"a\":", "data: 1}", "", ": ping", ""]
    events = list(parse_sse(lines))
    assert [(e.id, e.event, e.data) for e in events] == [(3, "output", {"a": 1})]


@pytest.mark.req("R-EVENT-2")
@pytest.mark.req("R-EVENT-3")
def test_reconnects_to_another_api_with_last_event_id_and_delivers_each_event_once() -> None:
    seen: list[tuple[str, str | None]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        last = request.headers.get("last-event-id")
        seen.append((request.url.host, last))
        if request.url.host == "x":  # X dies after two events (and a repeat of the first)
            return httpx.Response(200, stream=Dropping([sse(1, "state"), sse(2, "state"), sse(1, "state")],
                                                       drop=True))
        after = int(last or 0)
        body = [sse(i, "checkpoint") for i in range(after + 1, 5)] + [sse(5, "terminal", "completed")]
        return httpx.Response(200, stream=Dropping(body, drop=False))

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        result = follow_run(["http://x", "http://y"], "a", RUN, stream_key="k", client=client,
                            backoff_s=(0.0, 0.0))
    assert [e.id for e in result.events] == [1, 2, 3, 4, 5]
    assert result.resent == [1], "the repeat is skipped, and said"
    assert result.ended == "terminal" and result.terminal is not None
    assert result.terminal.data["state"] == "completed"
    assert seen == [("x", None), ("y", "2")]


@pytest.mark.req("R-EVENT-3")
def test_a_stream_that_never_ends_in_a_terminal_event_reads_the_run() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            return httpx.Response(200, stream=Dropping([sse(1, "state")], drop=True))
        assert request.headers["authorization"] == "Bearer key"
        return httpx.Response(200, json={"run_id": RUN, "state": "running"})

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        result = follow_run(["http://x"], "a", RUN, stream_key="k", api_key="key", client=client,
                            max_reconnects=2, backoff_s=(0.0, 0.0))
    assert result.ended == "gave_up" and result.terminal is None
    assert [e.id for e in result.events] == [1] and len(result.connections) == 3
    assert result.run == {"run_id": RUN, "state": "running"}


@pytest.mark.req("R-EVENT-5")
def test_a_pruned_stream_reads_the_run_and_a_refusal_raises() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "gone" and request.url.path.endswith("/events"):
            return httpx.Response(410, json={"code": "event_stream_pruned", "message": "pruned"})
        if request.url.path.endswith("/events"):
            return httpx.Response(404, json={"code": "run_not_found", "message": "no such run"})
        return httpx.Response(200, json={"state": "completed"})

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        pruned = follow_run(["http://gone"], "a", RUN, stream_key="k", api_key="key", client=client)
        assert pruned.ended == "pruned" and pruned.run == {"state": "completed"}
        with pytest.raises(StreamError) as refused:
            follow_run(["http://x"], "a", RUN, stream_key="k", client=client)
    assert refused.value.code == "run_not_found" and refused.value.status == 404


def test_204_means_the_terminal_event_was_already_seen() -> None:
    with httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(204))) as client:
        result = follow_run(["http://x"], "a", RUN, stream_key="k", last_event_id=9, client=client)
    assert result.ended == "done" and result.events == []


@pytest.mark.req("R-EVENT-2")
@pytest.mark.req("R-EVENT-3")
def test_a_passing_refusal_is_followed_elsewhere_not_raised() -> None:
    """A tester's finding: an instance whose database was down answers 503
    ``database_unavailable`` (retryable, ``Retry-After: 1``), a load balancer answers 502 for
    an instance that died, an instance at its per-run stream bound 429 ``too_many_streams``:
    follow_run raised StreamError at the first, though the next base URL (or the same one
    a moment later) serves the stream. It reconnects instead, as after a dropped connection."""
    for status, code in ((503, "database_unavailable"), (502, None), (429, "too_many_streams")):
        tried: list[str] = []

        def handler(request: httpx.Request, status: int = status, code: str | None = code,
                    tried: list[str] = tried) -> httpx.Response:
            tried.append(request.url.host)
            if request.url.host == "sick":
                return (httpx.Response(status, json={"code": code, "message": "later"}, headers={"Retry-After": "1"})
                        if code else httpx.Response(status, text="Bad Gateway"))
            body = [sse(1, "state"), sse(2, "terminal", "completed")]
            return httpx.Response(200, stream=Dropping(body, drop=False))

        with httpx.Client(transport=httpx.MockTransport(handler)) as client:
            result = follow_run(["http://sick", "http://well"], "a", RUN, stream_key="k", client=client,
                                backoff_s=(0.0, 0.0))
        assert result.ended == "terminal" and [e.id for e in result.events] == [1, 2], status
        assert tried == ["sick", "well"], status

    def always_busy(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            return httpx.Response(503, json={"code": "database_unavailable", "message": "later"})
        return httpx.Response(200, json={"state": "running"})

    with httpx.Client(transport=httpx.MockTransport(always_busy)) as client:
        gave_up = follow_run(["http://x"], "a", RUN, stream_key="k", api_key="key", client=client,
                             max_reconnects=2, backoff_s=(0.0, 0.0))
    assert gave_up.ended == "gave_up" and len(gave_up.connections) == 3 and gave_up.run == {"state": "running"}


@pytest.mark.parametrize("bases", ["http://api:8000", ["127.0.0.1:8000"], ["ftp://api"], ["http://"]])
def test_base_urls_that_cannot_be_followed_are_refused_at_once(bases: object) -> None:
    """A new user's finding: ``follow_run("http://api:8000", …)`` (one URL, not a list)
    tried ``h``, ``t``, ``t``, ``p``, … as base URLs and a URL without a scheme was
    retried like a dropped connection, each until the deadline (300 s by default), to end
    ``gave_up`` without an event. A mistake of the caller's is a ValueError at once, no
    request made."""
    asked: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        return httpx.Response(204)

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(ValueError, match="base URL"):
            follow_run(bases, "a", RUN, stream_key="k", client=client, deadline_s=2,  # type: ignore[arg-type]
                       backoff_s=(0.0, 0.0))
    assert asked == []


class Pinging(httpx.SyncByteStream):
    """A live run's stream that only keeps the connection alive: one event, then pings."""

    def __iter__(self) -> Iterator[bytes]:
        import time

        yield sse(1, "state")
        for _ in range(600):  # a minute of keep-alives, no terminal event
            time.sleep(0.1)
            yield b": ping\n\n"


@pytest.mark.req("R-EVENT-3")
def test_the_deadline_bounds_a_stream_that_stays_open() -> None:
    """A new user's finding: ``follow_run(…, deadline_s=3)`` on a run parked for input
    (its stream open, kept alive by pings) was still following 20 s later, until the run
    was cancelled: the deadline was checked only between reconnections. It bounds the
    whole follow: the helper stops, says ``gave_up`` and reads the run."""
    import threading
    import time

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            return httpx.Response(200, stream=Pinging())
        return httpx.Response(200, json={"run_id": RUN, "state": "awaiting_input"})

    got: dict[str, object] = {}

    def follow() -> None:
        with httpx.Client(transport=httpx.MockTransport(handler)) as client:
            got["result"] = follow_run(["http://x"], "a", RUN, stream_key="k", api_key="key", client=client,
                                       deadline_s=1.0, backoff_s=(0.0, 0.0))

    started = time.monotonic()
    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    thread.join(15)
    assert not thread.is_alive(), "still following a minute-long stream past its 1 s deadline"
    result = got["result"]
    assert isinstance(result, FollowResult)
    assert result.ended == "gave_up" and [e.id for e in result.events] == [1]
    assert result.run == {"run_id": RUN, "state": "awaiting_input"}
    assert time.monotonic() - started < 5
