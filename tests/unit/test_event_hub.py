"""The API's event hub without a database (R-EVENT-2, R-EVENT-4): payloads name a run,
a wake reaches only that run's streams, and a stream that goes away leaves nothing behind."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from qimpl.api.event_hub import EventHub, parse_payload

RUN = "5f0c6a4e-0000-4000-8000-000000000001"


def test_payloads_are_run_and_seq() -> None:
    assert parse_payload(f"{RUN}:12") == RUN
    assert parse_payload(RUN) is None and parse_payload(f"{RUN}:x") is None and parse_payload(":3") is None


@pytest.mark.req("R-EVENT-2")
@pytest.mark.req("R-EVENT-4")
def test_a_wake_reaches_the_runs_streams_and_a_closed_stream_frees_its_subscription() -> None:
    async def scenario() -> None:
        hub = EventHub("postgresql://unused")
        with hub.subscribe(RUN) as a, hub.subscribe(RUN) as b, hub.subscribe("other") as c:
            assert hub.open_streams == 3
            hub.wake(RUN)
            assert a.is_set() and b.is_set() and not c.is_set()
            a.clear(), b.clear()
            hub.wake()  # a resubscribe: every stream reads again
            assert a.is_set() and b.is_set() and c.is_set()
        assert hub.open_streams == 0 and not hub._waiters  # nothing kept for a gone client

    asyncio.run(scenario())


class _Journal:
    """A fake tenant connection whose journal holds ``rows`` (``seq``, ``kind``, ``data``)."""

    def __init__(self, rows: list[dict[str, object]]) -> None:
        self.rows, self.reads = rows, 0

    def __call__(self) -> _Journal:
        return self

    async def __aenter__(self) -> _Journal:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def cursor(self, **_: object) -> _Journal:
        return self

    async def execute(self, _sql: str, params: tuple[str, int, int]) -> None:
        self.after = params[1]
        self.reads += 1

    async def fetchall(self) -> list[dict[str, object]]:
        return [r for r in self.rows if int(str(r["seq"])) > self.after]


@pytest.mark.req("R-EVENT-2")
@pytest.mark.req("R-EVENT-4")
def test_a_stream_reads_when_woken_and_a_dead_client_frees_its_subscription() -> None:
    from qimpl.api.events import stream_events

    async def scenario() -> None:
        hub = EventHub("postgresql://unused")
        journal = _Journal([{"seq": 1, "kind": "state", "data": {"state": "queued"}}])
        got: list[str] = []

        async def client() -> None:
            async for event in stream_events(journal, hub, RUN, 0, fallback_s=600):
                got.append(event["id"])

        task = asyncio.create_task(client())
        while len(got) < 1:
            await asyncio.sleep(0.01)
        assert hub.open_streams == 1 and journal.reads == 1  # waiting: no further read
        journal.rows.append({"seq": 2, "kind": "checkpoint", "data": {}})
        hub.wake(RUN)
        while len(got) < 2:
            await asyncio.sleep(0.01)
        assert got == ["1", "2"] and journal.reads == 2
        task.cancel()  # what the server does when the client disconnects
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert hub.open_streams == 0

    asyncio.run(scenario())
