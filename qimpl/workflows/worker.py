"""Worker entry point: ``python -m qimpl.workflows.worker``.

Polls the task queue for the agent-run workflows and activities, and — for the tenants
in ``DURABLE_AGENT_RECONCILE_TENANTS`` — runs the reconciler every
``QIMPL_RECONCILE_INTERVAL_S`` (R-OPS-3). Refuses a transaction-pooling PgBouncer at
start (R-OPS-5). Prints one JSON log line with ``"event": "worker.ready"`` once polling
has started. Exits 0 on SIGTERM or SIGINT after a graceful shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import sys
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
from prometheus_client import start_http_server
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from qimpl import metrics
from qimpl.db.connect_errors import connect_problem
from qimpl.db.lease import lease_carriers as carriers_for
from qimpl.db.lease_carriers import LeaseCarriers
from qimpl.db.roles import refuse_unsafe_role
from qimpl.db.sessions import keepalive_params
from qimpl.errors import UnsafeDatabaseRole
from qimpl.logs import setup_logging, temporal_runtime
from qimpl.provider import Provider, load_provider
from qimpl.reconciler import sweep_tenant
from qimpl.settings import (
    ConfigError,
    Settings,
    WorkerSettings,
    env_name,
    exit_config,
    load_or_exit,
    plugin_error,
    warn_no_watcher_margin,
)
from qimpl.takeover import heartbeat_throttle_s, takeover_queue
from qimpl.tool_journal.seam import ToolRegistry, load_tools
from qimpl.watcher import LeaseWatcher
from qimpl.workflows.activities import AgentActivities
from qimpl.workflows.agent_run import AgentRunWorkflowV2, AgentRunWorkflowV3
from qimpl.workflows.agent_run_v1 import AgentRunWorkflowV1
from qimpl.workflows.search_attributes import create_commands, missing

__all__ = ["WORKFLOWS", "agent_activities", "build_takeover_worker", "build_worker", "event_loop_factory", "load_plugins", "main", "workflow_runner"]

log = logging.getLogger("qimpl.worker")

#: Exit codes at start, as the one-shot sweep's: the database, then Temporal, unreachable.
EXIT_DATABASE, EXIT_TEMPORAL = 2, 3

#: Every workflow type the worker serves: version 3 is started today; versions 1 and 2 stay
#: for their histories (R-EXEC-10).
WORKFLOWS = (AgentRunWorkflowV3, AgentRunWorkflowV2, AgentRunWorkflowV1)


def load_plugins(settings: WorkerSettings) -> tuple[Provider, ToolRegistry]:
    """The configured provider and tools. Raises ConfigError naming ``QIMPL_PROVIDER`` or
    ``QIMPL_TOOLS`` when one does not load (exit code 64 at start, R-EXEC-1)."""
    try:
        provider = load_provider(settings.provider, settings.provider_config)
    except ValueError as exc:
        raise plugin_error(WorkerSettings, "provider", exc) from None
    try:
        tools = load_tools(settings.tools, settings.tools_config)
    except Exception as exc:  # noqa: BLE001 - any failure of the plugin is a configuration error
        why = (f"cannot import module {exc.name!r}" if isinstance(exc, ImportError)
               else str(exc) if isinstance(exc, ValueError)
               else f"the factory raised {type(exc).__name__} (check QIMPL_TOOLS_CONFIG)")
        raise plugin_error(WorkerSettings, "tools", ValueError(why)) from None
    return provider, tools


def build_worker(client: Client, settings: WorkerSettings,
                 plugins: tuple[Provider, ToolRegistry] | None = None,
                 activities: AgentActivities | None = None) -> Worker:
    """A worker for ``settings.task_queue`` with the real activities and the configured
    provider and tools (``load_plugins`` unless given)."""
    activities = activities or agent_activities(settings, plugins)
    return Worker(
        client,
        task_queue=settings.task_queue,
        workflows=list(WORKFLOWS),
        # qimpl's workflows run unsandboxed unless asked (QIMPL_WORKFLOW_SANDBOX): the
        # sandbox imports the workflow module afresh for every run. The tests judge them in
        # the sandbox instead (docs/operations.md, "The workflow sandbox").
        workflow_runner=workflow_runner(settings),
        activities=[activities.run_agent, activities.fail_run, activities.run_outcome, activities.run_agent_v1],
        # After a worker dies its sticky queue would hold the next workflow task for the
        # default 10 s; a short timeout hands it to a live worker quickly.
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
        # A paused worker's outstanding activity polls can each swallow one retry (the
        # server hands it the task; it never starts, and only the takeover watcher or the
        # heartbeat timeout ends it). One poll: at most one lost attempt per paused worker.
        max_concurrent_activity_task_polls=1,
        # Likewise for workflow tasks (each swallowed one waits out the run's workflow task
        # timeout, QIMPL_WORKFLOW_TASK_TIMEOUT_S); two is the least a sticky worker polls.
        max_concurrent_workflow_task_polls=2,
        max_concurrent_activities=settings.max_concurrent_activities,
        # Heartbeats at most this far apart, so Temporal's heartbeat timeout of a paused
        # owner comes after the watcher's takeover (qimpl.takeover.watcher_margin_s).
        max_heartbeat_throttle_interval=heartbeat_throttle(settings),
        graceful_shutdown_timeout=timedelta(seconds=2),
    )


def event_loop_factory(settings: WorkerSettings) -> Callable[[], asyncio.AbstractEventLoop]:
    """A new event loop of the kind ``settings.event_loop`` names (uvloop's or asyncio's)."""
    if settings.event_loop == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def workflow_runner(settings: WorkerSettings) -> WorkflowRunner:
    """temporalio's sandbox when ``settings.workflow_sandbox``, else the unsandboxed runner."""
    return SandboxedWorkflowRunner() if settings.workflow_sandbox else UnsandboxedWorkflowRunner()


def agent_activities(settings: WorkerSettings,
                     plugins: tuple[Provider, ToolRegistry] | None = None) -> AgentActivities:
    """The activities with the configured provider and tools (``load_plugins`` unless given)."""
    provider, tools = plugins or load_plugins(settings)
    activities = AgentActivities(dsn=settings.database_url, provider=provider, tools=tools,
                                 slot_limit=settings.concurrency_limit,
                                 lock_timeout_s=settings.api_lock_timeout_s,
                                 unclaimed_s=settings.takeover_unclaimed_s)
    activities.own_timing = (settings.lease, settings.heartbeat_timeout_s)
    return activities


def heartbeat_throttle(settings: WorkerSettings) -> timedelta:
    """The longest interval between two heartbeats of an attempt (``qimpl.takeover.heartbeat_throttle_s``)."""
    return timedelta(seconds=heartbeat_throttle_s(settings.heartbeat_timeout_s, settings.lease))


def lease_carriers(settings: WorkerSettings) -> LeaseCarriers:
    """The worker's lease sessions (``qimpl.db.lease_carriers``): ``lease_session_runs``
    runs' locks on each, enough sessions for every activity slot and takeover slot at once
    (R-EXEC-14: a bound that does not grow one for one with in-flight runs)."""
    return carriers_for(settings.database_url, lease_s=settings.lease,
                        runs_per_session=settings.lease_session_runs,
                        max_runs=settings.max_concurrent_activities + settings.takeover_slots)


def build_takeover_worker(client: Client, settings: WorkerSettings, activities: AgentActivities,
                          queue: str) -> Worker:
    """The worker of this process's takeover queue ``queue`` (R-EXEC-13, ``qimpl.takeover``):
    the agent activity only, ``settings.takeover_slots`` at a time, one poll."""
    return Worker(
        client,
        task_queue=queue,
        activities=[activities.run_agent],
        max_concurrent_activity_task_polls=1,
        max_concurrent_activities=settings.takeover_slots,
        max_heartbeat_throttle_interval=heartbeat_throttle(settings),
        graceful_shutdown_timeout=timedelta(seconds=2),
    )


async def reconcile_forever(client: Client, settings: WorkerSettings, stop: asyncio.Event) -> None:
    """Sweep every tenant of ``DURABLE_AGENT_RECONCILE_TENANTS`` every interval (R-OPS-3).
    Errors are logged and counted; the loop never dies of one."""
    name = f"{socket.gethostname()}:{os.getpid()}"
    conn: psycopg.AsyncConnection[Any] | None = None
    while not stop.is_set():
        for tenant in settings.reconcile_tenants:
            try:
                if conn is None or conn.closed:
                    conn = await psycopg.AsyncConnection.connect(
                        settings.database_url, autocommit=True, application_name="qimpl-reconciler",
                        **keepalive_params(settings.api_lock_timeout_s))
                await sweep_tenant(conn, client, settings, tenant, reconciler=name,
                                   grace_s=settings.reconcile_grace_s)
            except Exception as exc:  # noqa: BLE001 - the next sweep retries
                metrics.RECONCILE_WARNINGS.labels(tenant, "sweep_failed").inc()
                log.warning("sweep of tenant %s failed: %s", tenant, type(exc).__name__,
                            extra={"event": "reconciler.sweep_failed", "tenant": tenant,
                                   "exc_type": type(exc).__name__})
                if conn is not None:
                    await conn.close()
                conn = None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=settings.reconcile_interval_s)
    if conn is not None:
        await conn.close()


async def watch_leases(client: Client, settings: WorkerSettings, stop: asyncio.Event,
                       takeover: tuple[str, AgentActivities] | None = None) -> None:
    """The takeover watcher (R-EXEC-13, ``qimpl.watcher``) until ``stop``; nothing when
    ``QIMPL_TAKEOVER_WATCH`` is off. ``takeover``: this process's takeover queue and the
    activities its worker runs (None: nothing is moved)."""
    if not settings.takeover_watch:
        await stop.wait()
        return
    queue, activities = takeover if takeover else (None, None)
    await LeaseWatcher(client, dsn=settings.database_url,
                       lease_s=settings.lease,
                       poll_s=settings.takeover_poll_s,
                       unclaimed_s=settings.takeover_unclaimed_s,
                       task_queue=settings.task_queue if takeover else None, takeover_queue=queue,
                       free_slots=(lambda: settings.takeover_slots - activities.taken_over)
                       if activities else None).run(stop)


async def check_session_pooling(settings: Settings) -> None:
    """Refuse transaction-pooling PgBouncer (R-OPS-5): the ownership lease needs one server
    session across transactions. Raises SystemExit with a clear message otherwise.

    Probe: connection A reads its backend pid; a second connection B then reads its own
    while A sits idle; A reads again. With a direct or session-pooled connection A keeps
    its server session, so B's differs and A's is unchanged. A transaction pooler returns
    A's idle server connection to the pool after each transaction and hands it to B
    (PgBouncer reuses the most recently released one), or gives A another one.
    """

    async def backend_pid(conn: psycopg.AsyncConnection[Any]) -> int:
        cur = await conn.execute("SELECT pg_backend_pid()")
        row = await cur.fetchone()
        return int(row[0]) if row else -1

    connect = functools.partial(psycopg.AsyncConnection.connect, settings.database_url,
                                autocommit=True, application_name="qimpl-pool-check")
    async with await connect() as a:
        first = await backend_pid(a)
        async with await connect() as b:
            other = await backend_pid(b)
            again = await backend_pid(a)
        try:
            await refuse_unsafe_role(a, "worker", log, worker_functions=True)
        except UnsafeDatabaseRole as exc:
            raise SystemExit(f"qimpl worker: {exc} ({exc.code})") from None
    if other == first or again != first:
        raise SystemExit(
            "qimpl worker: the database connection does not keep one server session across "
            "transactions (transaction-pooling PgBouncer?). Session advisory locks need a direct "
            "or session-pooled connection: point QIMPL_DATABASE_URL at PostgreSQL or at a "
            "PgBouncer pool with pool_mode=session.")


async def run(settings: WorkerSettings, plugins: tuple[Provider, ToolRegistry]) -> None:
    try:
        await check_session_pooling(settings)
    except psycopg.OperationalError as exc:
        problem = connect_problem(exc)
        log.error("worker: %s", problem.summary, extra={"event": f"worker.{problem.code}"})
        raise SystemExit(EXIT_DATABASE) from None
    try:
        client = await Client.connect(settings.temporal_address, namespace=settings.temporal_namespace,
                                      runtime=temporal_runtime())
    except RuntimeError as exc:
        raise SystemExit(_unreachable(f"Temporal at {settings.temporal_address}",
                                      type(exc).__name__, EXIT_TEMPORAL)) from None
    await check_search_attributes(client, settings)
    if settings.takeover_watch:
        warn_no_watcher_margin(settings, log, settings.takeover_poll_s)
    activities = agent_activities(settings, plugins)
    activities.carriers = carriers = lease_carriers(settings)
    carriers.open()
    try:
        worker = build_worker(client, settings, activities=activities)
        queue = takeover_queue(settings.task_queue, uuid.uuid4().hex[:12])
        takeover_worker = (build_takeover_worker(client, settings, activities, queue)
                           if settings.takeover_slots and settings.takeover_watch else None)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if settings.metrics_port:
            start_http_server(settings.metrics_port, addr="127.0.0.1")
        async with worker, takeover_worker or contextlib.nullcontext():
            reconciler = asyncio.create_task(reconcile_forever(client, settings, stop))
            watcher = asyncio.create_task(watch_leases(
                client, settings, stop, (queue, activities) if takeover_worker else None))
            log.info("worker ready on %s", settings.task_queue,
                     extra={"event": "worker.ready", "pid": os.getpid(),
                            "lease_s": settings.lease, "heartbeat_timeout_s": settings.heartbeat_timeout_s,
                            "heartbeat_throttle_s": heartbeat_throttle(settings).total_seconds(),
                            "takeover_queue": queue if takeover_worker else None,
                            "reconcile_tenants": settings.reconcile_tenants})
            await stop.wait()
            await reconciler
            await watcher
    finally:
        await carriers.close()
    log.info("worker stopped", extra={"event": "worker.stopped"})


async def check_search_attributes(client: Client, settings: WorkerSettings) -> None:
    """With ``QIMPL_TEMPORAL_SEARCH_ATTRIBUTES`` on, the namespace must have the run's
    search attributes registered (``qimpl.workflows.search_attributes``): a workflow task
    that sets an unregistered one fails again and again, so the worker refuses to start
    and exits 64 with one line naming the missing ones and the commands that register
    them. Raises SystemExit."""
    if not settings.temporal_search_attributes:
        return
    absent = await missing(client, settings.temporal_namespace)
    if absent:
        exit_config(ConfigError(
            code="search_attributes_missing",
            variable=env_name(WorkerSettings, "temporal_search_attributes"),
            reason=(f"is on but namespace {settings.temporal_namespace!r} lacks the search "
                    f"attributes {', '.join(absent)}: register them ("
                    + "; ".join(create_commands(settings.temporal_namespace))
                    + ") or turn the setting off"),
            example="false"), "worker")


def _unreachable(what: str, exc_type: str, code: int) -> int:
    log.error("worker cannot reach %s: %s", what, exc_type,
              extra={"event": "worker.unreachable", "exc_type": exc_type})
    return code


def main() -> None:
    """Run until SIGTERM/SIGINT. Exit codes: 0 stopped, 64 a missing or malformed setting
    or a provider/tools plugin that does not load (one line on stderr naming the
    variable), 2 the database unreachable at start, 3 Temporal unreachable at start, 1 any
    other failure (one JSON log line with the exception type, never a traceback). Exits
    with ``os._exit`` after the graceful shutdown: the Temporal core's threads must not run
    into the interpreter's finalisation (seen as "Fatal Python error: PyGILState_Release"
    on exit)."""
    setup_logging()
    code = 0
    try:
        settings = load_or_exit(WorkerSettings, "worker")
        try:
            plugins = load_plugins(settings)
        except ConfigError as exc:
            exit_config(exc, "worker")
        with asyncio.Runner(loop_factory=event_loop_factory(settings)) as runner:
            runner.run(run(settings, plugins))
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            code = 1
        else:
            code = int(exc.code or 0)
    except Exception as exc:  # noqa: BLE001 - one line with the type, never a traceback
        log.error("worker failed: %s", type(exc).__name__,
                  extra={"event": "worker.failed", "exc_type": type(exc).__name__})
        code = 1
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
