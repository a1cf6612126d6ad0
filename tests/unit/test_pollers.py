"""Worker availability tells the truth (R-OPS-6): ``qimpl_task_queue_pollers`` counts
only pollers Temporal heard from recently, judged against a clock passed in. Temporal
lists a poller for five minutes after its worker went away; an idle live poller refreshes
its ``last_access_time`` only once per long poll (about a minute), which is why workers
also report heartbeats (measured against the dev server: tests/integration/test_pollers.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from prometheus_client import REGISTRY, generate_latest
from temporalio.api.enums.v1 import TaskQueueType, WorkerStatus
from temporalio.api.taskqueue.v1 import PollerInfo
from temporalio.api.worker.v1 import WorkerHeartbeat, WorkerInfo
from temporalio.api.workflowservice.v1 import (
    DescribeTaskQueueResponse,
    ListWorkersResponse,
)
from temporalio.service import RPCError, RPCStatusCode

from qimpl.metrics import (
    LIVE_WINDOW_S,
    LONG_POLL_S,
    WORKER_HEARTBEAT_INTERVAL_S,
    latest_heartbeats,
    live_poller_counts,
    live_pollers,
    refresh_pollers,
    scrape,
)

NOW = 1_800_000_000.0  # Unix seconds
QUEUE = "agent-runs"
RUNNING = WorkerStatus.WORKER_STATUS_RUNNING
SHUTTING_DOWN = WorkerStatus.WORKER_STATUS_SHUTTING_DOWN


def _ts(unix_s: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(unix_s * 1e9))
    return ts


def poller(identity: str, polled_ago_s: float | None) -> PollerInfo:
    """A DescribeTaskQueue poller whose last poll started ``polled_ago_s`` before NOW."""
    if polled_ago_s is None:
        return PollerInfo(identity=identity)  # last_access_time unset
    return PollerInfo(identity=identity, last_access_time=_ts(NOW - polled_ago_s))


def beat(identity: str, ago_s: float, status: int = RUNNING, queue: str = QUEUE) -> WorkerHeartbeat:
    return WorkerHeartbeat(worker_identity=identity, task_queue=queue, status=status,  # type: ignore[arg-type]
                           heartbeat_time=_ts(NOW - ago_s))


@pytest.mark.req("R-OPS-6")
def test_only_pollers_seen_within_the_window_count() -> None:
    """Without heartbeats and with no allowance for idle polls: the last poll alone."""
    pollers = [poller("a", 0), poller("b", 9.9), poller("c", 10.0), poller("d", 10.1),
               poller("e", 300), poller("f", None), poller("g", -2)]  # g: Temporal's clock ahead
    assert live_pollers(pollers, NOW, 10.0, idle_poll_s=0) == 4  # a, b, c, g
    assert live_pollers([], NOW, 10.0) == 0
    assert live_pollers([poller("e", 300)], NOW + 0, 10.0) == 0  # the five-minute ghost


@pytest.mark.req("R-OPS-6")
def test_a_poller_without_heartbeats_is_allowed_one_long_poll() -> None:
    """An idle live poller re-polls once per long-poll expiry: without heartbeats its
    last poll may be that old, so it counts for LONG_POLL_S + window, not less."""
    assert live_pollers([poller("a", LONG_POLL_S + 5)], NOW, LIVE_WINDOW_S) == 1
    assert live_pollers([poller("a", LONG_POLL_S + LIVE_WINDOW_S + 1)], NOW, LIVE_WINDOW_S) == 0


@pytest.mark.req("R-OPS-6")
def test_heartbeats_decide_for_workers_that_send_them() -> None:
    idle = poller("w", 55)  # idle: its last poll began 55 s ago, the next begins at ~60 s
    assert live_pollers([idle], NOW, LIVE_WINDOW_S, {"w": beat("w", 2)}) == 1  # alive, idle
    assert live_pollers([idle], NOW, LIVE_WINDOW_S, {"w": beat("w", 11)}) == 0  # killed/frozen
    fresh = poller("w", 1)
    # a frozen worker: Temporal refreshed its poll's time, its heartbeats stopped
    assert live_pollers([fresh], NOW, LIVE_WINDOW_S, {"w": beat("w", 11)}) == 0
    assert live_pollers([fresh], NOW, LIVE_WINDOW_S, {"w": beat("w", 0, SHUTTING_DOWN)}) == 0
    # another worker's heartbeat says nothing about this poller
    assert live_pollers([idle], NOW, LIVE_WINDOW_S, {"x": beat("x", 0)}) == 1
    assert WORKER_HEARTBEAT_INTERVAL_S * 2 < LIVE_WINDOW_S  # one late heartbeat is tolerated


@pytest.mark.req("R-OPS-6")
def test_latest_heartbeat_per_identity_on_the_queue() -> None:
    beats = [beat("w", 1, RUNNING), beat("w", 30, SHUTTING_DOWN),  # restarted, same identity
             beat("v", 0, RUNNING, queue="other"), WorkerHeartbeat(task_queue=QUEUE)]
    latest = latest_heartbeats(beats, QUEUE)
    assert set(latest) == {"w"} and latest["w"].status == RUNNING
    assert latest_heartbeats(reversed(beats), QUEUE)["w"].status == RUNNING


@pytest.mark.req("R-OPS-6")
@pytest.mark.parametrize("how", ["shutdown", "killed"])
def test_falls_to_zero_within_the_window_of_the_last_worker_stopping(how: str) -> None:
    """Two workers, idle (last polls 50 s and 3 s before the stop), heartbeating every
    WORKER_HEARTBEAT_INTERVAL_S; both stop at NOW. Sampled with the clock passed in, the
    count is 2 before, and 0 no later than LIVE_WINDOW_S after."""
    pollers = [poller("w1", 50), poller("w2", 3)]
    last = NOW - WORKER_HEARTBEAT_INTERVAL_S / 2
    status = SHUTTING_DOWN if how == "shutdown" else RUNNING
    stopped = {w: WorkerHeartbeat(worker_identity=w, task_queue=QUEUE, status=status,  # type: ignore[arg-type]
                                  heartbeat_time=_ts(NOW if how == "shutdown" else last))
               for w in ("w1", "w2")}
    running = {w: beat(w, WORKER_HEARTBEAT_INTERVAL_S / 2) for w in ("w1", "w2")}
    assert live_pollers(pollers, NOW - 0.1, LIVE_WINDOW_S, running) == 2
    samples = [(t / 10, live_pollers(pollers, NOW + t / 10, LIVE_WINDOW_S, stopped))
               for t in range(0, 10 * int(LIVE_WINDOW_S + 60))]
    first_zero = next(t for t, n in samples if n == 0)
    assert first_zero <= LIVE_WINDOW_S, samples[: int(LIVE_WINDOW_S * 10) + 2]
    assert all(n == 0 for t, n in samples if t >= first_zero)  # and stays 0


class FakeTemporal:
    """The two calls ``live_poller_counts`` makes, answered from fixed records."""

    def __init__(self, pollers: dict[Any, list[PollerInfo]], beats: list[WorkerHeartbeat] | None) -> None:
        self.pollers, self.beats = pollers, beats
        self.queries: list[str] = []

    async def describe_task_queue(self, req: Any) -> DescribeTaskQueueResponse:
        assert req.task_queue.name == QUEUE
        return DescribeTaskQueueResponse(pollers=self.pollers[req.task_queue_type])

    async def list_workers(self, req: Any) -> ListWorkersResponse:
        self.queries.append(req.query)
        if self.beats is None:
            raise RPCError("ListWorkers is disabled", RPCStatusCode.UNIMPLEMENTED, b"")
        return ListWorkersResponse(workers_info=[WorkerInfo(worker_heartbeat=b) for b in self.beats])


class FakeClient:
    def __init__(self, service: FakeTemporal) -> None:
        self.workflow_service = service


@pytest.mark.req("R-OPS-6")
def test_counts_by_kind_and_the_gauge() -> None:
    wf, act = TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY
    pollers = {wf: [poller("live", 40), poller("dead", 40)], act: [poller("live", 40)]}
    service = FakeTemporal(pollers, [beat("live", 1), beat("dead", 20)])
    counts = asyncio.run(live_poller_counts(FakeClient(service), "default", QUEUE, clock=lambda: NOW))
    assert counts == {"workflow": 1, "activity": 1}
    assert service.queries == [f"TaskQueue = '{QUEUE}'"]
    # a server without ListWorkers: judged by the last poll, one long poll allowed
    counts = asyncio.run(live_poller_counts(FakeClient(FakeTemporal(pollers, None)), "default",
                                            QUEUE, clock=lambda: NOW))
    assert counts == {"workflow": 2, "activity": 1}

    class Cfg:
        temporal_namespace, task_queue = "default", QUEUE

    # refresh_pollers reads the real clock: a poller last seen 200 s ago is gone
    gone = PollerInfo(identity="gone", last_access_time=_ts(time.time() - 200))
    asyncio.run(refresh_pollers(FakeClient(FakeTemporal({wf: [gone], act: []}, [])), Cfg()))
    scraped = scrape([], pollers=True).decode()
    for kind in ("workflow", "activity"):
        assert f'qimpl_task_queue_pollers{{kind="{kind}",task_queue="{QUEUE}"}} 0.0' in scraped, kind
    assert "qimpl_task_queue_pollers" not in scrape([], pollers=False).decode()


def test_the_worker_s_metrics_port_has_no_empty_pollers_family() -> None:
    """The gauge is the API's (its /metrics asks Temporal per scrape); the worker's port
    serves the default registry, where a family with no samples would only mislead."""
    assert REGISTRY.get_sample_value("qimpl_lease_sessions_unavailable_total") is not None
    assert "qimpl_task_queue_pollers" not in generate_latest(REGISTRY).decode()
