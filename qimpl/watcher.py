"""The takeover watcher's loop (R-EXEC-13), run by every worker beside its reconciler.

Every ``poll_s`` the elected watcher (``qimpl.db.takeover.hold_watch``) lists the
``running`` runs whose lease is gone and ends their dead Temporal attempt without
waiting for the heartbeat timeout, as ``qimpl.takeover`` decides: by the owner's task
token at once, and by activity id an attempt that started and never claims. Temporal
then schedules the retry, which claims the run as any retry does. The watcher writes
nothing to the database; every write stays the owner's, fenced as always.

Before it ends an attempt it moves the run's activity to its own worker's takeover queue
(``qimpl.takeover``), so that the retry cannot go to the paused owner's outstanding poll;
one JSON line per move (``"event": "takeover.activity_moved"``, ``run_id``,
``generation``, ``to``: the queue, ``timed_out`` and ``stranded_on``: the queue it was
taken from, when Temporal had timed its last attempt out).

Logs one JSON line per attempt it ends (``"event": "takeover.attempt_failed"``, with
``run_id``, ``generation``, ``attempt`` when known and ``by``: ``token`` or
``unclaimed``; an ``unclaimed`` one also says ``lost_worker``: started by the worker
whose attempt lost the lease, so judged on the shorter bound): the harness's evidence.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
from google.protobuf.field_mask_pb2 import FieldMask
from temporalio.api.activity.v1 import ActivityOptions
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import UpdateActivityOptionsRequest
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from qimpl.crashpoints import declare
from qimpl.db import takeover as db
from qimpl.db.sessions import keepalive_params
from qimpl.lifecycle import workflow_id
from qimpl.takeover import Pending, TakeoverTracker, should_move
from qimpl.workflows.agent_run import REDISPATCH_PATCH_ID, WORKFLOW_TYPE

__all__ = ["ACTIVITY_TYPE", "LeaseWatcher", "move_home"]

log = logging.getLogger("qimpl.takeover")

#: The activity that owns runs (``qimpl.workflows.activities``).
ACTIVITY_TYPE = "run_agent_v2"
#: Seconds a watcher that could not reach Temporal stays out of the election.
_STAND_DOWN_S = 1.0
#: While the database session stays lost, one log line per this many seconds.
_LOST_LOG_EVERY_S = 10.0
#: Temporal describes one look may make (issue 55: with 100 runs in backoff each was
#: described at every look, about 990 calls a second); at a 0.1 s poll, 100 a second at most.
DESCRIBES_PER_LOOK = 10
#: Temporal calls the watcher makes at once while it ends dead owners' attempts by token.
CALLS_IN_FLIGHT = 16
AFTER_MOVE = declare("takeover.after_move",
                     "the watcher moved an orphan's activity to its takeover queue, the dead attempt not yet failed")
_STATES = {PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED: "scheduled",
           PendingActivityState.PENDING_ACTIVITY_STATE_STARTED: "started"}


def _lost() -> ApplicationError:
    return ApplicationError("the run's ownership lease is gone", type="LeaseLost")


class LeaseWatcher:
    """``await LeaseWatcher(client, dsn=..., lease_s=2, poll_s=0.2, unclaimed_s=1).run(stop)``.

    ``lease_s`` bounds the watcher's own session (a stopped watcher loses the election
    within it); ``poll_s`` is the time between looks; ``unclaimed_s`` see
    ``qimpl.takeover``. ``task_queue`` and ``takeover_queue``: the shared queue this
    watcher's worker polls and its own takeover queue; ``free_slots()``: how many more
    activities that worker's takeover queue can run now. Without them nothing is moved.
    Never raises out of ``run``: errors are logged and the next look retries.
    """

    def __init__(self, client: Client, *, dsn: str, lease_s: float, poll_s: float,
                 unclaimed_s: float, limit: int = 100, task_queue: str | None = None,
                 takeover_queue: str | None = None,
                 free_slots: Callable[[], int] | None = None,
                 describes_per_look: int = DESCRIBES_PER_LOOK) -> None:
        self.client = client
        self.dsn = dsn
        self.lease_s = lease_s
        self.poll_s = poll_s
        self.limit = limit
        #: At most this many Temporal describes per look (``TakeoverTracker.to_describe``).
        self.describes_per_look = describes_per_look
        #: Where the next look's page of orphans starts (``run_id``, exclusive); None: the first.
        self._after: str | None = None
        self.task_queue = task_queue
        self.takeover_queue = takeover_queue
        self.free_slots = free_slots
        self.tracker = TakeoverTracker(unclaimed_s=unclaimed_s)
        #: The longest a failing call may take (a late by-id fail could meet a successor).
        self._rpc_timeout = timedelta(seconds=max(0.05, min(unclaimed_s, 1.0)))
        self._conn: psycopg.AsyncConnection[Any] | None = None
        #: Looks in a row that lost the database session, and when that was last logged.
        self._lost = 0
        self._lost_logged = 0.0

    async def _session(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = await psycopg.AsyncConnection.connect(
                self.dsn, autocommit=True, application_name="qimpl-takeover-watcher",
                **keepalive_params(self.lease_s))
            await db.bound_watch_session(self._conn, lease_s=self.lease_s)
        return self._conn

    async def run(self, stop: asyncio.Event) -> None:
        """Look every ``poll_s`` until ``stop`` is set."""
        pause = 0.0
        while not stop.is_set():
            try:
                await self.look()
                if self._lost:
                    log.info("takeover watcher has its database session again after %d tries", self._lost,
                             extra={"event": "takeover.session_restored", "tries": self._lost})
                    self._lost = 0
            except RPCError as exc:
                log.warning("takeover watcher cannot reach Temporal: %s", exc.status.name,
                            extra={"event": "takeover.temporal_unreachable"})
                await self._stand_down()
                pause = _STAND_DOWN_S
            except (psycopg.Error, OSError) as exc:
                self._lost += 1
                now = time.monotonic()
                if self._lost == 1 or now - self._lost_logged >= _LOST_LOG_EVERY_S:
                    # One line when it is lost, then one per _LOST_LOG_EVERY_S while it stays
                    # lost (an outage at a 0.1 s poll wrote ten a second).
                    log.warning("takeover watcher lost its database session: %s (%d tries)",
                                type(exc).__name__, self._lost,
                                extra={"event": "takeover.session_lost", "tries": self._lost})
                    self._lost_logged = now
                await self._close()
            except Exception as exc:  # noqa: BLE001 - the watcher must outlive any one look
                log.error("takeover watcher look failed: %s", type(exc).__name__,
                          extra={"event": "takeover.look_failed", "exc_type": type(exc).__name__})
                await self._stand_down()
                pause = _STAND_DOWN_S
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(self.poll_s, pause))
            pause = 0.0
        await self._close()

    async def look(self) -> None:
        """One look: elect, list the orphans, end what ``qimpl.takeover`` says."""
        conn = await self._session()
        if not await db.hold_watch(conn, self.task_queue or ""):
            return
        # Listed twice, in two statements: one statement's snapshot of ``runs`` may predate
        # the lock it sees free (an owner that committed its end and closed its session in
        # between); a run orphaned, unchanged, in both is one whose owner is gone. One page
        # of ``limit`` a look, the next look going on from its last ``run_id`` (back to the
        # first after a short page): every orphan is reached within ``orphans / limit + 1``
        # looks, however many there are (issue 55: ordered by id with a fixed limit, the
        # highest ids of 150 orphans were never listed).
        after = self._after
        first = await self._orphans(conn, after)
        # Nothing listed, nothing to confirm: a look with no orphan (the steady state) is one
        # statement, not two (R-EXEC-14: the watcher's cost at 2,000 running runs).
        listed = await self._orphans(conn, after) if first else {}
        self._after = max(o.run_id for o in listed.values()) if len(listed) >= self.limit else None
        orphans = {k: o for k, o in listed.items() if first.get(k) == o}
        now = time.monotonic()
        self.tracker.look(orphans, now, after=after, upto=self._after)
        by_token = {key: token for key, orphan in orphans.items()
                    if (token := self.tracker.token_to_fail(key, orphan.owner_task_token)) is not None}
        # A dead owner's attempts are ended together, a few Temporal calls at a time: one
        # after the other, a worker's 200 runs at once took seconds a look, past the
        # watcher's own lease (its session ended idle, issue 55). Only while a takeover slot
        # is free is the run's activity described and moved first.
        gate = asyncio.Semaphore(CALLS_IN_FLIGHT)
        moving = 0  # takeover slots this look's calls have claimed (none is in a slot yet)

        async def end(key: tuple[str, int], token: bytes) -> None:
            nonlocal moving
            async with gate:
                orphan = orphans[key]
                if self._slots_free() > moving:  # taken before any await: no two tasks take one slot
                    moving += 1
                    await self._move(orphan, await self._pending(workflow_id(orphan.run_id, orphan.generation)))
                await self._fail_token(orphan, token)

        async def keep_session() -> None:
            # Many calls can take longer than the watcher's own lease (its session is bounded
            # like one): touched meanwhile, so a live watcher keeps its election.
            while True:
                await asyncio.sleep(self.lease_s / 4)
                await conn.execute("SELECT 1")

        try:
            async with asyncio.TaskGroup() as group:
                keeper = group.create_task(keep_session()) if by_token else None
                calls = [group.create_task(end(key, token)) for key, token in by_token.items()]
                if keeper is not None:
                    await asyncio.gather(*calls, return_exceptions=True)
                    keeper.cancel()
        except BaseExceptionGroup as failed:
            raise _first(failed) from None
        for key in self.tracker.to_describe([k for k in orphans if k not in by_token], now, self.poll_s,
                                            self.describes_per_look):
            await self._unclaimed(conn, orphans[key])

    def _slots_free(self) -> int:
        """Takeover slots this watcher's worker has for more moved runs (0 without a queue)."""
        if self.task_queue is None or self.takeover_queue is None or self.free_slots is None:
            return 0
        return max(0, self.free_slots() - self.tracker.moves_unclaimed())

    async def _orphans(self, conn: psycopg.AsyncConnection[Any],
                       after: str | None = None) -> dict[tuple[str, int], db.Orphan]:
        return {(o.run_id, o.generation): o
                for o in await db.lease_orphans(conn, limit=self.limit, after=after)}

    async def _still_orphaned(self, conn: psycopg.AsyncConnection[Any], orphan: db.Orphan) -> bool:
        """Re-read right before a call: the run is still ``running``, unclaimed since, and
        its lock free (and this session still the watcher)."""
        if not await db.hold_watch(conn, self.task_queue or ""):
            return False
        # The page that starts just below it: one that holds the run when it is still orphaned.
        return (await self._orphans(conn, _just_below(orphan.run_id))).get(
            (orphan.run_id, orphan.generation)) == orphan

    async def _fail_token(self, orphan: db.Orphan, token: bytes) -> None:
        key = (orphan.run_id, orphan.generation)
        self.tracker.token_failed(key, token)
        try:
            await self.client.get_async_activity_handle(task_token=token).fail(
                _lost(), rpc_timeout=self._rpc_timeout)
        except RPCError as exc:
            if exc.status not in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT,
                                  RPCStatusCode.FAILED_PRECONDITION):
                raise
            return  # that attempt had already ended: nothing to do
        log.info("run %s: attempt %s failed by its task token (lease gone)", orphan.run_id,
                 orphan.owner_attempt,
                 extra={"event": "takeover.attempt_failed", "run_id": orphan.run_id,
                        "generation": orphan.generation, "attempt": orphan.owner_attempt,
                        "by": "token"})

    async def _unclaimed(self, conn: psycopg.AsyncConnection[Any], orphan: db.Orphan) -> None:
        key = (orphan.run_id, orphan.generation)
        wf_id = workflow_id(orphan.run_id, orphan.generation)
        pending = await self._pending(wf_id)
        await self._move(orphan, pending)  # a swallowed attempt, or its takeover worker died
        if not self.tracker.unclaimed(key, pending, time.monotonic()) or pending is None:
            return
        if not await self._still_orphaned(conn, orphan) or await self._pending(wf_id) != pending:
            return
        lost_worker = self.tracker.lost_worker(key, pending)
        try:
            # Bounded: a call that lands long after the re-check could meet a successor
            # (failing by id names no attempt); the SDK's own retries would stretch it.
            await self.client.get_async_activity_handle(
                workflow_id=wf_id, run_id=None, activity_id=pending.activity_id).fail(
                    _lost(), rpc_timeout=self._rpc_timeout)
        except RPCError as exc:
            if exc.status not in (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION):
                raise
            return
        finally:
            self.tracker.failed_by_id(key)
        log.info("run %s: started attempt %s never claimed it; failed (lease gone)", orphan.run_id,
                 pending.attempt,
                 extra={"event": "takeover.attempt_failed", "run_id": orphan.run_id,
                        "generation": orphan.generation, "attempt": pending.attempt,
                        "by": "unclaimed", "lost_worker": lost_worker})

    async def _move(self, orphan: db.Orphan, pending: Pending | None) -> None:
        """Move the orphan's activity to this worker's takeover queue when it belongs to
        this worker's task queue, is not there yet and a takeover slot is free. Best
        effort: a refused or failed call is logged and the takeover goes on without it."""
        if (self.task_queue is None or self.takeover_queue is None or self.free_slots is None
                or pending is None
                or not should_move(pending, home=self.task_queue, own=self.takeover_queue, redispatches=True)
                or self.free_slots() - self.tracker.moves_unclaimed() <= 0):
            return
        key = (orphan.run_id, orphan.generation)
        wf_id = workflow_id(orphan.run_id, orphan.generation)
        redispatch = not should_move(pending, home=self.task_queue, own=self.takeover_queue)
        if redispatch and not await self._redispatches(key, wf_id):
            return  # a timed-out retry of a workflow that would fail the run if moved
        try:
            await self.client.workflow_service.update_activity_options(UpdateActivityOptionsRequest(
                namespace=self.client.namespace, execution=WorkflowExecution(workflow_id=wf_id),
                identity=self.client.identity, id=pending.activity_id,
                activity_options=ActivityOptions(task_queue=TaskQueue(name=self.takeover_queue)),
                update_mask=FieldMask(paths=["task_queue.name"])), timeout=self._rpc_timeout)
        except RPCError as exc:
            log.warning("run %s: activity not moved to the takeover queue: %s", orphan.run_id,
                        exc.status.name, extra={"event": "takeover.move_refused", "run_id": orphan.run_id})
            return
        self.tracker.moved(key)
        log.info("run %s: activity moved to the takeover queue %s", orphan.run_id, self.takeover_queue,
                 extra={"event": "takeover.activity_moved", "run_id": orphan.run_id,
                        "generation": orphan.generation, "to": self.takeover_queue,
                        "timed_out": pending.timed_out, "stranded_on": pending.task_queue})
        await AFTER_MOVE.areach(run_id=orphan.run_id, generation=orphan.generation)

    async def _redispatches(self, key: tuple[str, int], wf_id: str) -> bool:
        """Whether the workflow ``wf_id`` schedules a never-started activity again: it is
        of version 3 (``WORKFLOW_TYPE``), or its history records ``REDISPATCH_PATCH_ID``
        (read once per orphaned stretch)."""
        known = self.tracker.redispatches(key)
        if known is not None:
            return known
        history = await self.client.get_workflow_handle(wf_id).fetch_history(rpc_timeout=self._rpc_timeout)
        answer = _workflow_type(history.events[0] if history.events else None) == WORKFLOW_TYPE or any(
            e.HasField("marker_recorded_event_attributes")
            and e.marker_recorded_event_attributes.marker_name == "core_patch"
            and any(REDISPATCH_PATCH_ID.encode() in p.data
                    for ps in e.marker_recorded_event_attributes.details.values() for p in ps.payloads)
            for e in history.events)
        self.tracker.redispatched(key, answer)
        return answer

    async def _pending(self, wf_id: str) -> Pending | None:
        """The workflow's pending agent activity, or None (closed, missing, between)."""
        try:
            desc = await self.client.get_workflow_handle(wf_id).describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return None
            raise
        for act in desc.raw_description.pending_activities:
            if act.activity_type.name != ACTIVITY_TYPE:
                continue
            started = (act.last_started_time.seconds + act.last_started_time.nanos / 1e9
                       if act.HasField("last_started_time") else None)
            beat = (act.last_heartbeat_time.seconds + act.last_heartbeat_time.nanos / 1e9
                    if act.HasField("last_heartbeat_time") else None)
            return Pending(attempt=int(act.attempt), state=_STATES.get(act.state, "other"),
                           started_at=started, activity_id=act.activity_id, heartbeat_at=beat,
                           worker=act.last_worker_identity or None,
                           task_queue=(act.activity_options.task_queue.name or None
                                       if act.HasField("activity_options") else None),
                           timed_out=(act.HasField("last_failure")
                                      and act.last_failure.HasField("timeout_failure_info")))
        return None

    async def _stand_down(self) -> None:
        if self._conn is not None and not self._conn.closed:
            with contextlib.suppress(psycopg.Error):
                await db.release_watch(self._conn)

    async def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                await self._conn.close()
        self._conn = None


async def move_home(client: Client, *, namespace: str, workflow_id: str, activity_id: str,
                    timeout_s: float = 2.0) -> bool:
    """Give a moved activity its original options back (its shared task queue), so that its
    later retries no longer depend on the worker whose takeover queue it ran on; called by
    the successor right after its claim. False (logged) when Temporal refused or did not
    answer within ``timeout_s`` seconds: the next watcher then moves it if it must."""
    try:
        await client.workflow_service.update_activity_options(UpdateActivityOptionsRequest(
            namespace=namespace, execution=WorkflowExecution(workflow_id=workflow_id),
            identity=client.identity, id=activity_id, restore_original=True),
            timeout=timedelta(seconds=timeout_s))
    except RPCError as exc:
        log.warning("activity of %s not moved home: %s", workflow_id, exc.status.name,
                    extra={"event": "takeover.move_home_refused", "workflow_id": workflow_id})
        return False
    return True


def _first(group: BaseExceptionGroup[Any]) -> BaseException:
    """The error a failed group of calls raises: its first that is not a cancellation (an
    RPCError stays one, so ``run`` tells Temporal out of reach from any other failure)."""
    for exc in group.exceptions:
        inner = _first(exc) if isinstance(exc, BaseExceptionGroup) else exc
        if not isinstance(inner, asyncio.CancelledError):
            return inner
    return group.exceptions[0]


def _just_below(run_id: str) -> str:
    """The UUID right below ``run_id``: a page that starts after it starts at ``run_id``."""
    value = uuid.UUID(run_id).int
    return str(uuid.UUID(int=max(value - 1, 0)))


def _workflow_type(started: HistoryEvent | None) -> str | None:
    """The workflow type a start event names; None for any other event."""
    if started is None or not started.HasField("workflow_execution_started_event_attributes"):
        return None
    return started.workflow_execution_started_event_attributes.workflow_type.name or None
