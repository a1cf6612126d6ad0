"""The run repository: every SQL statement that reads or writes a run.

Each write is one transaction whose UPDATE passes the transition guard (R-STATE-1).
The activity owner's fenced writes live with its fencing token in
``qimpl.db.owner`` (R-EXEC-7). A write the guard refuses because the run's
deadline passed (SQLSTATE ``QG006``) raises ``DeadlinePassed``: the caller expires the
run (``expire_if_overdue``) instead of retrying (R-EXEC-8).

Why one module of about 460 lines: it holds every write of a run that no owner makes
(creation with its idempotency record, dispatch confirmation, cancel, resume, approval,
ending an unowned run), each guarded only by the transition guard and its own ``WHERE``;
one file is the one place to audit what the API and the reconciler may write, as
``qimpl.db.owner`` is for owners.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from qimpl.crashpoints import declare
from qimpl.errors import DeadlinePassed
from qimpl.lifecycle import TERMINAL, RunState
from qimpl.state_delta import fold

__all__ = [
    "DEADLINE_SQLSTATE",
    "EXPIRE_SET",
    "GUARD_SQLSTATES",
    "UNSETTLED_SQLSTATE",
    "Row",
    "cancel",
    "complete_idempotency",
    "confirm_dispatch",
    "decide_approval",
    "end_unowned",
    "expire_if_overdue",
    "get_run",
    "insert_run",
    "insert_run_or_none",
    "latest_checkpoint",
    "lookup_idempotency",
    "outcome",
    "prune_idempotency",
    "prune_sweeps",
    "resume",
    "resume_or_none",
    "workspace_grant",
]

Row = dict[str, Any]
AConn = psycopg.AsyncConnection[Any]

#: SQLSTATEs raised by the transition guard (see the migrations): terminal run, illegal
#: transition, row_version, immutable column, deadline passed, expired early, attempt
#: going back, the owner fences of the tool journal, the provider-call record and the
#: output deltas, a run inserted other than new (QG014) and a checkpoint from no owner
#: (QG015).
GUARD_SQLSTATES = frozenset({"QG001", "QG002", "QG003", "QG004", "QG006", "QG007", "QG008", "QG009",
                             "QG010", "QG011", "QG012", "QG013", "QG014", "QG015"})
#: The SET clause of every expiry (R-EXEC-8): the owner's claim, a refused writer, the
#: reconciler. The owner's own expiry writes the same code and message (SAFE_MESSAGES).
EXPIRE_SET = ("state = 'expired', row_version = row_version + 1, error_code = 'deadline_exceeded',"
              " error_message = 'the run''s deadline passed', completed_at = clock_timestamp()")
#: The guard's refusal of a resume while a tool call is unsettled (R-RESUME-3, R-TOOL-4).
UNSETTLED_SQLSTATE = "QG010"
#: The guard's refusal of a write after ``deadline_at`` by the database's clock (R-EXEC-8).
DEADLINE_SQLSTATE = "QG006"

_TERMINAL_SQL = "('completed', 'failed', 'expired', 'cancelled')"


@contextlib.contextmanager
def _deadline_refusal() -> Iterator[None]:
    """Map the guard's deadline refusal (QG006) to DeadlinePassed."""
    try:
        yield
    except psycopg.Error as exc:
        if exc.sqlstate == DEADLINE_SQLSTATE:
            raise DeadlinePassed(f"deadline passed: {exc.sqlstate}") from exc
        raise


async def workspace_grant(conn: AConn, *, tenant_id: str, principal_id: str,
                          workspace_id: str) -> str | None:
    """The principal's live (unrevoked) grant token for ``workspace_id``, or None. ``conn``
    must be scoped to ``tenant_id`` (row-level security shows no other tenant's grants).
    The token is a credential: callers hand it to the provider only (R-READ-3)."""
    cur = await conn.execute(
        "SELECT grant_token FROM workspace_grants WHERE tenant_id = %s AND principal_id = %s"
        " AND workspace_id = %s AND revoked_at IS NULL", (tenant_id, principal_id, workspace_id))
    found = await cur.fetchone()
    return str(found[0]) if found else None


async def get_run(conn: AConn, run_id: str, *, tenant_id: str | None = None) -> Row | None:
    """The run row, or None (also when it belongs to another tenant)."""
    async with conn.cursor(row_factory=dict_row) as cur:
        if tenant_id is None:
            await cur.execute("SELECT * FROM runs WHERE run_id = %s", (run_id,))
        else:
            await cur.execute(
                "SELECT * FROM runs WHERE run_id = %s AND tenant_id = %s", (run_id, tenant_id)
            )
        return await cur.fetchone()


async def lookup_idempotency(
    conn: AConn, *, tenant_id: str, principal_id: str, route: str, key: str
) -> Row | None:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            "SELECT *, extract(epoch FROM clock_timestamp() - created_at)::float8 AS age_s"
            " FROM idempotency_records WHERE tenant_id = %s AND principal_id = %s"
            " AND route = %s AND key = %s",
            (tenant_id, principal_id, route, key),
        )
        return await cur.fetchone()


async def complete_idempotency(conn: AConn, *, tenant_id: str, principal_id: str, route: str,
                               key: str) -> None:
    """Mark the first request with this key answered: later ones replay, never 409."""
    await conn.execute(
        "UPDATE idempotency_records SET completed_at = clock_timestamp() WHERE tenant_id = %s"
        " AND principal_id = %s AND route = %s AND key = %s AND completed_at IS NULL",
        (tenant_id, principal_id, route, key),
    )


async def _prune(conn: AConn, table: str, stamp: str, tenant_id: str, retention_s: int, limit: int) -> int:
    """Delete up to ``limit`` of the tenant's ``table`` rows whose ``stamp`` is more than
    ``retention_s`` seconds old by the database's clock; returns how many."""
    cur = await conn.execute(
        sql.SQL("DELETE FROM {table} WHERE ctid IN (SELECT ctid FROM {table} WHERE tenant_id = %s"
                " AND {stamp} < clock_timestamp() - make_interval(secs => %s) LIMIT %s)").format(
            table=sql.Identifier(table), stamp=sql.Identifier(stamp)),
        (tenant_id, retention_s, limit),
    )
    return cur.rowcount


async def prune_idempotency(conn: AConn, tenant_id: str, *, retention_s: int, limit: int = 1000) -> int:
    """Delete up to ``limit`` of the tenant's idempotency records older than the retention."""
    return await _prune(conn, "idempotency_records", "created_at", tenant_id, retention_s, limit)


async def prune_sweeps(conn: AConn, tenant_id: str, *, retention_s: int, limit: int = 1000) -> int:
    """Delete up to ``limit`` of the tenant's ``reconciler_sweeps`` rows that finished more
    than ``retention_s`` seconds ago by the database's clock; returns how many (R-OPS-3:
    one row per sweep would otherwise grow without end)."""
    return await _prune(conn, "reconciler_sweeps", "finished_at", tenant_id, retention_s, limit)


async def insert_run(
    conn: AConn,
    *,
    run_id: str,
    tenant_id: str,
    principal_id: str,
    agent_id: str,
    prompt: str,
    request: Mapping[str, Any],
    stream_key: str,
    deadline_s: int,
    workflow_id: str | None,
    route: str,
    idempotency_key: str | None,
    fingerprint: str,
    lifecycle_version: int = 2,
    workspace_id: str = "default",
    grant_token: str | None = None,
) -> Row | None:
    """Commit the run as ``accepted`` with its idempotency record and dispatch identity in
    one transaction (R-CREATE-4). Returns the row, or None when the key already exists
    (nothing is written then). A legacy run (``lifecycle_version=1``) may have no key."""
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            """
            INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt,
                              request_json, stream_key, workflow_id, accepted_at, deadline_at,
                              lifecycle_version, durability, workspace_id, grant_token,
                              dispatch_requested_at)
            SELECT %(run_id)s, %(tenant)s, %(principal)s, %(agent)s, 'accepted', %(prompt)s,
                   %(request)s, %(stream_key)s, %(workflow_id)s, t.now,
                   t.now + make_interval(secs => %(deadline_s)s), %(lifecycle)s,
                   CASE WHEN %(lifecycle)s = 2 THEN 'temporal' ELSE 'legacy' END,
                   %(workspace)s, %(grant)s, t.now
            FROM (SELECT clock_timestamp() AS now) t
            WHERE NOT EXISTS (SELECT 1 FROM idempotency_records
                              WHERE tenant_id = %(tenant)s AND principal_id = %(principal)s
                                AND route = %(route)s AND key = %(key)s)
            RETURNING *
            """,
            {
                "run_id": run_id, "tenant": tenant_id, "principal": principal_id,
                "agent": agent_id, "prompt": prompt, "request": Jsonb(dict(request)),
                "stream_key": stream_key, "workflow_id": workflow_id, "deadline_s": deadline_s,
                "route": route, "key": idempotency_key, "lifecycle": lifecycle_version,
                "workspace": workspace_id, "grant": grant_token,
            },
        )
        row = await cur.fetchone()
        if row is None:
            return None
        if idempotency_key is None:
            return row
        await cur.execute(
            """
            INSERT INTO idempotency_records (tenant_id, principal_id, route, key, fingerprint, run_id)
            VALUES (%s, %s, %s, %s, %s, %s)
            ON CONFLICT DO NOTHING RETURNING run_id
            """,
            (tenant_id, principal_id, route, idempotency_key, fingerprint, run_id),
        )
        if await cur.fetchone() is None:
            # A concurrent request with the same key committed first: undo our run.
            raise _KeyTaken()
        return row


class _KeyTaken(Exception):
    pass


async def insert_run_or_none(conn: AConn, **kwargs: Any) -> Row | None:
    """``insert_run`` that maps a lost same-key race to None (the caller replays)."""
    try:
        return await insert_run(conn, **kwargs)
    except _KeyTaken:
        return None


async def confirm_dispatch(conn: AConn, run_id: str, generation: int) -> Row | None:
    """Record that Temporal accepted generation ``generation`` (R-CREATE-5):
    ``accepted -> queued``, or ``queued -> queued`` for a generation queued by an approval.
    Names its generation, so a slow confirmation of an older one never marks a newer,
    never-started generation ``queued``. Returns the row after the change, or None when
    nothing was left to confirm (another generation, already confirmed, left ``accepted``,
    or past its deadline: see ``expire_if_overdue``)."""
    try:
        with _deadline_refusal():
            async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(
                    """
                    UPDATE runs SET state = 'queued', row_version = row_version + 1,
                                    dispatch_confirmed_at = clock_timestamp()
                    WHERE run_id = %s AND generation = %s AND state IN ('accepted', 'queued')
                      AND dispatch_confirmed_at IS NULL AND deadline_at > clock_timestamp()
                    RETURNING *
                    """,
                    (run_id, generation),
                )
                return await cur.fetchone()
    except DeadlinePassed:  # the deadline passed between the predicate and the guard
        return None


async def expire_if_overdue(conn: AConn, run_id: str) -> Row | None:
    """Expire ``run_id`` if it is live and its deadline has passed by the database's clock
    (R-EXEC-8); returns the expired row, or None when there was nothing to expire. Used
    by writers whose own write the guard refused for the deadline."""
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            f"UPDATE runs SET {EXPIRE_SET} WHERE run_id = %s AND state NOT IN {_TERMINAL_SQL}"
            " AND deadline_at <= clock_timestamp() RETURNING *",
            (run_id,),
        )
        return await cur.fetchone()


async def latest_checkpoint(conn: AConn, run_id: str) -> Row | None:
    """The run's latest checkpoint row, its ``state`` the whole state at that step (folded
    from the last whole one through the deltas after it, ``qimpl.state_delta``); None
    when the run has none. Raises ValueError on a broken delta chain."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            "SELECT * FROM run_checkpoints WHERE run_id = %s AND step >= COALESCE("
            " (SELECT max(step) FROM run_checkpoints WHERE run_id = %s AND state_json IS NOT NULL), 1)"
            " ORDER BY step", (run_id, run_id))
        rows = await cur.fetchall()
    if not rows:
        return None
    latest = dict(rows[-1])
    latest["state"] = fold((r["state_json"], r["state_delta"]) for r in rows)
    return latest


async def end_unowned(conn: AConn, run_id: str, *, generation: int, state: RunState,
                      error_code: str, error_message: str) -> Row | None:
    """End a live run of ``generation`` as ``failed`` or ``expired`` when no attempt owns it
    any more (retry exhaustion, R-EXEC-6; deadline, R-EXEC-8; a vanished workflow,
    R-OPS-8). Returns the row, or None when the run was already terminal, parked or
    re-dispatched — or, for ``expired``, when the database's clock has not yet reached
    ``deadline_at`` (R-EXEC-12)."""
    if state not in (RunState.FAILED, RunState.EXPIRED):
        raise ValueError(f"end_unowned cannot set {state}")
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            """
            UPDATE runs SET state = %s, row_version = row_version + 1,
                            error_code = %s, error_message = %s, completed_at = clock_timestamp()
            WHERE run_id = %s AND generation = %s AND state IN ('accepted', 'queued', 'running')
              AND (%s::varchar <> 'expired' OR deadline_at <= clock_timestamp())
            RETURNING *
            """,
            (str(state), error_code, error_message, run_id, generation, str(state)),
        )
        return await cur.fetchone()


CANCEL_LOCKED = declare("api.cancel.after_lock", "a cancel holds the run's row lock, nothing written yet")


async def cancel(conn: AConn, run_id: str) -> tuple[bool, Row]:
    """Persist cancellation first (R-CANCEL-1). Returns (cancelled, row): True when the run
    is now — or already was — ``cancelled``; False for ``completed``/``failed``/``expired``.

    The row lock serialises with the owner's compare-and-set: whichever commits first wins,
    and the other sees a changed ``row_version`` (the owner) or a terminal state (here).

    A version-2 run whose deadline has passed by the database's clock is not cancelled
    but ``expired`` (R-EXEC-8: the deadline ended it first, whether or not the reconciler
    had swept it yet): returns (False, the expired row).
    """
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute("SELECT *, deadline_at <= clock_timestamp() AS overdue FROM runs"
                          " WHERE run_id = %s FOR UPDATE", (run_id,))
        row = await cur.fetchone()
        if row is None:
            raise LookupError(run_id)
        # The harness holds a cancel here, the row locked, while the owner's final commit
        # waits on it (qualify's cancel-vs-completion).
        await CANCEL_LOCKED.areach(run_id=run_id)
        overdue = bool(row.pop("overdue"))
        if row["state"] == RunState.CANCELLED:
            return True, row
        if RunState(row["state"]) in TERMINAL:
            return False, row
        if overdue and int(row["lifecycle_version"]) == 2:
            await cur.execute(f"UPDATE runs SET {EXPIRE_SET} WHERE run_id = %s RETURNING *", (run_id,))
            expired = await cur.fetchone()
            assert expired is not None
            return False, expired
        await cur.execute(
            """
            UPDATE runs SET state = 'cancelled', row_version = row_version + 1,
                            error_code = 'cancelled', error_message = 'cancelled by the client',
                            completed_at = clock_timestamp()
            WHERE run_id = %s RETURNING *
            """,
            (run_id,),
        )
        cancelled = await cur.fetchone()
        assert cancelled is not None
        return True, cancelled


async def resume(conn: AConn, run_id: str, *, expected_row_version: int, additional_prompt: str | None,
                 route: str, tenant_id: str, principal_id: str, key: str, fingerprint: str) -> Row | None:
    """``awaiting_input -> accepted`` with the next generation, as a compare-and-set, and its
    idempotency record, in one transaction (R-RESUME-1). ``deadline_at`` is untouched (the
    guard forbids changing it). Returns the row, or None when another writer won. Raises
    DeadlinePassed when the guard refused it: the deadline passed by the database's clock
    (R-EXEC-8); nothing is written then."""
    with _deadline_refusal():
        return await _resume(conn, run_id, expected_row_version=expected_row_version,
                             additional_prompt=additional_prompt, route=route, tenant_id=tenant_id,
                             principal_id=principal_id, key=key, fingerprint=fingerprint)


async def _resume(conn: AConn, run_id: str, *, expected_row_version: int, additional_prompt: str | None,
                  route: str, tenant_id: str, principal_id: str, key: str, fingerprint: str) -> Row | None:
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            """
            UPDATE runs SET state = 'accepted', row_version = row_version + 1,
                   generation = generation + 1, owner_attempt = NULL, dispatch_confirmed_at = NULL,
                   dispatch_requested_at = clock_timestamp(),
                   workflow_id = 'agent-run-' || run_id::text || '-g' || (generation + 1),
                   result_json = NULL, error_code = NULL, error_message = NULL,
                   request_json = CASE WHEN %s::text IS NULL THEN request_json
                       ELSE jsonb_set(request_json, '{inputs}',
                           coalesce(request_json -> 'inputs', '[]'::jsonb) || to_jsonb(%s::text)) END
            WHERE run_id = %s AND state = 'awaiting_input' AND row_version = %s
            RETURNING *
            """,
            (additional_prompt, additional_prompt, run_id, expected_row_version),
        )
        row = await cur.fetchone()
        if row is None:
            return None
        await cur.execute(
            "INSERT INTO idempotency_records (tenant_id, principal_id, route, key, fingerprint, run_id)"
            " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING run_id",
            (tenant_id, principal_id, route, key, fingerprint, run_id),
        )
        if await cur.fetchone() is None:
            raise _KeyTaken()
        return row


async def resume_or_none(conn: AConn, run_id: str, **kwargs: Any) -> Row | None:
    """``resume`` that maps a lost same-key race to None."""
    try:
        return await resume(conn, run_id, **kwargs)
    except _KeyTaken:
        return None


DECISION_LOCKED = declare("api.approval.after_lock",
                          "a decision holds the run's row lock, nothing read or decided yet")


async def decide_approval(conn: AConn, run_id: str, *, approval_id: str, action_version: str,
                          approved: bool, tenant_id: str, principal_id: str) -> tuple[str, Row]:
    """Decide a pending approval (R-APPROVAL-1) in the caller's transaction. Returns
    (outcome, row): ``decided`` (now ``queued`` in the next generation, to be dispatched),
    ``repeated`` (the same decision again: nothing changes), or an error code:
    ``approval_conflict`` (the opposite decision), ``action_version_mismatch`` (stale or
    unknown version: nothing runs), ``approval_not_found``, ``run_terminal``,
    ``approval_not_pending``. Raises DeadlinePassed when the deadline passed by the
    database's clock (the caller's transaction must then roll back)."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute("SELECT * FROM runs WHERE run_id = %s FOR UPDATE", (run_id,))
        row = await cur.fetchone()
        if row is None:
            raise LookupError(run_id)
        # The harness holds one decision here, the row locked, so that others wait on it
        # (qualify's approval-races).
        await DECISION_LOCKED.areach(run_id=run_id, approved=approved)
        await cur.execute("SELECT * FROM approval_decisions WHERE run_id = %s AND approval_id = %s",
                          (run_id, approval_id))
        earlier = await cur.fetchone()
        if earlier is not None:
            same = earlier["approved"] == approved and earlier["action_version"] == action_version
            return ("repeated" if same else "approval_conflict"), row
        if RunState(row["state"]) in TERMINAL:
            return "run_terminal", row
        pending = (row["result_json"] or {}).get("pending_approval") if row["state"] == RunState.AWAITING_APPROVAL else None
        if pending is None:
            return "approval_not_pending", row
        if pending.get("approval_id") != approval_id:
            return "approval_not_found", row
        if pending.get("action_version") != action_version:
            return "action_version_mismatch", row
        await cur.execute(
            "INSERT INTO approval_decisions (run_id, approval_id, tenant_id, principal_id,"
            " action_version, approved) VALUES (%s, %s, %s, %s, %s, %s)",
            (run_id, approval_id, tenant_id, principal_id, action_version, approved))
        decision = {"approval_id": approval_id, "approved": approved, "tool": pending.get("tool"),
                    "arguments": pending.get("arguments"), "action_version": action_version,
                    # The journaled call the approval was parked for, if any: it serves that one.
                    "call_id": pending.get("call_id")}
        with _deadline_refusal():
            await cur.execute(
                """
                UPDATE runs SET state = 'queued', row_version = row_version + 1,
                       generation = generation + 1, owner_attempt = NULL, dispatch_confirmed_at = NULL,
                       dispatch_requested_at = clock_timestamp(),
                       workflow_id = 'agent-run-' || run_id::text || '-g' || (generation + 1),
                       result_json = jsonb_build_object('last_decision', %s::jsonb),
                       request_json = jsonb_set(request_json, '{decisions}',
                           coalesce(request_json -> 'decisions', '[]'::jsonb) || %s::jsonb)
                WHERE run_id = %s RETURNING *
                """,
                (Jsonb(decision), Jsonb([decision]), run_id),
            )
        updated = await cur.fetchone()
        assert updated is not None
        return "decided", updated


def outcome(row: Row) -> dict[str, Any]:
    """The saved outcome of a run as the activity and workflow return it: a small status,
    never ``result_json`` (an answer of megabytes must not make Temporal refuse the
    activity's completion and retry it forever). JSON-safe."""
    return json.loads(
        json.dumps(
            {
                "run_id": str(row["run_id"]),
                "state": row["state"],
                "row_version": row["row_version"],
                "generation": row["generation"],
                "error_code": row["error_code"],
            },
            default=str,
        )
    )
