"""Prometheus metrics for operators (R-OPS-6), shared by the API and the worker.

Counters are process-local; the gauges that describe the runs table are computed from
the database when scraped (``refresh_from_db``), so every instance reports the same.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge

__all__ = [
    "DEADLINE_EXPIRIES",
    "DISPATCH_CONFIRMED",
    "OLDEST_ACCEPTED_AGE",
    "RECONCILE_WARNINGS",
    "RUNS_BY_STATE",
    "WORKER_POLLERS",
    "refresh_from_db",
    "refresh_pollers",
]

DEADLINE_EXPIRIES = Counter("qimpl_deadline_expiries_total", "Runs expired at their deadline",
                            ["tenant", "by"])
DISPATCH_CONFIRMED = Counter("qimpl_dispatch_confirmed_total",
                             "Accepted runs whose dispatch the reconciler confirmed", ["tenant"])
RECONCILE_WARNINGS = Counter("qimpl_reconcile_warnings_total",
                             "Reconciler problems (dispatch unknown, candidate errors)",
                             ["tenant", "kind"])
OLDEST_ACCEPTED_AGE = Gauge("qimpl_oldest_accepted_run_age_seconds",
                            "Age of the oldest run still `accepted` (dispatch unconfirmed)",
                            ["tenant"])
RUNS_BY_STATE = Gauge("qimpl_runs", "Runs by tenant and state", ["tenant", "state"])
WORKER_POLLERS = Gauge("qimpl_task_queue_pollers",
                       "Pollers Temporal saw on the task queue recently (worker availability)",
                       ["task_queue", "kind"])


async def refresh_pollers(client: Any, settings: Any) -> None:
    """Worker availability: the pollers Temporal saw recently on the task queue."""
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    for kind, tq_type in (("workflow", TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW),
                          ("activity", TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)):
        resp = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
            namespace=settings.temporal_namespace, task_queue=TaskQueue(name=settings.task_queue),
            task_queue_type=tq_type))
        WORKER_POLLERS.labels(settings.task_queue, kind).set(len(resp.pollers))


async def refresh_from_db(conn: Any) -> None:
    """Recompute the gauges that describe the runs table (cheap, indexed queries)."""
    # Through a SECURITY DEFINER aggregate: the API's role sees one tenant's rows at a time.
    cur = await conn.execute("SELECT tenant_id, state, runs, oldest_s FROM qimpl_run_stats()")
    stats = await cur.fetchall()
    ages = {tenant: oldest for tenant, state, _, oldest in stats if state == "accepted"}
    for labels in list(OLDEST_ACCEPTED_AGE._metrics):  # tenants whose backlog drained
        if labels[0] not in ages:
            OLDEST_ACCEPTED_AGE.labels(*labels).set(0)
    for tenant, age in ages.items():
        OLDEST_ACCEPTED_AGE.labels(tenant).set(age)
    RUNS_BY_STATE.clear()
    for tenant, state, n, _ in stats:
        RUNS_BY_STATE.labels(tenant, state).set(n)
