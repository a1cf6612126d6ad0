"""Writers the database must refuse (R-EXEC-7, R-STATE-1, R-EXEC-8, R-AUTH-4): live sessions
of the worker's or the API's own role that write what only one mechanism refuses (the
fence, the transition guard, the checkpoint guard, row-level security). Each returns how
the database answered: ``refused`` (no row matched), a SQLSTATE, or ``written`` (then
rolled back where it could have landed). Used by ``qualify.scenarios.probes``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

__all__ = ["fence_probe", "guard_probe", "insert_probe", "late_checkpoint_probe", "rls_probes",
           "stray_checkpoint_probe"]


@contextmanager
def _session(dsn: str, tenant: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit probe session of ``dsn``'s role, scoped to ``tenant``."""
    with psycopg.connect(dsn, autocommit=True, application_name="qualify-probe") as conn:
        conn.execute("SELECT set_config('qimpl.tenant', %s, false)", (tenant,))
        yield conn


def fence_probe(dsn: str, run_id: str, tenant: str, token: dict[str, int], step: int,
                 write: str = "checkpoint") -> str:
    """Write ``step``'s checkpoint (or, ``write="output delta"``, a piece of its streamed
    output) through ``RunOwner`` with ``token``; returns how the database answered:
    ``refused`` (no row matched: LostOwnership), ``guard:<SQLSTATE>`` or ``written``."""
    from qimpl.db.owner import RunOwner
    from qimpl.errors import LostOwnership

    async def probe() -> str:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True,
                                                         application_name="qualify-probe") as conn:
            await conn.execute("SELECT set_config('qimpl.tenant', %s, false)", (tenant,))
            owner = RunOwner(conn, run_id=run_id, deadline_left_s=3600.0, generation=token["generation"],
                             attempt=token["attempt"], row_version=token["row_version"])
            try:
                if write == "checkpoint":
                    await owner.checkpoint(step, state={"probe": True}, usage={})
                else:
                    await owner.output_delta(step, "probe")
            except LostOwnership as exc:
                cause = exc.__cause__
                code = getattr(cause, "sqlstate", None)
                return f"guard:{code}" if code else "refused"
            return "written"

    # The owner's refusal log is the evidence a real stale writer leaves: capture it here
    # (and keep it off the harness's console).
    logger = logging.getLogger("qimpl.owner")
    seen: list[logging.LogRecord] = []
    handler = _Capture(seen)
    logger.addHandler(handler)
    propagate, logger.propagate = logger.propagate, False
    try:
        answer = asyncio.run(probe())
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
    logged = [getattr(r, "how", "") for r in seen if getattr(r, "event", "") == "owner.write_refused"]
    if answer != "written" and f"{'fenced' if answer == 'refused' else answer}" not in logged:
        return f"{answer} (but no owner.write_refused logged)"
    return answer


class _Capture(logging.Handler):
    def __init__(self, into: list[logging.LogRecord]) -> None:
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record)


def guard_probe(dsn: str, run_id: str, tenant: str, set_clause: str) -> str:
    """One raw UPDATE of the run by the worker role: the SQLSTATE it raised, or ``written``."""
    with _session(dsn, tenant) as conn:
        try:
            cur = conn.execute(f"UPDATE runs SET {set_clause} WHERE run_id = %s", (run_id,))
        except psycopg.Error as exc:
            return str(exc.sqlstate)
        return "written" if cur.rowcount else "no row"


def insert_probe(dsn: str, tenant: str, state: str, version: int, generation: int,
                  attempt: int | None) -> str:
    """One raw INSERT of a run in ``tenant`` by the session's role: the SQLSTATE it raised,
    or ``written`` (then rolled back)."""
    with _session(dsn, tenant) as conn:
        try:
            with conn.transaction():
                conn.execute(
                    "INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt,"
                    " stream_key, deadline_at, row_version, generation, owner_attempt)"
                    " VALUES (gen_random_uuid(), %s, 'p', 'a', %s, 'x', 'k', now() + interval '1 hour',"
                    " %s, %s, %s)", (tenant, state, version, generation, attempt))
                raise _RolledBack("written")
        except _RolledBack:
            return "written"
        except psycopg.Error as exc:
            return str(exc.sqlstate)


def stray_checkpoint_probe(dsn: str, run_id: str, tenant: str, owner: dict[str, int], step: int) -> str:
    """A raw checkpoint row by the worker role carrying the owner's own token, outside the
    owner's fenced write (the row a buggy or hostile session would plant for the next
    attempt to restore): the SQLSTATE it raised, or ``written`` (then rolled back)."""
    with _session(dsn, tenant) as conn:
        try:
            with conn.transaction():
                conn.execute(
                    "INSERT INTO run_checkpoints (run_id, step, generation, attempt, row_version,"
                    " state_json, committed_by) VALUES (%s, %s, %s, %s, %s, '{}', 'operator')",
                    (run_id, step, owner["generation"], owner["attempt"], owner["row_version"]))
                raise _RolledBack("written")
        except _RolledBack:
            return "written"
        except psycopg.Error as exc:
            return str(exc.sqlstate)


def late_checkpoint_probe(dsn: str, run_id: str, tenant: str) -> str:
    """The owner's two checkpoint statements with the deadline between them, by the worker
    role: the fenced ``UPDATE`` of the running run while its deadline is ahead (the run's
    guard lets it through), then, once the deadline passed by the database's clock, the
    checkpoint row for that write in the same transaction. The SQLSTATE the ``INSERT``
    raised, or ``written`` (then rolled back); ``early: <SQLSTATE>`` if the ``UPDATE``
    itself was refused (the deadline came too soon for the probe)."""
    with _session(dsn, tenant) as conn:
        try:
            with conn.transaction():
                try:
                    (row_version, step, generation, attempt), = conn.execute(
                        "UPDATE runs SET row_version = row_version + 1, checkpoint_step = checkpoint_step + 1"
                        " WHERE run_id = %s AND state = 'running'"
                        " RETURNING row_version, checkpoint_step, generation, owner_attempt", (run_id,)).fetchall()
                except psycopg.Error as exc:
                    return f"early: {exc.sqlstate}"
                conn.execute("SELECT pg_sleep(greatest(0, extract(epoch FROM deadline_at - clock_timestamp()))"
                             " + 0.05) FROM runs WHERE run_id = %s", (run_id,))
                conn.execute(
                    "INSERT INTO run_checkpoints (run_id, step, generation, attempt, row_version, state_json)"
                    " VALUES (%s, %s, %s, %s, %s, '{}')", (run_id, step, generation, attempt, row_version))
                raise _RolledBack("written")
        except _RolledBack:
            return "written"
        except psycopg.Error as exc:
            return str(exc.sqlstate)


def rls_probes(dsn: str, run_id: str, victim: str, intruder: str) -> dict[str, str]:
    """What a session scoped to ``intruder`` sees and may do to ``victim``'s run."""
    out: dict[str, str] = {}
    with _session(dsn, intruder) as conn:
        # Tables that hold rows of this run (the tool journal has none here).
        for table in ("runs", "run_checkpoints", "run_transitions", "idempotency_records",
                      "provider_calls", "run_events"):
            row = conn.execute(f"SELECT count(*) FROM {table} WHERE run_id = %s", (run_id,)).fetchone()
            out[f"read {table}"] = f"{row[0] if row else '?'} rows"
        # The victim's workspace grants (no run id: by tenant).
        row = conn.execute("SELECT count(*) FROM workspace_grants WHERE tenant_id = %s", (victim,)).fetchone()
        out["read workspace_grants"] = f"{row[0] if row else '?'} rows"
        try:
            cur = conn.execute("UPDATE runs SET row_version = row_version + 1 WHERE run_id = %s",
                               (run_id,))
            out["update runs"] = f"{cur.rowcount} rows"
        except psycopg.Error as exc:
            out["update runs"] = f"error {exc.sqlstate}"
        try:
            with conn.transaction():
                conn.execute(
                    "INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt,"
                    " stream_key, deadline_at) VALUES (gen_random_uuid(), %s, 'p', 'a', 'accepted',"
                    " 'x', 'k', now() + interval '1 hour')", (victim,))
                raise _RolledBack("written")
        except _RolledBack:
            out["insert into runs"] = "written (rolled back)"
        except psycopg.Error as exc:
            out["insert into runs"] = f"error {exc.sqlstate}"
    return out


class _RolledBack(Exception):
    pass
