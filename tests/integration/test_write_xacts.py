"""Each row names the transaction that wrote it, and the checker that reads the stamps is
fed histories the real database produced (R-EXEC-3, R-EXEC-7, R-EVENT-1, R-Q-5).

The split history below is the blind spot the other checks pass: a checkpoint committed
in its own transaction just before its fenced ``row_version`` bump writes exactly the
values an atomic one does (one checkpoint per step, row versions in order, every write by
its owner, a journal event per transition). Only the transaction stamps tell them apart.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from qimpl.db.owner import RunOwner
from qualify import checkers as ck
from qualify.collect import database_events
from qualify.history import Event
from tests.integration.owned_runs import lease as owner_lease
from tests.integration.owned_runs import queued_run

NAME = "every row committed in its write's transaction"


def _of_run(dsn: str, run_id: str) -> list[Event]:
    return [e for e in database_events(dsn) if e.get("run_id") == run_id]


_INVOCATION = {"call_id": "c1", "step": 2, "position": 0, "tool": "search", "kind": "instrumented",
               "id": "p1", "arguments": {"q": "x"}, "digest": "d", "approval_id": None}


@pytest.mark.req("R-EXEC-3")
@pytest.mark.req("R-EVENT-1")
@pytest.mark.req("R-Q-5")
def test_an_owners_writes_each_commit_whole(stack: Any) -> None:
    """A run's life through ``RunOwner``: claim, a provider call settled, a checkpoint, a
    tool call's intent and outcome, the final checkpoint with its answer, completion. Every
    row is stamped, the rows of one write share its transaction, and the checker passes."""
    dsn = stack.create_database()
    run_id = queued_run(dsn)

    async def live() -> None:
        async with owner_lease(dsn, run_id) as lease:
            claim = await RunOwner.claim(lease.conn, run_id, generation=1, attempt=1)
            owner = claim.owner
            assert owner is not None
            call = await owner.call_started(1)
            await owner.call_ended(call, status="succeeded", input_tokens=3, output_tokens=4)
            await owner.checkpoint(1, state={}, usage={})
            await owner.output_delta(2, "hel")
            await owner.journal(_INVOCATION, status="intent")
            await owner.tool_outcome("c1", status="succeeded", result={"ok": True})
            await owner.checkpoint(2, state={}, usage={}, answer="hello")
            await owner.complete("hello", usage={})

    asyncio.run(live())
    history = _of_run(dsn, run_id)
    rows = [e for e in history if e["type"] in ("transition", "checkpoint", "run_event")]
    assert rows and all(e["xact_id"] for e in rows)
    (tool,) = [e for e in history if e["type"] == "tool_invocation"]
    assert tool["intent_xact"] and tool["outcome_xact"] and tool["intent_xact"] != tool["outcome_xact"]
    (record,) = [e for e in history if e["type"] == "provider_call_record"]
    assert record["started_xact"] != record["ended_xact"]  # the call is made between them
    by_version = {e["row_version"]: e["xact_id"] for e in history if e["type"] == "transition"}
    assert len(set(by_version.values())) == len(by_version)  # one transaction per write
    for c in (e for e in history if e["type"] == "checkpoint"):
        assert c["xact_id"] == by_version[c["row_version"]]
    kinds = {(e["kind"], e["text_chars"] is not None) for e in history if e["type"] == "run_event"}
    assert {("output", True), ("output", False), ("usage", False), ("tool_call", False),
            ("tool_result", False), ("terminal", False)} <= kinds
    check = ck.writes_committed_whole(history)
    assert check.ok is True, check.detail
    assert check.name == NAME and "each in its write's transaction" in check.detail


@pytest.mark.req("R-EXEC-3")
@pytest.mark.req("R-Q-5")
def test_a_checkpoint_committed_before_its_fence_is_seen_by_this_check_only(stack: Any) -> None:
    """Step 2's checkpoint committed on its own, then its fenced ``row_version`` bump on the
    owner's session (the lock held, its token set): what the mutant
    ``checkpoint-split-from-its-fence`` does; the run then completes. Every other generic
    check passes."""
    dsn = stack.create_database()
    run_id = queued_run(dsn)

    # The database's checkpoint guard (QG015) refuses this split itself; it is turned off
    # here, as in the mutant, so that the check is shown to see what a guard let through.
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("ALTER TABLE run_checkpoints DISABLE TRIGGER run_checkpoints_guard")

    async def split() -> None:
        async with owner_lease(dsn, run_id) as lease:
            claim = await RunOwner.claim(lease.conn, run_id, generation=1, attempt=1)
            owner = claim.owner
            assert owner is not None
            await owner.checkpoint(1, state={}, usage={})
            await lease.conn.execute(
                "INSERT INTO run_checkpoints (run_id, step, generation, attempt, row_version, state_json)"
                " VALUES (%s, 2, 1, 1, %s, '{}')", (run_id, owner.row_version + 1))
            await lease.conn.execute(
                "UPDATE runs SET row_version = row_version + 1, checkpoint_step = 2"
                " WHERE run_id = %s AND row_version = %s", (run_id, owner.row_version))
            owner.row_version += 1
            await owner.complete("hello", usage={})

    asyncio.run(split())
    history = _of_run(dsn, run_id)
    checkpoint = max((e for e in history if e["type"] == "checkpoint"), key=lambda e: e["step"])
    write = next(e for e in history if e["type"] == "transition" and e["row_version"] == checkpoint["row_version"])
    assert checkpoint["xact_id"] != write["xact_id"]

    results = {c.name: c for c in ck.run_checks(history, ck.GENERIC_CHECKERS)}
    failed = sorted(name for name, c in results.items() if c.ok is not True)
    assert failed == [NAME], {n: results[n].detail for n in failed}  # the blind spot of the others
    assert (f"checkpoint 2 committed in transaction {checkpoint['xact_id']}, its write to "
            f"v{checkpoint['row_version']} in {write['xact_id']}") in results[NAME].detail
