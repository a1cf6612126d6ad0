"""Read what the system and the fakes recorded into history events (I/O)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from qualify.history import Event

__all__ = ["CLOCK_READINGS", "database_clock", "database_events", "file_events", "journal_events",
           "stream_keys", "workflow_events", "workspace_grants"]


#: Every column of ``tool_invocations``, times as epoch seconds on the database's clock
#: (``t`` is the intent's, ``outcome_t`` the outcome's).
_TOOL_INVOCATIONS = (
    "SELECT run_id::text, call_id, tenant_id, generation, step, position, tool, kind,"
    " provider_call_id, arguments, arguments_digest, approval_id, status, result,"
    " intent_attempt, intent_row_version, outcome_row_version,"
    " extract(epoch FROM intent_at)::float8 AS t, extract(epoch FROM outcome_at)::float8 AS outcome_t,"
    " settled_by, resolution_note, committed_by{xacts}"
    " FROM tool_invocations ORDER BY intent_at, run_id, step, position"
)

#: Every column of ``provider_calls`` (the owner's record of each provider call, R-Q34-2),
#: times as epoch seconds on the database's clock (``t`` started, ``ended_t`` settled).
_PROVIDER_CALLS = (
    "SELECT id, run_id::text, tenant_id, generation, attempt, step, row_version, status,"
    " outcome_code, input_tokens, output_tokens, extract(epoch FROM started_at)::float8 AS t,"
    " extract(epoch FROM ended_at)::float8 AS ended_t, committed_by{xacts} FROM provider_calls ORDER BY id"
)

#: The fakes' own records (relative to the control directory) and their event types.
FILE_EVENTS = (
    ("provider_calls.jsonl", "provider_call"),
    ("provider_call_ends.jsonl", "provider_call_end"),
    ("crash_points.jsonl", "crash_point"),
    ("sink/requests.jsonl", "sink_request"),
    ("sink/executions.jsonl", "sink_execution"),
)


def workspace_grants(dsn: str) -> list[str]:
    """Every workspace grant token the scenario's database holds (revoked ones included):
    what no process may ever log (R-READ-3)."""
    with psycopg.connect(dsn) as conn:
        return [str(r[0]) for r in conn.execute("SELECT DISTINCT grant_token FROM workspace_grants")]


def stream_keys(dsn: str) -> list[str]:
    """Every run's stream key in the scenario's database: what no process may ever log
    (R-AUTH-3: a stream key reads its run's events)."""
    with psycopg.connect(dsn) as conn:
        return [str(r[0]) for r in conn.execute("SELECT stream_key FROM runs WHERE stream_key IS NOT NULL")]


def database_events(dsn: str) -> list[Event]:
    """Every run (its deadline), transition (from the database's own audit trigger),
    checkpoint, tool invocation (the journal, R-TOOL-1), provider-call record (observed
    usage, R-Q34-2) and journal event (R-EVENT-1), all read in one snapshot. Where the
    schema stamps them, each row carries the transaction that wrote it (``xact_id``; a
    tool invocation's ``intent_xact``/``outcome_xact``, a provider call's
    ``started_xact``/``ended_xact``; text, comparable only for equality)."""
    out: list[Event] = []
    # One snapshot for every table: a write still committing cannot leave its transition
    # without its run record or its event in the history.
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        writer = conn.execute(
            "SELECT count(*) = 4 AS present FROM information_schema.columns"
            " WHERE table_name = 'run_transitions' AND column_name = ANY(%s)",
            (["writer_pid", "writer_role", "writer_token", "writer_lock"],)).fetchone()
        # The writer's identity, as the writing session gave it (absent before that migration).
        who = (", writer_pid, writer_role, writer_token, writer_lock"
               if writer and writer["present"] else "")
        stamped = conn.execute(
            "SELECT count(*) > 0 AS present FROM information_schema.columns"
            " WHERE table_name = 'run_transitions' AND column_name = 'xact_id'").fetchone()
        # Each row's writing transaction (absent before migration 20261203_090000_write_xacts).
        xact = stamped is not None and bool(stamped["present"])
        who += ", xact_id::text" if xact else ""
        commits = conn.execute("SELECT current_setting('track_commit_timestamp') = 'on' AS on").fetchone()
        if xact and commits and commits["on"]:
            # When each write committed (PostgreSQL's commit timestamps): the order writes
            # of different runs became visible, which the insert order (id) is not.
            who += ", extract(epoch FROM pg_xact_commit_timestamp(xact_id::xid))::float8 AS commit_t"
        for row in conn.execute(
            "SELECT id, run_id::text, row_version, old_state, new_state, generation, owner_attempt,"
            f" checkpoint_step{who}, extract(epoch FROM at)::float8 AS t FROM run_transitions ORDER BY id"
        ):
            out.append({"type": "transition", **row})
        for row in conn.execute(
            "SELECT run_id::text, tenant_id, state, generation, row_version, error_code, lifecycle_version,"
            " CASE WHEN length(prompt) <= 20000 THEN prompt END AS prompt,"
            " md5(result_json->>'answer') AS answer_md5, length(result_json->>'answer') AS answer_chars,"
            " extract(epoch FROM accepted_at)::float8 AS t,"
            " extract(epoch FROM deadline_at)::float8 AS deadline_t FROM runs"
        ):
            out.append({"type": "run", **row})
        deltas = conn.execute(
            "SELECT count(*) > 0 AS present FROM information_schema.columns"
            " WHERE table_name = 'run_checkpoints' AND column_name = 'state_delta'").fetchone()
        # Each checkpoint's state as stored (whole, or its delta; absent before that
        # migration; a whole state over 20,000 bytes is left out): a checker folds them.
        states = (" CASE WHEN pg_column_size(state_json) <= 20000 THEN state_json END AS state_json,"
                  " state_delta," if deltas and deltas["present"] else "")
        for row in conn.execute(
            "SELECT run_id::text, step, generation, attempt, row_version,"
            f"{' xact_id::text,' if xact else ''}{states}"
            " extract(epoch FROM created_at)::float8 AS t FROM run_checkpoints ORDER BY row_version"
        ):
            out.append({"type": "checkpoint", **row})
        journal = conn.execute("SELECT to_regclass('tool_invocations') IS NOT NULL AS present").fetchone()
        if journal and journal["present"]:  # absent before the tool journal's migration
            tool_xacts = ", intent_xact::text, outcome_xact::text" if xact else ""
            if xact and commits and commits["on"]:
                # When the intent committed: no call may reach the owning system before.
                tool_xacts += (", extract(epoch FROM pg_xact_commit_timestamp(intent_xact::xid))::float8"
                               " AS intent_commit_t")
            for row in conn.execute(_TOOL_INVOCATIONS.format(xacts=tool_xacts)):
                out.append({"type": "tool_invocation", **row})
        record = conn.execute("SELECT to_regclass('provider_calls') IS NOT NULL AS present").fetchone()
        if record and record["present"]:  # absent before the provider-call record's migration
            call_xacts = ", started_xact::text, ended_xact::text" if xact else ""
            for row in conn.execute(_PROVIDER_CALLS.format(xacts=call_xacts)):
                out.append({"type": "provider_call_record", **row})
        events = conn.execute("SELECT to_regclass('run_events') IS NOT NULL AS present").fetchone()
        if events and events["present"]:  # absent before the event journal's migration
            out.extend(journal_events(conn, xact=xact))
        out.append(database_clock(conn))
        for row in conn.execute(
            "SELECT run_id::text, approval_id, approved, principal_id,"
            " extract(epoch FROM decided_at)::float8 AS t FROM approval_decisions ORDER BY decided_at"
        ):
            out.append({"type": "approval_decision", **row})
    return out


#: Readings of the database's clock against this host's; the one with the shortest
#: round trip is kept.
CLOCK_READINGS = 5


def database_clock(conn: psycopg.Connection[Any]) -> Event:
    """A ``db_clock`` event: the database's clock minus this host's (``offset_s``, seconds)
    and how far off that figure can be (``uncertainty_s``: half the shortest of
    ``CLOCK_READINGS`` round trips). A checker that compares a database time with a time a
    process of this host stamped (the side-effect sink's) subtracts the offset and allows
    the uncertainty, instead of a fixed slack."""
    best: tuple[float, float] | None = None
    for _ in range(CLOCK_READINGS):
        t0 = time.time()
        row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8 AS t").fetchone()
        t1 = time.time()
        if row is None:
            continue
        db_t = float(row["t"] if isinstance(row, dict) else row[0])
        reading = (db_t - (t0 + t1) / 2, (t1 - t0) / 2)
        if best is None or reading[1] < best[1]:
            best = reading
    offset, uncertainty = best if best is not None else (0.0, float("inf"))
    return {"type": "db_clock", "t": time.time(), "offset_s": offset, "uncertainty_s": uncertainty}


def journal_events(conn: psycopg.Connection[Any], *, xact: bool = False) -> list[Event]:
    """The event journal (R-EVENT-1) as ``run_event`` events (``run_id, seq, kind,
    row_version, state, generation``; an ``output`` event's text as its length only (a
    streamed delta has none); a ``usage`` event's call ``attempt, step, status``, its
    ``input_tokens`` and ``output_tokens`` (None: not reported) and ``total_calls``; with ``xact``, ``xact_id``, the transaction that wrote it) and
    its tombstones as ``event_prune`` events (``run_id, tenant_id, pruned_by, events``,
    ``t`` the pruning transaction's start: one sweep's share it), times on the database's
    clock."""
    out: list[Event] = []
    for row in conn.execute(
        "SELECT run_id::text, seq, kind, row_version, data->>'state' AS state,"
        " (data->>'generation')::int AS generation, length(data->>'text') AS text_chars,"
        " (data->>'attempt')::int AS attempt, (data->>'step')::int AS step,"
        " data->>'status' AS status, (data->'totals'->>'provider_calls')::int AS total_calls,"
        " (data->>'input_tokens')::bigint AS input_tokens, (data->>'output_tokens')::bigint AS output_tokens,"
        f"{' xact_id::text,' if xact else ''}"
        " extract(epoch FROM at)::float8 AS t FROM run_events ORDER BY at, run_id, seq"
    ):
        out.append({"type": "run_event", **row})
    for row in conn.execute(
        "SELECT run_id::text, tenant_id, pruned_by, events, extract(epoch FROM pruned_at)::float8 AS t"
        " FROM run_event_prunes ORDER BY pruned_at, run_id"
    ):
        out.append({"type": "event_prune", **row})
    return out


def file_events(control_dir: Path) -> list[Event]:
    """Provider calls and struck crash points, as the processes recorded them, and every
    request and execution the side-effect sink saw (``sink_request``, ``sink_execution``)."""
    out: list[Event] = []
    for name, type_ in FILE_EVENTS:
        path = control_dir / name
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    out.append({"type": type_, **json.loads(line)})
    return out


async def _started_with(client: Any, workflow_id: str, run_id: str) -> dict[str, Any]:
    """``{"input": ...}``: the first argument the execution was started with, as Temporal
    recorded it (its history's first event), decoded to JSON values; ``{}`` when it had
    none or could not be decoded (the checker then judges nothing of it)."""
    async for event in client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history_events(page_size=1):
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        if not payloads:
            return {}
        try:
            (value, *_) = await client.data_converter.decode(payloads)
        except Exception:  # noqa: BLE001 - not a harness crash: nothing to judge
            return {}
        return {"input": value} if isinstance(value, dict) else {}
    return {}


def workflow_events(address: str, namespace: str, task_queue: str, *, since: float | None = None,
                    timeout_s: float = 10.0) -> list[Event]:
    """Every Temporal workflow execution of the namespace started since ``since`` (epoch
    s; None: those of the scenario's task queue only), from Temporal's own visibility
    store, whatever its id or task queue — a dispatch to the wrong queue or under the
    wrong id is seen too: ``workflow`` events (``workflow_id, run_id_temporal, status,
    task_queue, ours``: on the scenario's queue) and one ``workflow_listing`` event
    (``count``, or ``error`` when Temporal could not be read, so the checker says
    unknown instead of passing on nothing)."""
    import asyncio

    from temporalio.client import Client

    async def listing() -> list[Event]:
        client = await Client.connect(address, namespace=namespace)
        out: list[Event] = []
        from datetime import UTC, datetime

        query = (f'TaskQueue = "{task_queue}"' if since is None else
                 f'StartTime >= "{datetime.fromtimestamp(since, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}"')
        async for wf in client.list_workflows(query):
            out.append({"type": "workflow", "workflow_id": wf.id, "run_id_temporal": wf.run_id,
                        "status": wf.status.name if wf.status else None, "task_queue": wf.task_queue,
                        "ours": wf.task_queue == task_queue, "t": wf.start_time.timestamp(),
                        "workflow_type": wf.workflow_type,
                        **await _started_with(client, wf.id, wf.run_id)})
        return out

    try:
        found = asyncio.run(asyncio.wait_for(listing(), timeout_s))
    except Exception as exc:  # noqa: BLE001 - recorded: the checker reports unknown
        return [{"type": "workflow_listing", "t": time.time(),
                 "error": f"{type(exc).__name__}: {exc}"[:300]}]
    return [*found, {"type": "workflow_listing", "t": time.time(), "count": len(found)}]
