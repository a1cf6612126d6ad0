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


class _Flaky(_Journal):
    """A journal whose first ``failures`` reads fail as ``exc`` does (before any statement)."""

    def __init__(self, rows: list[dict[str, object]], failures: int, exc: Exception) -> None:
        super().__init__(rows)
        self.failures, self.exc, self.attempts = failures, exc, 0
        self.in_flight = self.most_in_flight = 0

    async def __aenter__(self) -> _Journal:
        self.attempts += 1
        if self.attempts <= self.failures:
            raise self.exc
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.005)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.in_flight -= 1

    def cursor(self, **_: object) -> _Journal:
        return _Journal.__new__(_Cursor).bind(self)


class _Cursor(_Journal):
    """The cursor of a ``_Flaky`` journal: its statements, none of its connection's failures."""

    def bind(self, journal: _Journal) -> _Cursor:
        self.journal = journal
        return self

    async def __aenter__(self) -> _Journal:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def execute(self, sql: str, params: tuple[str, int, int]) -> None:
        await self.journal.execute(sql, params)

    async def fetchall(self) -> list[dict[str, object]]:
        return await self.journal.fetchall()


@pytest.mark.req("R-EVENT-3")
@pytest.mark.parametrize("exc", [pytest.param("pool", id="PoolTimeout"), pytest.param("lost", id="OperationalError")])
def test_a_read_the_database_could_not_serve_is_read_again_and_the_stream_ends_with_its_terminal_event(
        exc: str) -> None:
    """A pool timeout under a burst of woken streams (measured: 23 of 200 streams aborted
    mid-response with 'response already started', two-hundred-open-streams) or a lost
    session is no reason to abort a stream whose response has started."""
    import psycopg
    from psycopg_pool import PoolTimeout

    from qimpl.api.events import stream_events

    error = PoolTimeout("couldn't get a connection after 5.00 sec") if exc == "pool" else psycopg.OperationalError("lost")
    rows: list[dict[str, object]] = [{"seq": 1, "kind": "state", "data": {"state": "running"}},
                                     {"seq": 2, "kind": "terminal", "data": {"state": "completed"}}]

    async def scenario() -> list[str]:
        journal = _Flaky(rows, failures=3, exc=error)
        got = [e["event"] async for e in stream_events(journal, EventHub("postgresql://unused"), RUN, 0,
                                                       fallback_s=0.05)]
        assert journal.attempts == 4
        return got

    assert asyncio.run(scenario()) == ["state", "terminal"]


@pytest.mark.req("R-EVENT-3")
def test_reads_failing_for_retry_s_end_the_stream_without_a_terminal_event() -> None:
    from psycopg_pool import PoolTimeout

    from qimpl.api.events import stream_events

    async def scenario() -> tuple[list[str], int]:
        journal = _Flaky([{"seq": 1, "kind": "terminal", "data": {}}], failures=10**6, exc=PoolTimeout("busy"))
        got = [e["event"] async for e in stream_events(journal, EventHub("postgresql://unused"), RUN, 0,
                                                       fallback_s=0.02, retry_s=0.2)]
        return got, journal.attempts

    got, attempts = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert got == [] and attempts >= 3  # ended, not raised, not hung


@pytest.mark.req("R-EVENT-2")
def test_streams_read_at_most_the_reads_permits_at_once() -> None:
    from qimpl.api.events import stream_events

    async def scenario() -> tuple[int, list[list[str]]]:
        journal = _Flaky([{"seq": 1, "kind": "terminal", "data": {}}], failures=0, exc=RuntimeError())
        reads = asyncio.Semaphore(2)

        async def one() -> list[str]:
            return [e["event"] async for e in stream_events(journal, EventHub("postgresql://unused"), RUN, 0,
                                                            reads=reads)]

        got = await asyncio.gather(*(one() for _ in range(12)))
        return journal.most_in_flight, got

    most, got = asyncio.run(scenario())
    assert most == 2 and got == [["terminal"]] * 12


@pytest.mark.req("R-EVENT-4")
def test_a_stream_lets_the_loop_run_between_two_events_of_a_page() -> None:
    """A client that reset its connection is seen gone (uvicorn's connection_lost, run by
    the loop) before the rest of a page is written to its dead socket: measured with 120
    clients resuming with Last-Event-ID, 37,284 asyncio warnings 'socket.send() raised
    exception.' in the API's log without this, none with it."""
    from qimpl.api.events import stream_events

    async def scenario() -> list[bool]:
        rows: list[dict[str, object]] = [{"seq": i, "kind": "checkpoint", "data": {}} for i in range(1, 4)]
        rows.append({"seq": 4, "kind": "terminal", "data": {}})
        journal = _Journal(rows)
        ran: list[bool] = []
        flag = asyncio.Event()
        async for _ in stream_events(journal, EventHub("postgresql://unused"), RUN, 0):
            ran.append(flag.is_set())
            flag.clear()
            asyncio.get_running_loop().call_soon(flag.set)  # what connection_lost is
        return ran

    assert asyncio.run(scenario()) == [False, True, True, True]


class _SlowRead(_Journal):
    """A journal whose read waits for ``go``; records how each connection was given back."""

    def __init__(self, rows: list[dict[str, object]]) -> None:
        super().__init__(rows)
        self.reading, self.go, self.returned = asyncio.Event(), asyncio.Event(), []

    async def __aexit__(self, *exc: object) -> None:
        self.returned.append(type(exc[1]).__name__ if exc[1] is not None else "whole")

    async def execute(self, sql: str, params: tuple[str, int, int]) -> None:
        self.reading.set()
        await self.go.wait()
        await super().execute(sql, params)


@pytest.mark.req("R-EVENT-4")
def test_a_client_gone_during_a_read_leaves_the_read_to_finish_and_its_connection_whole() -> None:
    """A tester's clients that dropped mid-read each cost the API pool a connection: the
    cancelled query's own cancellation was interrupted and the pool closed it. The stream
    now ends at once, and its read finishes behind it and gives the connection back whole."""
    from qimpl.api.events import stream_events

    async def scenario() -> list[str]:
        journal = _SlowRead([{"seq": 1, "kind": "state", "data": {"state": "queued"}}])

        async def client() -> None:
            async for _ in stream_events(journal, EventHub("postgresql://unused"), RUN, 0, fallback_s=600):
                pass

        task = asyncio.create_task(client())
        await asyncio.wait_for(journal.reading.wait(), 5)
        task.cancel()  # the client went away during the read
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)
        assert task.cancelled()
        journal.go.set()
        for _ in range(100):
            if len(journal.returned) == 2:
                break
            await asyncio.sleep(0.01)
        return journal.returned

    assert asyncio.run(scenario()) == ["whole", "whole"]  # the cursor, then the connection


class _PagedJournal(_Journal):
    """A ``_Journal`` that answers at most the page size the read asks for."""

    async def execute(self, _sql: str, params: tuple[str, int, int]) -> None:
        await super().execute(_sql, params)
        self.limit = params[2]

    async def fetchall(self) -> list[dict[str, object]]:
        return (await super().fetchall())[: self.limit]


@pytest.mark.req("R-EVENT-2", "R-EVENT-3")
def test_a_journal_longer_than_a_page_streams_every_event_once_without_waiting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages of 3 over 10 events: each event once, in order, and each full page followed
    by the next read at once (no wake comes: the fallback is 600 s)."""
    from qimpl.api import events

    monkeypatch.setattr(events, "PAGE", 3)
    rows: list[dict[str, object]] = [{"seq": i, "kind": "checkpoint", "data": {"state": "running"}}
                                     for i in range(1, 10)]
    rows.append({"seq": 10, "kind": "terminal", "data": {"state": "completed"}})
    journal = _PagedJournal(rows)

    async def scenario() -> list[str]:
        async def read() -> list[str]:
            return [e["id"] async for e in events.stream_events(journal, EventHub("postgresql://unused"), RUN, 2,
                                                                 fallback_s=600)]
        return await asyncio.wait_for(read(), timeout=10)

    assert asyncio.run(scenario()) == [str(i) for i in range(3, 11)]
    assert journal.reads == 3, "after 2: pages 3-5, 6-8, 9-10"
