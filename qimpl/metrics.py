"""Prometheus metrics for operators (R-OPS-6, R-OPS-7), shared by the API and the worker.

Counters are process-local; the gauges that describe the runs table are computed from
the database when scraped, for the scraping operator's tenant only (``tenant_run_stats``
under row-level security, rendered by ``run_families`` into a registry of that scrape:
no process-global gauge ever holds another tenant's labels), so every instance reports
the same.
Worker availability (``qimpl_task_queue_pollers``) is computed per scrape from Temporal's
view of the task queue (``refresh_pollers``), counting only workers heard from recently.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from temporalio.api.enums.v1 import WorkerStatus
from temporalio.api.taskqueue.v1 import PollerInfo
from temporalio.api.worker.v1 import WorkerHeartbeat

__all__ = [
    "DEADLINE_EXPIRIES",
    "DISPATCH_CONFIRMED",
    "LIVE_WINDOW_S",
    "LONG_POLL_S",
    "RECONCILE_WARNINGS",
    "RUN_STATS_SQL",
    "WORKER_HEARTBEAT_INTERVAL_S",
    "WORKER_POLLERS",
    "latest_heartbeats",
    "live_poller_counts",
    "live_pollers",
    "refresh_pollers",
    "run_families",
    "scrape",
    "tenant_run_stats",
]

#: A worker counts as available while Temporal heard from it at most this many seconds
#: ago (R-OPS-6): ``qimpl_task_queue_pollers`` falls to 0 at most this long after the last
#: worker stopped, was killed or froze.
LIVE_WINDOW_S = 10.0
#: How often every worker process reports itself to Temporal (a WorkerHeartbeat, set on
#: the process's runtime in ``qimpl.logs.temporal_runtime``), in seconds: well inside
#: LIVE_WINDOW_S, so that one late heartbeat does not read as a lost worker.
WORKER_HEARTBEAT_INTERVAL_S = 3.0
#: Temporal's long-poll expiry (``matching.longPollExpirationInterval``, default 60 s): an
#: idle poller starts a new poll, and so refreshes its ``last_access_time``, only this
#: often. A poller without heartbeats is therefore live for LONG_POLL_S + LIVE_WINDOW_S.
LONG_POLL_S = 60.0
#: Pages of ListWorkers read per scrape (100 workers each).
_MAX_WORKER_PAGES = 10
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9._:@/-]+$")

DEADLINE_EXPIRIES = Counter("qimpl_deadline_expiries_total", "Runs expired at their deadline",
                            ["tenant", "by"])
DISPATCH_CONFIRMED = Counter("qimpl_dispatch_confirmed_total",
                             "Accepted runs whose dispatch the reconciler confirmed", ["tenant"])
RECONCILE_WARNINGS = Counter("qimpl_reconcile_warnings_total",
                             "Reconciler problems (dispatch unknown, candidate errors)",
                             ["tenant", "kind"])
LEASE_SESSIONS_UNAVAILABLE = Counter(
    "qimpl_lease_sessions_unavailable_total",
    "Agent attempts that found no ready lease session within the lease (database refusing "
    "connections, or every session in use); retried, nothing written")
#: The API's alone (``scrape``): kept out of the default registry, which the worker's
#: metrics port serves, so the worker shows no empty family of it.
WORKER_POLLERS = Gauge("qimpl_task_queue_pollers",
                       "Pollers on the task queue whose worker Temporal heard from within "
                       f"{LIVE_WINDOW_S:g} s (worker availability)",
                       ["task_queue", "kind"], registry=None)


def _unix_s(ts: Timestamp) -> float | None:
    """A protobuf Timestamp as Unix time in seconds; None when unset."""
    if ts.seconds == 0 and ts.nanos == 0:
        return None
    return ts.seconds + ts.nanos / 1e9


def latest_heartbeats(heartbeats: Iterable[WorkerHeartbeat],
                      task_queue: str) -> dict[str, WorkerHeartbeat]:
    """The newest heartbeat of each worker identity on ``task_queue`` (a restarted worker
    can reuse its identity, e.g. as PID 1 in a container: its newest record wins)."""
    latest: dict[str, WorkerHeartbeat] = {}
    for hb in heartbeats:
        if hb.task_queue != task_queue or not hb.worker_identity:
            continue
        seen = latest.get(hb.worker_identity)
        if seen is None or (_unix_s(hb.heartbeat_time) or 0) >= (_unix_s(seen.heartbeat_time) or 0):
            latest[hb.worker_identity] = hb
    return latest


def live_pollers(pollers: Iterable[PollerInfo], now: float, window_s: float,
                 heartbeats: Mapping[str, WorkerHeartbeat] | None = None, *,
                 idle_poll_s: float = LONG_POLL_S) -> int:
    """How many of ``pollers`` (DescribeTaskQueue's) belong to a worker that is alive at
    ``now`` (Unix time, seconds): worker availability, R-OPS-6. Temporal keeps listing a
    poller for minutes after its worker went away, so each counts only while Temporal
    heard from it recently:

    - its worker reports heartbeats (``heartbeats[identity]``, see ``latest_heartbeats``)
      and the last one, at most ``window_s`` seconds old, says it is running. The
      heartbeat alone decides: Temporal refreshes the poll time of a frozen worker's
      outstanding poll (a SIGSTOPped worker read "LastAccessTime 2 seconds ago" 15 s and
      48 s after the stop), so a recent poll proves nothing about a worker that stopped
      heartbeating; or
    - its worker reports none, and its last poll (``last_access_time``) started at most
      ``idle_poll_s + window_s`` seconds ago: an idle live poller re-polls only once per
      long-poll expiry (``idle_poll_s``), so a tighter bound would report live idle
      workers as missing.

    A poller whose worker's last heartbeat says it is shutting down never counts. Clocks
    are compared as they are: skew between this host and the workers or Temporal adds to
    the window."""
    heartbeats = heartbeats or {}
    live = 0
    for poller in pollers:
        polled = _unix_s(poller.last_access_time)
        hb = heartbeats.get(poller.identity)
        if hb is None:
            alive = polled is not None and now - polled <= idle_poll_s + window_s
        elif hb.status != WorkerStatus.WORKER_STATUS_RUNNING:
            alive = False
        else:
            beat = _unix_s(hb.heartbeat_time)
            alive = beat is not None and now - beat <= window_s
        live += int(alive)
    return live


async def _worker_heartbeats(client: Any, namespace: str, task_queue: str) -> dict[str, WorkerHeartbeat]:
    """The latest heartbeat of every worker on ``task_queue`` (ListWorkers); empty when
    the server does not list workers (it needs worker heartbeats: Temporal >= 1.29)."""
    from temporalio.api.workflowservice.v1 import ListWorkersRequest
    from temporalio.service import RPCError

    query = f"TaskQueue = '{task_queue}'" if _PLAIN_NAME.match(task_queue) else ""
    found: list[WorkerHeartbeat] = []
    token = b""
    try:
        for _ in range(_MAX_WORKER_PAGES):
            resp = await client.workflow_service.list_workers(ListWorkersRequest(
                namespace=namespace, page_size=100, query=query, next_page_token=token))
            found.extend(info.worker_heartbeat for info in resp.workers_info)
            token = resp.next_page_token
            if not token:
                break
    except RPCError:  # not served here: judge pollers by their last poll alone
        return {}
    return latest_heartbeats(found, task_queue)


async def live_poller_counts(client: Any, namespace: str, task_queue: str,
                             clock: Callable[[], float] = time.time) -> dict[str, int]:
    """Live pollers on ``task_queue`` by kind (``workflow``, ``activity``), per
    ``live_pollers`` with LIVE_WINDOW_S; ``clock`` gives Unix time in seconds."""
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    heartbeats = await _worker_heartbeats(client, namespace, task_queue)
    counts: dict[str, int] = {}
    for kind, tq_type in (("workflow", TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW),
                          ("activity", TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)):
        resp = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
            namespace=namespace, task_queue=TaskQueue(name=task_queue), task_queue_type=tq_type))
        counts[kind] = live_pollers(resp.pollers, clock(), LIVE_WINDOW_S, heartbeats)
    return counts


async def refresh_pollers(client: Any, settings: Any) -> None:
    """Worker availability (R-OPS-6): set ``qimpl_task_queue_pollers`` to the pollers on
    the task queue whose worker Temporal heard from within LIVE_WINDOW_S seconds."""
    counts = await live_poller_counts(client, settings.temporal_namespace, settings.task_queue)
    for kind, n in counts.items():
        WORKER_POLLERS.labels(settings.task_queue, kind).set(n)


#: The caller's tenant's runs by state, with the age in seconds of the oldest in each
#: state, by the database's clock. Run inside the tenant's transaction: row-level security
#: limits it to that tenant, and the index ``runs_tenant_state_accepted`` (tenant_id,
#: state, accepted_at) answers it by an index-only scan of that tenant's entries, not a
#: scan of the table (R-OPS-7).
RUN_STATS_SQL = (
    "SELECT state, count(*) AS runs,"
    " extract(epoch FROM clock_timestamp() - min(accepted_at))::float8 AS oldest_s"
    " FROM runs WHERE tenant_id = %s GROUP BY state")


async def tenant_run_stats(conn: Any, tenant_id: str) -> list[tuple[str, int, float]]:
    """``[(state, runs, oldest_s)]`` of ``tenant_id``'s runs; ``conn`` must be in a
    transaction scoped to that tenant (``Services.tenant``)."""
    cur = await conn.execute(RUN_STATS_SQL, (tenant_id,))
    return [(str(state), int(n), float(age)) for state, n, age in await cur.fetchall()]


def run_families(tenant_id: str, stats: Iterable[tuple[str, int, float]]) -> list[Any]:
    """The run metrics of one tenant from ``tenant_run_stats``' rows (pure):
    ``qimpl_runs{tenant,state}``, ``qimpl_oldest_accepted_run_age_seconds{tenant}``
    (seconds; 0 when no run is ``accepted``) and ``qimpl_deadline_expired_runs_total{tenant}``
    (R-OPS-6): every run that ended ``expired``, whoever wrote it — its own workflow, the
    reconciler, the API (a cancel after the deadline) — counted from the database, so
    every instance reports the same (runs are never deleted: it only grows)."""
    runs = GaugeMetricFamily("qimpl_runs", "Runs by tenant and state", labels=["tenant", "state"])
    expired = CounterMetricFamily("qimpl_deadline_expired_runs",
                                  "Runs that ended expired at their deadline, by any writer",
                                  labels=["tenant"])
    oldest = GaugeMetricFamily("qimpl_oldest_accepted_run_age_seconds",
                               "Age of the oldest run still `accepted` (dispatch unconfirmed)",
                               labels=["tenant"])
    age, ended = 0.0, 0
    for state, n, oldest_s in stats:
        runs.add_metric([tenant_id, state], n)
        if state == "accepted":
            age = oldest_s
        if state == "expired":
            ended = n
    oldest.add_metric([tenant_id], age)
    expired.add_metric([tenant_id], ended)
    return [runs, oldest, expired]


class _Families(Collector):
    def __init__(self, families: list[Any]) -> None:
        self._families = families

    def collect(self) -> Iterable[Any]:
        return self._families


def scrape(families: list[Any], *, pollers: bool) -> bytes:
    """One scrape's exposition (Prometheus text format): ``families``, plus
    ``qimpl_task_queue_pollers`` when ``pollers`` (it carries no tenant label). A fresh
    registry per scrape: nothing of one operator's scrape reaches another's."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    if pollers:
        registry.register(WORKER_POLLERS)
    return generate_latest(registry)
