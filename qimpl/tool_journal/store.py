"""Reads of the tool journal and the settlements made from outside the worker: a client's
result for a developer-hosted call (R-TOOL-4) and an operator's reconciliation of an
unknown outcome (R-TOOL-3). The owner's own journal writes are ``RunOwner.journal`` and
``RunOwner.tool_outcome`` (fenced); the table's trigger refuses settlements while the
run is live (QG009) and any change to a settled row (QG011).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from qimpl.tool_journal.rules import UNSETTLED

__all__ = ["Settlement", "invocations", "settle", "unsettled"]

AConn = psycopg.AsyncConnection[Any]
Row = dict[str, Any]

_COLUMNS = ("call_id, generation, step, position, tool, kind, provider_call_id, arguments,"
            " arguments_digest, approval_id, status, result, intent_attempt, intent_at, outcome_at,"
            " settled_by, resolution_note")


async def invocations(conn: AConn, run_id: str) -> list[Row]:
    """Every invocation of ``run_id``, in the order asked (step, position)."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(f"SELECT {_COLUMNS} FROM tool_invocations WHERE run_id = %s"
                          " ORDER BY step, position", (run_id,))
        return list(await cur.fetchall())


async def unsettled(conn: AConn, run_id: str) -> list[Row]:
    """The run's ``intent`` (unknown) and ``requested`` (developer-hosted) invocations."""
    return [r for r in await invocations(conn, run_id) if r["status"] in UNSETTLED]


class Settlement:
    """Outcomes of ``settle``: a code the API maps to an answer."""

    SETTLED = "settled"
    REPEATED = "repeated"  # the same settlement again: nothing changes
    UNKNOWN_CALL = "tool_call_not_found"
    ALREADY_SETTLED = "tool_call_settled"
    NOT_PARKED = "run_not_parked"
    WRONG_KIND = "tool_call_kind_mismatch"


#: Outcomes an operator records without a result (R-TOOL-3).
_RESULTLESS = frozenset({"not_executed", "compensated"})


async def settle(conn: AConn, run_id: str, call_id: str, *, status: str,
                 result: Mapping[str, Any] | None, settled_by: str, note: str | None = None,
                 kinds: frozenset[str], after_end: bool = False) -> tuple[str, Row | None]:
    """Settle one unsettled invocation of a parked run, in one transaction that holds the
    run's row (so it serialises with a resume). ``kinds`` are the invocation kinds this
    caller may settle (a client: developer-hosted; an operator: instrumented and
    uninstrumented); ``after_end`` also allows an ended run (an operator recording what
    happened to a cancelled or expired run's call, R-Q34-3). Returns ``(Settlement.*, row)``; a settled row with the same status
    and result again is ``REPEATED`` (and the same ``note``, when one is given: a repeat
    with another note is ``ALREADY_SETTLED``, never a silent keep of the first)."""
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute("SELECT state FROM runs WHERE run_id = %s FOR SHARE", (run_id,))
        run = await cur.fetchone()
        if run is None:
            raise LookupError(run_id)
        await cur.execute(f"SELECT {_COLUMNS} FROM tool_invocations WHERE run_id = %s AND call_id = %s"
                          " FOR UPDATE", (run_id, call_id))
        row = await cur.fetchone()
        if row is None:
            return Settlement.UNKNOWN_CALL, None
        if row["kind"] not in kinds:
            return Settlement.WRONG_KIND, row
        if row["status"] not in UNSETTLED:
            # A repeat that says something else (its note too) is not the same record.
            # An operator's result-less outcome (not_executed, compensated) stored as {} by a
            # version before this one is the same record as one without a result.
            wanted = dict(result) if result is not None else None
            same = (row["status"] == status
                    and (row["result"] == wanted
                         or (status in _RESULTLESS and wanted is None and row["result"] == {}))
                    and (note is None or row["resolution_note"] == note))
            return (Settlement.REPEATED if same else Settlement.ALREADY_SETTLED), row
        ended = run["state"] in ("completed", "failed", "expired", "cancelled")
        if run["state"] != "awaiting_input" and not (after_end and ended):
            return Settlement.NOT_PARKED, row
        await cur.execute(
            f"UPDATE tool_invocations SET status = %s, result = %s, outcome_at = clock_timestamp(),"
            f" settled_by = %s, resolution_note = %s WHERE run_id = %s AND call_id = %s"
            f" RETURNING {_COLUMNS}",
            (status, Jsonb(dict(result)) if result is not None else None, settled_by, note,
             run_id, call_id))
        updated = await cur.fetchone()
        return Settlement.SETTLED, updated
