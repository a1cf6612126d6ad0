"""The run repository: every SQL statement that reads or writes a run.

Each write is one transaction whose UPDATE passes the transition guard (R-STATE-1).
Owner writes are compare-and-set on ``row_version`` *and* the fencing token
``(generation, owner_attempt)``; a write that matches no row, or that the guard
rejects, raises ``LostOwnership`` (R-EXEC-7).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import Jsonb

from qimpl.errors import LostOwnership
from qimpl.lifecycle import TERMINAL, RunState

__all__ = [
    "GUARD_SQLSTATES",
    "Row",
    "cancel",
    "claim_for_attempt",
    "commit_checkpoint",
    "complete_idempotency",
    "confirm_dispatch",
    "decide_approval",
    "end_unowned",
    "finish",
    "get_run",
    "insert_run",
    "insert_run_or_none",
    "latest_checkpoint",
    "lookup_idempotency",
    "outcome",
    "prune_idempotency",
    "record_provider_failure",
    "resume",
    "resume_or_none",
]

Row = dict[str, Any]
AConn = psycopg.AsyncConnection[Any]

#: SQLSTATEs raised by the transition guard (see the migration).
GUARD_SQLSTATES = frozenset({"QG001", "QG002", "QG003", "QG004"})

_TERMINAL_SQL = "('completed', 'failed', 'expired', 'cancelled')"


def _is_guard(exc: psycopg.Error) -> bool:
    return exc.sqlstate in GUARD_SQLSTATES


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


async def prune_idempotency(conn: AConn, tenant_id: str, *, retention_s: int, limit: int = 1000) -> int:
    """Delete up to ``limit`` of the tenant's idempotency records older than the retention."""
    cur = await conn.execute(
        "DELETE FROM idempotency_records WHERE ctid IN (SELECT ctid FROM idempotency_records"
        " WHERE tenant_id = %s AND created_at < clock_timestamp() - make_interval(secs => %s)"
        " LIMIT %s)",
        (tenant_id, retention_s, limit),
    )
    return cur.rowcount


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
                              lifecycle_version, durability, workspace_id, grant_token)
            SELECT %(run_id)s, %(tenant)s, %(principal)s, %(agent)s, 'accepted', %(prompt)s,
                   %(request)s, %(stream_key)s, %(workflow_id)s, t.now,
                   t.now + make_interval(secs => %(deadline_s)s), %(lifecycle)s,
                   CASE WHEN %(lifecycle)s = 2 THEN 'temporal' ELSE 'legacy' END,
                   %(workspace)s, %(grant)s
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


async def confirm_dispatch(conn: AConn, run_id: str) -> Row | None:
    """``accepted -> queued`` once Temporal accepted the workflow (R-CREATE-5). Returns the
    row after the change, or None when the run had already left ``accepted``."""
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            """
            UPDATE runs SET state = 'queued', row_version = row_version + 1,
                            dispatch_confirmed_at = clock_timestamp()
            WHERE run_id = %s AND state = 'accepted' RETURNING *
            """,
            (run_id,),
        )
        return await cur.fetchone()


async def claim_for_attempt(conn: AConn, run_id: str, *, generation: int, attempt: int,
                            slot_limit: int = 0) -> Row:
    """Make this activity attempt the owner: ``accepted -> queued -> running`` or a takeover
    ``running -> running`` with ``owner_attempt = attempt``. Call only while holding the
    run's advisory lock. Returns the row; a terminal or foreign-generation run is returned
    unchanged for the caller to inspect (R-EXEC-5).

    Tenant slots (R-EXEC-9): with ``slot_limit > 0`` a ``queued`` run starts only while
    fewer than ``slot_limit`` of its tenant's runs are ``running`` or ``awaiting_approval``;
    otherwise it is returned still ``queued``. A slot is the run's state itself, so it is
    released by every exit path — a SIGKILLed owner's run keeps its one slot until its
    retried attempt (which never waits for a slot) finishes it. Claims of one tenant are
    serialised by a transaction-level advisory lock so that two cannot both see room."""
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute("SELECT * FROM runs WHERE run_id = %s FOR UPDATE", (run_id,))
        row = await cur.fetchone()
        if row is None:
            raise LostOwnership(f"run {run_id} does not exist")
        if RunState(row["state"]) in TERMINAL or row["generation"] != generation:
            return row
        if row["state"] == RunState.ACCEPTED:
            await cur.execute(
                "UPDATE runs SET state = 'queued', row_version = row_version + 1,"
                " dispatch_confirmed_at = coalesce(dispatch_confirmed_at, clock_timestamp())"
                " WHERE run_id = %s RETURNING *",
                (run_id,),
            )
            row = await cur.fetchone()
            assert row is not None
        if row["state"] not in (RunState.QUEUED, RunState.RUNNING):
            return row
        if row["state"] == RunState.QUEUED and slot_limit > 0:
            await cur.execute("SELECT pg_advisory_xact_lock(hashtextextended('qimpl-slots:' || %s, 0))",
                              (row["tenant_id"],))
            await cur.execute(
                "SELECT count(*) AS held FROM runs WHERE tenant_id = %s AND run_id <> %s"
                " AND state IN ('running', 'awaiting_approval')", (row["tenant_id"], run_id))
            held = await cur.fetchone()
            if held is not None and held["held"] >= slot_limit:
                return row
        await cur.execute(
            """
            UPDATE runs SET state = 'running', row_version = row_version + 1,
                            owner_attempt = %s,
                            started_at = coalesce(started_at, clock_timestamp()),
                            dispatch_confirmed_at = coalesce(dispatch_confirmed_at, clock_timestamp())
            WHERE run_id = %s RETURNING *
            """,
            (attempt, run_id),
        )
        row = await cur.fetchone()
        assert row is not None
        return row


async def latest_checkpoint(conn: AConn, run_id: str) -> Row | None:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            "SELECT * FROM run_checkpoints WHERE run_id = %s ORDER BY step DESC LIMIT 1", (run_id,)
        )
        return await cur.fetchone()


#: The owner's fencing condition: expected row_version, its (generation, attempt) token,
#: a live run, and — for progress, not for expiry or failure — a deadline not yet passed,
#: judged by the database's clock (R-EXEC-7, R-EXEC-8).
_FENCE = (
    "WHERE run_id = %(run_id)s AND row_version = %(expected)s AND generation = %(generation)s"
    " AND owner_attempt = %(attempt)s AND state = 'running'"
)
_BEFORE_DEADLINE = " AND deadline_at > clock_timestamp()"


async def _fenced_update(conn: AConn, sql: str, params: Mapping[str, Any], *, what: str,
                         then: Any = None, dict_rows: bool = False) -> Any:
    """One owner UPDATE ... RETURNING in its own transaction (``then(cur, row)`` may add
    statements to it). Returns the row; raises LostOwnership when the fence matched no row
    or the transition guard refused the write (R-EXEC-7)."""
    try:
        async with conn.transaction(), conn.cursor(row_factory=dict_row if dict_rows else tuple_row) as cur:
            await cur.execute(sql, params)
            got = await cur.fetchone()
            if got is not None and then is not None:
                await then(cur, got)
    except psycopg.Error as exc:
        if _is_guard(exc) or exc.sqlstate == "23505":
            raise LostOwnership(f"{what} rejected: {exc.sqlstate}") from exc
        raise
    if got is None:
        raise LostOwnership(f"{what} fenced")
    return got


async def commit_checkpoint(
    conn: AConn,
    run_id: str,
    *,
    expected_row_version: int,
    generation: int,
    attempt: int,
    step: int,
    state: Mapping[str, Any],
    usage: Mapping[str, Any],
    answer: str | None = None,
    pending: Mapping[str, Any] | None = None,
) -> int:
    """Checkpoint ``step`` and bump ``row_version`` in one transaction (R-EXEC-3); returns the
    new ``row_version``. The final step's checkpoint carries the ``answer``, so an attempt
    that dies between it and the final commit is finished without asking the provider. Raises LostOwnership when fenced (R-EXEC-7)."""
    params = {
        "run_id": run_id, "expected": expected_row_version, "generation": generation,
        "attempt": attempt, "step": step, "usage": Jsonb(dict(usage)),
    }

    async def insert_checkpoint(cur: Any, got: Any) -> None:
        await cur.execute(
            "INSERT INTO run_checkpoints (run_id, step, generation, attempt, row_version,"
            " state_json, answer, pending) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            (run_id, step, generation, attempt, int(got[0]), Jsonb(dict(state)), answer,
             Jsonb(dict(pending)) if pending is not None else None),
        )

    got = await _fenced_update(
        conn,
        "UPDATE runs SET row_version = row_version + 1, checkpoint_step = %(step)s,"
        f" usage = %(usage)s {_FENCE}{_BEFORE_DEADLINE} RETURNING row_version",
        params, what=f"checkpoint {step} of run {run_id}", then=insert_checkpoint,
    )
    return int(got[0])


async def record_provider_failure(
    conn: AConn, run_id: str, *, expected_row_version: int, generation: int, attempt: int
) -> tuple[int, int]:
    """Count one provider failure durably; returns (new row_version, failures so far).
    Raises LostOwnership when fenced."""
    params = {"run_id": run_id, "expected": expected_row_version, "generation": generation,
              "attempt": attempt}
    got = await _fenced_update(
        conn,
        "UPDATE runs SET row_version = row_version + 1,"
        f" provider_failures = provider_failures + 1 {_FENCE}"
        " RETURNING row_version, provider_failures",
        params, what=f"failure count of run {run_id}",
    )
    return int(got[0]), int(got[1])


async def finish(
    conn: AConn,
    run_id: str,
    *,
    expected_row_version: int,
    generation: int,
    attempt: int,
    state: RunState,
    result: Mapping[str, Any] | None = None,
    error_code: str | None = None,
    error_message: str | None = None,
    usage: Mapping[str, Any] | None = None,
) -> Row:
    """The owner's final commit (``completed``, ``failed``, ``awaiting_*``), fenced like a
    checkpoint. Returns the row; raises LostOwnership when fenced."""
    params = {
        "run_id": run_id, "expected": expected_row_version, "generation": generation,
        "attempt": attempt, "state": str(state),
        "result": Jsonb(dict(result)) if result is not None else None,
        "code": error_code, "message": error_message,
        "usage": Jsonb(dict(usage)) if usage is not None else None,
    }
    row: Row = await _fenced_update(
        conn,
        "UPDATE runs SET state = %(state)s::varchar, row_version = row_version + 1,"
        " result_json = coalesce(%(result)s, result_json), error_code = %(code)s,"
        " error_message = %(message)s, usage = coalesce(%(usage)s, usage),"
        f" completed_at = CASE WHEN %(state)s::varchar IN {_TERMINAL_SQL}"
        " THEN clock_timestamp() END"
        f" {_FENCE}"
        + ("" if state in (RunState.EXPIRED, RunState.FAILED) else _BEFORE_DEADLINE)
        + " RETURNING *",
        params, what=f"final commit of run {run_id}", dict_rows=True,
    )
    return row


async def end_unowned(conn: AConn, run_id: str, *, generation: int, state: RunState,
                      error_code: str, error_message: str) -> Row | None:
    """End a live run of ``generation`` as ``failed`` or ``expired`` when no attempt owns it
    any more (retry exhaustion, R-EXEC-6; deadline, R-EXEC-8). Returns the row, or None when
    the run was already terminal, parked or re-dispatched."""
    if state not in (RunState.FAILED, RunState.EXPIRED):
        raise ValueError(f"end_unowned cannot set {state}")
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            """
            UPDATE runs SET state = %s, row_version = row_version + 1,
                            error_code = %s, error_message = %s, completed_at = clock_timestamp()
            WHERE run_id = %s AND generation = %s AND state IN ('accepted', 'queued', 'running')
            RETURNING *
            """,
            (str(state), error_code, error_message, run_id, generation),
        )
        return await cur.fetchone()


async def cancel(conn: AConn, run_id: str) -> tuple[bool, Row]:
    """Persist cancellation first (R-CANCEL-1). Returns (cancelled, row): True when the run
    is now — or already was — ``cancelled``; False for ``completed``/``failed``/``expired``.

    The row lock serialises with the owner's compare-and-set: whichever commits first wins,
    and the other sees a changed ``row_version`` (the owner) or a terminal state (here).
    """
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute("SELECT * FROM runs WHERE run_id = %s FOR UPDATE", (run_id,))
        row = await cur.fetchone()
        if row is None:
            raise LookupError(run_id)
        if row["state"] == RunState.CANCELLED:
            return True, row
        if RunState(row["state"]) in TERMINAL:
            return False, row
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


async def resume(conn: AConn, run_id: str, *, expected_row_version: int, additional_prompt: str,
                 route: str, tenant_id: str, principal_id: str, key: str, fingerprint: str) -> Row | None:
    """``awaiting_input -> accepted`` with the next generation, as a compare-and-set, and its
    idempotency record, in one transaction (R-RESUME-1). ``deadline_at`` is untouched (the
    guard forbids changing it). Returns the row, or None when another writer won."""
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            """
            UPDATE runs SET state = 'accepted', row_version = row_version + 1,
                   generation = generation + 1, owner_attempt = NULL, dispatch_confirmed_at = NULL,
                   workflow_id = 'agent-run-' || run_id::text || '-g' || (generation + 1),
                   result_json = NULL,
                   request_json = jsonb_set(request_json, '{inputs}',
                       coalesce(request_json -> 'inputs', '[]'::jsonb) || to_jsonb(%s::text))
            WHERE run_id = %s AND state = 'awaiting_input' AND row_version = %s
            RETURNING *
            """,
            (additional_prompt, run_id, expected_row_version),
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


async def decide_approval(conn: AConn, run_id: str, *, approval_id: str, action_version: str,
                          approved: bool, tenant_id: str, principal_id: str) -> tuple[str, Row]:
    """Decide a pending approval (R-APPROVAL-1) in the caller's transaction. Returns
    (outcome, row): ``decided`` (now ``queued`` in the next generation, to be dispatched),
    ``repeated`` (the same decision again: nothing changes), or an error code:
    ``approval_conflict`` (the opposite decision), ``action_version_mismatch`` (stale or
    unknown version: nothing runs), ``approval_not_found``, ``run_terminal``,
    ``approval_not_pending``."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute("SELECT * FROM runs WHERE run_id = %s FOR UPDATE", (run_id,))
        row = await cur.fetchone()
        if row is None:
            raise LookupError(run_id)
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
                    "arguments": pending.get("arguments"), "action_version": action_version}
        await cur.execute(
            """
            UPDATE runs SET state = 'queued', row_version = row_version + 1,
                   generation = generation + 1, owner_attempt = NULL, dispatch_confirmed_at = NULL,
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
    """The saved outcome of a run, as the activity and workflow return it (JSON-safe)."""
    return json.loads(
        json.dumps(
            {
                "run_id": str(row["run_id"]),
                "state": row["state"],
                "row_version": row["row_version"],
                "result": row["result_json"],
                "error_code": row["error_code"],
            },
            default=str,
        )
    )
