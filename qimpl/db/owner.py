"""The activity owner of one run generation: its lease session plus its fencing token.

``RunOwner.claim`` makes an activity attempt the run's owner; every later write of that
attempt is a method of the returned object — ``checkpoint``, ``count_failure``,
``park``, ``complete``, ``fail``, ``expire`` — so the fencing rules live here and the
activity reads as the agent loop.

The fencing token is ``(row_version, generation, owner_attempt)``: each write is one
transaction whose UPDATE matches only the row version this owner last wrote, its
generation and its attempt, in state ``running`` (R-EXEC-7). The transition guard then
refuses what the token cannot express (R-STATE-1): a terminal run (``QG001``), a write
after the deadline by the database's clock (``QG006``, R-EXEC-8), ``expired`` before
it (``QG007``, R-EXEC-12) and an attempt lower than the stored owner (``QG008``). A
write that matches no row or that the guard refuses raises ``LostOwnership``; a write
refused for the deadline raises ``DeadlinePassed``, and the owner then expires the run.

The deadline is measured on the database's clock: the claim reads the seconds left
(``deadline_at - clock_timestamp()``) and the owner counts them down on the monotonic
clock, so a worker whose wall clock is ahead or behind neither stops early nor late.

Why one module of about 470 lines: it is the fence. Every write an owner makes is a
method of ``RunOwner`` and goes through ``_write`` and ``_refusal`` here, so a reviewer
audits the whole fence, and every refusal it maps, in one file; splitting the methods
by kind (provider calls, tools, checkpoints, endings) would spread it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import psycopg
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import Jsonb

from qimpl.crashpoints import declare
from qimpl.db.runs import (
    DEADLINE_SQLSTATE,
    EXPIRE_SET,
    GUARD_SQLSTATES,
    Row,
    expire_if_overdue,
    get_run,
)
from qimpl.errors import DeadlinePassed, LostOwnership
from qimpl.lifecycle import TERMINAL, RunState
from qimpl.state_delta import diff

__all__ = ["Claim", "RunOwner"]

log = logging.getLogger("qimpl.owner")

AConn = psycopg.AsyncConnection[Any]

INSIDE_CLAIM = declare(
    "owner.inside_claim_transaction",
    "the claim's UPDATE ran: the row lock (and tenant-slot lock) is held, nothing committed")
INSIDE_CHECKPOINT = declare(
    "owner.inside_checkpoint_transaction",
    "a checkpoint's UPDATE ran: the row lock is held, the checkpoint not committed")

#: The owner's fencing condition (R-EXEC-7).
_FENCE = (
    "WHERE run_id = %(run_id)s AND row_version = %(expected)s AND generation = %(generation)s"
    " AND owner_attempt = %(attempt)s AND state = 'running'"
)
_TERMINAL_SQL = "('completed', 'failed', 'expired', 'cancelled')"
_LEFT = "extract(epoch FROM deadline_at - clock_timestamp())::float8 AS deadline_left_s"
#: lock_not_available (lock_timeout), serialization failure, deadlock: the write met
#: another session, not a problem of the value written.
_CONTENDED = frozenset({"55P03", "40001", "40P01"})
#: What a final commit returns: never ``result_json`` (an answer of megabytes stays in the
#: database; a paused owner must not hold a backend busy sending it back).
_SMALL = "run_id, state, row_version, generation, error_code"
#: How often an early ``expire`` re-reads the database's clock (seconds).
_EXPIRE_RETRY_S = 0.05


async def _read(conn: AConn, run_id: str) -> Row:
    row = await get_run(conn, run_id)
    if row is None:
        raise LostOwnership(f"run {run_id} does not exist")
    return row


class Claim:
    """What a claim found: ``owner`` set when this attempt now owns a ``running`` run;
    otherwise ``row`` says why not (terminal, parked, another generation, or ``queued``
    waiting for a tenant slot)."""

    def __init__(self, row: Row, owner: RunOwner | None) -> None:
        self.row = row
        self.owner = owner

    @property
    def waiting_for_slot(self) -> bool:
        return self.owner is None and self.row["state"] == RunState.QUEUED


def lease_unproven(proved_at: float, now: float, lease_s: float) -> bool:
    """Whether an owner must prove its lease again before a provider or tool call: the
    statement that last proved it was sent at ``proved_at`` (monotonic seconds) and
    PostgreSQL ends the session ``lease_s`` after a statement ends, so at ``now`` the lease
    is certain only while less than half of it has passed (the other half covers the
    answer's way back and clock reads). R-EXEC-11."""
    return now - proved_at >= lease_s / 2


class RunOwner:
    """The fenced writes of one attempt on its lease connection ``conn``."""

    def __init__(self, conn: AConn, *, run_id: str, generation: int, attempt: int,
                 row_version: int, deadline_left_s: float,
                 live: Callable[[], bool] | None = None, lease_s: float | None = None) -> None:
        self._conn = conn
        self._live = live
        self._lease_s = lease_s
        #: When (monotonic seconds) the last statement that proved this owner's lease was
        #: *sent*: PostgreSQL ends the session ``lease_s`` after a statement ends, so the
        #: lease is alive at least until ``sent + lease_s`` (``before_call``).
        self._proved_at = time.monotonic()
        self.run_id = run_id
        self.generation = generation
        self.attempt = attempt
        self.row_version = row_version
        self._deadline_mono = time.monotonic() + deadline_left_s

    @property
    def conn(self) -> AConn:
        """The lease session every write of this owner goes through. Raises LostOwnership
        once the lease that gave it has ended (``live``): a pooled session may serve
        another run by then (``qimpl.db.lease_carriers``), and a call this attempt still
        makes (a provider that emits output after its step returned) must not reach it."""
        if self._live is not None and not self._live():
            raise LostOwnership(f"the lease of run {self.run_id} (attempt {self.attempt}) has ended")
        return self._conn

    # -- the claim ---------------------------------------------------------------------
    @classmethod
    async def claim(cls, conn: AConn, run_id: str, *, generation: int, attempt: int,
                    slot_limit: int = 0, task_token: bytes | None = None,
                    live: Callable[[], bool] | None = None, lease_s: float | None = None) -> Claim:
        """Make this attempt the owner (R-EXEC-2): ``accepted -> queued -> running`` or a
        takeover ``running -> running`` with ``owner_attempt = attempt``. Call only while
        holding the run's advisory lock.

        Refuses (LostOwnership) an attempt lower than the stored ``owner_attempt`` of the
        same generation: fencing tokens only go forward, so a superseded attempt delivered
        late cannot take the run back. A run whose deadline passed by the database's clock
        is expired here instead of claimed (R-EXEC-8).

        Tenant slots (R-EXEC-9): with ``slot_limit > 0`` a ``queued`` run starts only while
        fewer than ``slot_limit`` of its tenant's runs are ``running`` or
        ``awaiting_approval``; otherwise it stays ``queued`` (its dispatch recorded as
        confirmed). Claims of one tenant are serialised by a transaction-level advisory
        lock so that two cannot both see room.

        ``live``: whether the lease that holds ``conn`` still does (``OwnershipLease.live``);
        the owner refuses to use ``conn`` once it returns False. ``lease_s``: the lease,
        seconds (``before_call``); None: no check before calls."""
        # The writer's identity, recorded by the audit trigger with every write of this
        # session (``run_transitions.writer_token``): set outside the claim's transaction,
        # so a rolled-back claim does not take it back.
        await conn.execute("SELECT set_config('qimpl.owner', %s, false)",
                           (f"{run_id}:{generation}:{attempt}",))
        try:
            return await cls._claim(conn, run_id, generation=generation, attempt=attempt,
                                    slot_limit=slot_limit, task_token=task_token, live=live,
                                    lease_s=lease_s)
        except psycopg.Error as exc:
            if exc.sqlstate in GUARD_SQLSTATES and exc.sqlstate != DEADLINE_SQLSTATE:
                # The database's guard refused the claim (a fencing token going back, QG008,
                # should the check above ever miss one): a lost ownership like any other
                # refused owner write, logged as the fence's refusal (R-EXEC-7).
                log.warning("claim of run %s refused (guard:%s): attempt %s of generation %s",
                            run_id, exc.sqlstate, attempt, generation,
                            extra={"event": "owner.write_refused", "run_id": run_id,
                                   "how": f"guard:{exc.sqlstate}", "attempt": attempt,
                                   "generation": generation})
                raise LostOwnership(f"claim of run {run_id} rejected: {exc.sqlstate}") from None
            if exc.sqlstate != DEADLINE_SQLSTATE:
                raise
        # The deadline passed between the claim's read and its write (R-EXEC-8).
        expired = await expire_if_overdue(conn, run_id)
        return Claim(expired if expired is not None else await _read(conn, run_id), None)

    @classmethod
    async def _claim(cls, conn: AConn, run_id: str, *, generation: int, attempt: int,
                     slot_limit: int, task_token: bytes | None,
                     live: Callable[[], bool] | None, lease_s: float | None) -> Claim:
        async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(f"SELECT *, {_LEFT} FROM runs WHERE run_id = %s FOR UPDATE", (run_id,))
            row = await cur.fetchone()
            if row is None:
                raise LostOwnership(f"run {run_id} does not exist")
            if RunState(row["state"]) in TERMINAL or row["generation"] != generation:
                return Claim(row, None)
            if row["owner_attempt"] is not None and attempt < int(row["owner_attempt"]):
                raise LostOwnership(f"claim of run {run_id} refused: attempt {attempt} is lower "
                                    f"than its owner's attempt {row['owner_attempt']}")
            if row["deadline_left_s"] <= 0 and row["state"] in (
                    RunState.ACCEPTED, RunState.QUEUED, RunState.RUNNING):
                await cur.execute(
                    f"UPDATE runs SET {EXPIRE_SET} WHERE run_id = %s RETURNING *, {_LEFT}",
                    (run_id,))
                expired = await cur.fetchone()
                assert expired is not None
                return Claim(expired, None)
            if row["state"] == RunState.ACCEPTED:
                await cur.execute(
                    "UPDATE runs SET state = 'queued', row_version = row_version + 1,"
                    " dispatch_confirmed_at = coalesce(dispatch_confirmed_at, clock_timestamp())"
                    f" WHERE run_id = %s RETURNING *, {_LEFT}", (run_id,))
                row = await cur.fetchone()
                assert row is not None
            if row["state"] not in (RunState.QUEUED, RunState.RUNNING):
                return Claim(row, None)
            if row["state"] == RunState.QUEUED and slot_limit > 0:
                await cur.execute("SELECT pg_advisory_xact_lock(hashtextextended('qimpl-slots:' || %s, 0))",
                                  (row["tenant_id"],))
                await cur.execute(
                    "SELECT count(*) AS held FROM runs WHERE tenant_id = %s AND run_id <> %s"
                    " AND state IN ('running', 'awaiting_approval')", (row["tenant_id"], run_id))
                held = await cur.fetchone()
                if held is not None and held["held"] >= slot_limit:
                    if row["dispatch_confirmed_at"] is None:
                        # This worker holds the generation's task: its dispatch is confirmed,
                        # and the reconciler must not dispatch it again every sweep.
                        await cur.execute(
                            "UPDATE runs SET row_version = row_version + 1,"
                            " dispatch_confirmed_at = clock_timestamp()"
                            f" WHERE run_id = %s RETURNING *, {_LEFT}", (run_id,))
                        row = await cur.fetchone()
                        assert row is not None
                    return Claim(row, None)
            await cur.execute(
                """
                UPDATE runs SET state = 'running', row_version = row_version + 1,
                                owner_attempt = %s, owner_task_token = %s, retry_not_before = NULL,
                                started_at = coalesce(started_at, clock_timestamp()),
                                dispatch_confirmed_at = coalesce(dispatch_confirmed_at, clock_timestamp())
                WHERE run_id = %s RETURNING *,
                """ + _LEFT,
                (attempt, task_token, run_id),
            )
            row = await cur.fetchone()
            assert row is not None
            await INSIDE_CLAIM.areach(run_id=run_id, attempt=attempt)
        owner = cls(conn, run_id=run_id, generation=generation, attempt=attempt,
                    row_version=int(row["row_version"]),
                    deadline_left_s=float(row["deadline_left_s"]), live=live, lease_s=lease_s)
        return Claim(row, owner)

    # -- the deadline ------------------------------------------------------------------
    def seconds_left(self) -> float:
        """Seconds until ``deadline_at`` by the database's clock, as measured at the claim."""
        return self._deadline_mono - time.monotonic()

    # -- fenced writes -----------------------------------------------------------------
    def _params(self, **extra: Any) -> dict[str, Any]:
        return {"run_id": self.run_id, "expected": self.row_version, "generation": self.generation,
                "attempt": self.attempt, **extra}

    async def _write(self, sql: str, params: Mapping[str, Any], *, what: str, then: Any = None,
                     dict_rows: bool = False) -> Any:
        """One fenced UPDATE ... RETURNING in its own transaction (``then(cur, row)`` may add
        statements to it); advances this owner's ``row_version``. Raises LostOwnership when
        the fence matched no row, the guard refused or the session was lost; DeadlinePassed
        for the deadline; any other database error (a value it refuses to store, a lock or
        statement timeout) propagates unchanged while the session lives."""
        sent = time.monotonic()
        async with self._refusals(what), self.conn.transaction(), self.conn.cursor(
                row_factory=dict_row if dict_rows else tuple_row) as cur:
            await cur.execute(sql, params)
            got: Any = await cur.fetchone()
            if got is not None and then is not None:
                await then(cur, got)
        if got is None:
            self._refused("fenced")
            raise LostOwnership(f"{what} fenced")
        self.row_version = int(got["row_version"]) if dict_rows else int(got[0])
        self._proved_at = sent
        return got

    async def before_call(self) -> None:
        """Right before a provider or tool call: prove the lease again when the statement
        that last proved it was sent half a lease ago or more (``lease_unproven``), so an
        owner that was paused or starved since (a stopped process; a pause while it waited
        for that statement's answer included) stops instead of calling (R-EXEC-11). One
        read on the lease session, only then; the usual path costs nothing.

        Raises LostOwnership when the run is no longer this owner's (taken over, ended,
        another row version), and psycopg's OperationalError when the session is gone:
        both mean "do not call". Left open: a pause after this returns and before the
        call's request leaves the process (a few hundred microseconds); only a fencing
        token checked by the provider or tool itself closes that."""
        if self._lease_s is None or not lease_unproven(self._proved_at, time.monotonic(), self._lease_s):
            return
        sent = time.monotonic()
        cur = await self.conn.execute(
            "SELECT state, generation, owner_attempt, row_version FROM runs WHERE run_id = %s",
            (self.run_id,))
        row = await cur.fetchone()
        mine = (RunState.RUNNING, self.generation, self.attempt, self.row_version)
        if row is None or tuple(row) != mine:
            self._refused("lease_unproven")
            raise LostOwnership(f"run {self.run_id} is no longer owned by attempt {self.attempt}")
        self._proved_at = sent

    def _refused(self, how: str) -> None:
        """Log a write the database refused (the evidence a stale writer was stopped by the
        fence or the guard, R-EXEC-7): ``owner.write_refused`` with the token it carried."""
        log.warning("write to run %s refused (%s): attempt %s of generation %s at row version %s",
                    self.run_id, how, self.attempt, self.generation, self.row_version,
                    extra={"event": "owner.write_refused", "run_id": self.run_id, "how": how,
                           "attempt": self.attempt, "generation": self.generation,
                           "row_version": self.row_version})

    @contextlib.asynccontextmanager
    async def _refusals(self, what: str) -> AsyncIterator[None]:
        """Around one owner write: a database error becomes what ``_refusal`` says it
        means (logged when it is a refusal), or propagates unchanged."""
        try:
            yield
        except psycopg.Error as exc:
            refused = self._refusal(exc, what)
            if refused is exc:
                raise
            raise refused from exc

    def _refusal(self, exc: psycopg.Error, what: str) -> Exception:
        """What a failed owner write means: DeadlinePassed, LostOwnership (refused by a
        guard, contended, or the session is gone), else ``exc`` itself (the session lives:
        the caller counts this failure, R-EXEC-6, R-EXEC-12)."""
        if exc.sqlstate == DEADLINE_SQLSTATE:
            return DeadlinePassed(f"{what}: deadline passed")
        if exc.sqlstate in GUARD_SQLSTATES or exc.sqlstate == "23505":
            self._refused(f"guard:{exc.sqlstate}")
            return LostOwnership(f"{what} rejected: {exc.sqlstate}")
        if exc.sqlstate in _CONTENDED:
            # Another session holds the row (a cancel, a sweep): contention, bounded by
            # that session's own timeouts, not a refusal of this result.
            return LostOwnership(f"{what}: row busy ({exc.sqlstate})")
        if self.conn.closed or self.conn.broken:
            # The session is gone (idle-in-transaction timeout, termination, connection
            # loss): so is the lease (R-EXEC-11).
            self._refused("session_lost")
            return LostOwnership(f"{what}: session lost ({exc.sqlstate or type(exc).__name__})")
        return exc

    # -- output deltas (the event journal, R-EVENT-1) -----------------------------------
    async def output_delta(self, step: int, delta: str) -> None:
        """Append a piece of step ``step``'s output, as the provider streamed it, to the
        run's event journal (an ``output`` event with ``partial: true``), through
        ``qimpl_append_output``: an owner write fenced by this owner's token. Raises
        LostOwnership when refused (QG013: no longer the owner) and DeadlinePassed after
        the deadline (QG006)."""
        what = f"output of step {step} of run {self.run_id}"
        async with self._refusals(what):
            await self.conn.execute(
                "SELECT qimpl_append_output(%s, %s, %s, %s, %s, %s)",
                (self.run_id, self.generation, self.attempt, self.row_version, step, delta))

    # -- the provider-call record (observed usage, R-Q34-2) ------------------------------
    async def asks(self, step: int) -> int:
        """How many times ``step`` was asked of the provider, by any attempt of any
        generation: the provider-call records of that step (each is written before its
        call, so an attempt that died after the answer still left its ask)."""
        cur = await self.conn.execute(
            "SELECT count(*) FROM provider_calls WHERE run_id = %s AND step = %s", (self.run_id, step))
        got = await cur.fetchone()
        return int(got[0]) if got else 0

    async def call_started(self, step: int) -> int:
        """Record a provider call for ``step`` *before* it is made; returns the record's
        id. The database accepts it only from this owner at its fencing token and before
        the deadline (``provider_calls_guard``). Raises LostOwnership when refused (QG012:
        the call must not be made, R-EXEC-7/11) or DeadlinePassed (QG006, R-EXEC-8)."""
        what = f"provider call {step} of run {self.run_id}"
        sent = time.monotonic()
        async with self._refusals(what):
            cur = await self.conn.execute(
                "INSERT INTO provider_calls (run_id, generation, attempt, step, row_version)"
                " VALUES (%s, %s, %s, %s, %s) RETURNING id",
                (self.run_id, self.generation, self.attempt, step, self.row_version))
            got = await cur.fetchone()
        assert got is not None
        self._proved_at = sent
        return int(got[0])

    async def call_ended(self, call: int, *, status: str, input_tokens: int | None = None,
                         output_tokens: int | None = None, code: str | None = None,
                         retry_after_s: float | None = None) -> None:
        """Settle record ``call`` (``succeeded``, ``failed`` or ``cancelled``) with the
        token counts the provider reported (None: not reported) and, for a failure, its
        safe kind ``code`` and the seconds the provider asked to be left alone
        (``Retry-After``, R-EXEC-6; the database refuses it on any other outcome). Raises
        LostOwnership when refused (no longer the owner, or the record is not this
        attempt's open one)."""
        what = f"provider call record {call} of run {self.run_id}"
        async with self._refusals(what):
            cur = await self.conn.execute(
                "UPDATE provider_calls SET status = %s, outcome_code = %s, input_tokens = %s,"
                " output_tokens = %s, retry_after_s = %s"
                " WHERE id = %s AND status = 'started' AND attempt = %s RETURNING id",
                (status, code, input_tokens, output_tokens, retry_after_s, call, self.attempt))
            got = await cur.fetchone()
        if got is None:
            raise LostOwnership(f"{what}: not this attempt's open record")

    async def checkpoint(self, step: int, *, state: Mapping[str, Any], usage: Mapping[str, Any],
                         answer: str | None = None, pending: Mapping[str, Any] | None = None,
                         tool_calls: list[dict[str, Any]] | None = None,
                         previous: Mapping[str, Any] | None = None) -> None:
        """Checkpoint ``step`` and bump ``row_version`` in one transaction (R-EXEC-3). The
        final step's checkpoint carries the ``answer``, so an attempt that dies between it
        and the final commit is finished without asking the provider again. ``previous``
        is the state of the run's latest checkpoint (None: it has none): the row then
        holds only the delta from it when that is smaller (``qimpl.state_delta``)."""
        delta = diff(previous, state) if previous is not None else None

        async def insert_checkpoint(cur: Any, got: Any) -> None:
            await INSIDE_CHECKPOINT.areach(run_id=self.run_id, step=step, attempt=self.attempt)
            await cur.execute(
                "INSERT INTO run_checkpoints (run_id, step, generation, attempt, row_version,"
                " state_json, state_delta, answer, pending, tool_calls)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (self.run_id, step, self.generation, self.attempt, int(got[0]),
                 Jsonb(dict(state)) if delta is None else None,
                 Jsonb(delta) if delta is not None else None,
                 answer, Jsonb(dict(pending)) if pending is not None else None,
                 Jsonb(tool_calls) if tool_calls else None),
            )

        await self._write(
            "UPDATE runs SET row_version = row_version + 1, checkpoint_step = %(step)s,"
            f" usage = %(usage)s {_FENCE} RETURNING row_version",
            self._params(step=step, usage=Jsonb(dict(usage))),
            what=f"checkpoint {step} of run {self.run_id}", then=insert_checkpoint)

    async def journal(self, invocation: Mapping[str, Any], *, status: str,
                      result: Mapping[str, Any] | None = None,
                      usage: Mapping[str, Any] | None = None) -> None:
        """Insert a tool invocation (R-TOOL-1) in one fenced transaction: ``intent`` before
        its side effect, ``requested`` for a developer-hosted call, or already settled
        (``rejected``, ``denied``: nothing ran). ``invocation`` carries ``call_id, step,
        position, tool, kind, id, arguments, digest, approval_id``. The journal's own
        trigger refuses a row from anyone but the owner at this row version (QG009)."""
        settled = status not in ("intent", "requested")

        async def insert(cur: Any, got: Any) -> None:
            await cur.execute(
                "INSERT INTO tool_invocations (run_id, call_id, tenant_id, generation, step, position,"
                " tool, kind, provider_call_id, arguments, arguments_digest, approval_id, status,"
                " result, intent_attempt, intent_row_version, outcome_row_version, outcome_at,"
                " settled_by) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,"
                " %s, %s, CASE WHEN %s THEN clock_timestamp() END, %s)",
                (self.run_id, invocation["call_id"], got[1], self.generation, invocation["step"],
                 invocation["position"], invocation["tool"], invocation["kind"], invocation.get("id"),
                 Jsonb(dict(invocation["arguments"])), invocation["digest"],
                 invocation.get("approval_id"), status,
                 Jsonb(dict(result)) if result is not None else None, self.attempt, int(got[0]),
                 int(got[0]) if settled else None, settled, "worker" if settled else None))

        await self._write(
            "UPDATE runs SET row_version = row_version + 1, usage = coalesce(%(usage)s, usage)"
            f" {_FENCE} RETURNING row_version, tenant_id",
            self._params(usage=Jsonb(dict(usage)) if usage is not None else None),
            what=f"{status} of tool call {invocation['call_id']} of run {self.run_id}", then=insert)

    async def tool_outcome(self, call_id: str, *, status: str, result: Mapping[str, Any]) -> None:
        """Settle this attempt's own intent (``succeeded``/``failed``) in one fenced
        transaction (R-TOOL-1). LostOwnership when fenced or when the intent is not this
        attempt's unsettled one."""

        async def settle(cur: Any, got: Any) -> None:
            await cur.execute(
                "UPDATE tool_invocations SET status = %s, result = %s, outcome_row_version = %s,"
                " outcome_at = clock_timestamp(), settled_by = 'worker'"
                " WHERE run_id = %s AND call_id = %s AND status = 'intent' AND intent_attempt = %s",
                (status, Jsonb(dict(result)), int(got[0]), self.run_id, call_id, self.attempt))
            if cur.rowcount != 1:
                raise LostOwnership(f"outcome of tool call {call_id}: no intent of attempt {self.attempt}")

        await self._write(f"UPDATE runs SET row_version = row_version + 1 {_FENCE} RETURNING row_version",
                          self._params(), what=f"outcome of tool call {call_id} of run {self.run_id}",
                          then=settle)

    async def last_failure(self) -> tuple[float, float | None] | None:
        """The run's last failed provider call: seconds since it ended, by the database's
        clock, and the seconds its provider asked to be left alone (``Retry-After``;
        None: it did not say); None when the run has no failed call (R-EXEC-6)."""
        async with self.conn.cursor() as cur:
            await cur.execute("SELECT extract(epoch FROM clock_timestamp() - ended_at)::float8, retry_after_s"
                              " FROM provider_calls WHERE run_id = %s AND status = 'failed'"
                              " ORDER BY ended_at DESC LIMIT 1", (self.run_id,))
            got = await cur.fetchone()
        if got is None or got[0] is None:
            return None
        return float(got[0]), None if got[1] is None else float(got[1])

    async def count_failure(self, code: str, *, retry_in_s: float | None = None) -> int:
        """Count one failed step durably (R-EXEC-6) with its safe kind ``code`` (a
        ``qimpl.errors`` kind, never provider text: the run's ``last_failure_code``, shown
        on the run record and in its ``failure`` event); returns the run's failures so far.

        The same write takes this attempt's task token off the run: the attempt ends now
        and reports its failure to Temporal with the retry's delay itself, so a watcher
        that sees the lease free in between has no token to fail it by, which would race
        that report and could lose the delay (R-EXEC-13; one whose report is lost, the
        worker dying right after this write, is failed by the watcher as a started attempt
        that never claims: ``qimpl.takeover``).

        ``retry_in_s``: the retry's delay, seconds, stored as ``retry_not_before`` (the
        database's clock): until then the run is no orphan for the watcher, which would
        otherwise take every run in backoff for a lost one (issue 55); None: none stored."""
        got = await self._write(
            f"UPDATE runs SET row_version = row_version + 1, provider_failures = provider_failures + 1,"
            f" last_failure_code = %(failure_code)s, owner_task_token = NULL,"
            f" retry_not_before = clock_timestamp() + make_interval(secs => %(retry_in_s)s) {_FENCE}"
            f" RETURNING row_version, provider_failures",
            self._params(failure_code=code, retry_in_s=retry_in_s), what=f"failure count of run {self.run_id}")
        return int(got[1])

    async def _end(self, state: RunState, *, result: Mapping[str, Any] | None = None,
                   error_code: str | None = None, error_message: str | None = None,
                   usage: Mapping[str, Any] | None = None, extra_where: str = "") -> Row:
        row: Row = await self._write(
            "UPDATE runs SET state = %(state)s::varchar, row_version = row_version + 1,"
            " result_json = coalesce(%(result)s, result_json), error_code = %(code)s,"
            " error_message = %(message)s, usage = coalesce(%(usage)s, usage),"
            f" completed_at = CASE WHEN %(state)s::varchar IN {_TERMINAL_SQL}"
            f" THEN clock_timestamp() END {_FENCE}{extra_where} RETURNING {_SMALL}",
            self._params(state=str(state), result=Jsonb(dict(result)) if result is not None else None,
                         code=error_code, message=error_message,
                         usage=Jsonb(dict(usage)) if usage is not None else None),
            what=f"{state} of run {self.run_id}", dict_rows=True)
        return row

    async def park(self, pending: Mapping[str, Any], *, usage: Mapping[str, Any],
                   error_code: str | None = None, error_message: str | None = None) -> Row:
        """``awaiting_approval`` (``pending.kind == "approval"``) or ``awaiting_input`` with
        ``result_json.pending_*`` set (R-READ-2); ``error_code``/``error_message`` say why
        a run is parked when it is not a question (``side_effect_outcome_unknown``, R-TOOL-3)."""
        approval = pending.get("kind") == "approval"
        return await self._end(
            RunState.AWAITING_APPROVAL if approval else RunState.AWAITING_INPUT,
            result={"pending_approval" if approval else "pending_input": dict(pending)}, usage=usage,
            error_code=error_code, error_message=error_message)

    async def complete(self, answer: str, *, usage: Mapping[str, Any]) -> Row:
        """``completed`` with ``result_json.answer`` (refused after the deadline, QG006)."""
        return await self._end(RunState.COMPLETED, result={"answer": answer}, usage=usage)

    async def fail(self, error_code: str, error_message: str) -> Row:
        """``failed`` with a safe code and a fixed message (R-EXEC-6)."""
        return await self._end(RunState.FAILED, error_code=error_code, error_message=error_message)

    async def expire(self) -> Row:
        """``expired`` (R-EXEC-8), written only once the database's clock has reached
        ``deadline_at`` (R-EXEC-12): if this owner's count-down ran out a little before the
        database's, it waits for the database, never writes early."""
        while True:
            try:
                return await self._end(
                    RunState.EXPIRED, error_code="deadline_exceeded",
                    error_message="the run's deadline passed",
                    extra_where=" AND deadline_at <= clock_timestamp()")
            except LostOwnership:
                cur = await self.conn.execute(
                    "SELECT extract(epoch FROM deadline_at - clock_timestamp())::float8, row_version,"
                    " state FROM runs WHERE run_id = %s", (self.run_id,))
                found = await cur.fetchone()
                if found is None or int(found[1]) != self.row_version or found[2] != RunState.RUNNING:
                    raise  # another writer changed the run: really lost
                await asyncio.sleep(min(max(float(found[0]), _EXPIRE_RETRY_S), 1.0))
