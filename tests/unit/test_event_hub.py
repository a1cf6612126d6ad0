"""The API's event hub without a database (R-EVENT-2, R-EVENT-4): payloads name a run,
a wake reaches only that run's streams, and a stream that goes away leaves nothing behind."""

from __future__ import annotations

import asyncio

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
