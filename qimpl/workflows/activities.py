"""The agent-loop activity: lease, claim, restore, step, checkpoint, finish.

Implements R-EXEC-2 (lease before work), R-EXEC-3 (one checkpoint per step),
R-EXEC-4 (restore the last checkpoint), R-EXEC-5 (terminal run: saved outcome, no
provider call), R-EXEC-6 (safe failure codes) and R-EXEC-7 (fenced writes stop the
owner). Crash points mark every commit boundary (R-Q-4).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import psycopg
from temporalio import activity
from temporalio.exceptions import ApplicationError

from qimpl.approvals import approval_request
from qimpl.crashpoints import declare
from qimpl.db import runs as repo
from qimpl.errors import LockNotAcquired, LostOwnership
from qimpl.legacy import run_inline
from qimpl.lifecycle import TERMINAL, RunState
from qimpl.provider import Provider, StepContext
from qimpl.workflows.lease import OwnershipLease
from qimpl.workflows.types import FailInput, RunInput

__all__ = ["AgentActivities"]

log = logging.getLogger("qimpl.activity")

AFTER_CLAIM = declare("activity.after_claim", "the attempt owns the run, before any step")
BEFORE_CHECKPOINT = declare(
    "activity.before_checkpoint_commit", "a step's provider call returned, its checkpoint not yet committed"
)
AFTER_CHECKPOINT = declare("activity.after_checkpoint_commit", "a step's checkpoint is committed")
BEFORE_FINAL = declare("activity.before_final_commit", "the answer is known, `completed` not yet committed")
AFTER_FINAL = declare(
    "activity.after_final_commit", "`completed` is committed, Temporal not yet told"
)


def _merge_usage(total: dict[str, Any], step: dict[str, Any]) -> dict[str, Any]:
    out = dict(total)
    for k, v in step.items():
        out[k] = int(out.get(k, 0)) + int(v)
    return out


class AgentActivities:
    """Activities bound to one database and one provider (created by the worker)."""

    def __init__(self, *, dsn: str, provider: Provider, slot_limit: int = 0) -> None:
        self.dsn = dsn
        self.provider = provider
        self.slot_limit = slot_limit

    @activity.defn(name="run_agent_v2")
    async def run_agent(self, inp: RunInput) -> dict[str, Any]:
        """Run the agent loop for one generation; returns the run's saved outcome.

        Raises ApplicationError (retryable) when the lock is busy or ownership was lost
        while the run is still live.
        """
        info = activity.info()
        try:
            async with OwnershipLease(
                self.dsn, inp.run_id, lease_s=inp.heartbeat_timeout_s,
                application_name=f"qimpl-owner:{inp.run_id}", tenant_id=inp.tenant_id,
            ) as lease, self._heartbeating(lease):
                return await self._loop(lease, inp, info.attempt)
        except LockNotAcquired as exc:
            raise ApplicationError(str(exc), type="LockNotAcquired") from None
        except (LostOwnership, psycopg.OperationalError) as exc:
            saved = await self._saved_outcome_if_terminal(inp.run_id, inp.tenant_id)
            if saved is not None:
                return saved
            log.warning("lost ownership of run %s: %s", inp.run_id, type(exc).__name__)
            raise ApplicationError("lost ownership", type="LostOwnership") from None

    @contextlib.asynccontextmanager
    async def _heartbeating(self, lease: OwnershipLease) -> AsyncIterator[None]:
        async def beat() -> None:
            while True:
                activity.heartbeat()
                await lease.touch()
                await asyncio.sleep(lease.touch_interval_s)

        task = asyncio.create_task(beat())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    async def _loop(self, lease: OwnershipLease, inp: RunInput, attempt: int) -> dict[str, Any]:
        conn = lease.conn
        row = await repo.claim_for_attempt(conn, inp.run_id, generation=inp.generation,
                                           attempt=attempt, slot_limit=self.slot_limit)
        if RunState(row["state"]) in TERMINAL or row["generation"] != inp.generation:
            return repo.outcome(row)  # R-EXEC-5: nothing to run
        if row["state"] == RunState.QUEUED:
            # No tenant slot free (R-EXEC-9): stay queued; Temporal retries (<= 1 s backoff).
            raise ApplicationError("no tenant slot free", type="SlotUnavailable")
        if row["state"] != RunState.RUNNING:
            return repo.outcome(row)
        AFTER_CLAIM.reach(run_id=inp.run_id, attempt=attempt)
        checkpoint = await repo.latest_checkpoint(conn, inp.run_id)
        step = int(checkpoint["step"]) if checkpoint else 0
        state: dict[str, Any] = dict(checkpoint["state_json"]) if checkpoint else {}
        answer: str | None = checkpoint["answer"] if checkpoint else None
        # A park checkpointed by this generation parks again; a resumed generation goes on.
        pending: dict[str, Any] | None = (
            checkpoint["pending"] if checkpoint and checkpoint["generation"] == inp.generation else None)
        inputs = tuple(str(i) for i in (row["request_json"] or {}).get("inputs", []))
        decisions = tuple((row["request_json"] or {}).get("decisions", []))
        version = int(row["row_version"])
        usage: dict[str, Any] = dict(row["usage"] or {})
        deadline = datetime.fromisoformat(inp.deadline_at)
        while answer is None and pending is None:
            left = (deadline - datetime.now(UTC)).total_seconds()
            if left <= 0:
                return await self._expire(conn, inp, version, attempt)
            step += 1
            try:
                result = await asyncio.wait_for(self.provider.step(
                    StepContext(run_id=inp.run_id, tenant_id=inp.tenant_id, generation=inp.generation,
                                attempt=attempt, step=step, prompt=row["prompt"], state=state,
                                inputs=inputs, decisions=decisions)
                ), timeout=left)
            except TimeoutError:
                return await self._expire(conn, inp, version, attempt)
            except Exception as exc:  # noqa: BLE001 - any provider error is one counted failure
                log.warning("provider failed at step %s of run %s: %s", step, inp.run_id,
                            type(exc).__name__)
                version, failures = await repo.record_provider_failure(
                    conn, inp.run_id, expected_row_version=version, generation=inp.generation,
                    attempt=attempt)
                if failures >= inp.max_provider_failures:
                    row = await repo.finish(
                        conn, inp.run_id, expected_row_version=version, generation=inp.generation,
                        attempt=attempt, state=RunState.FAILED,
                        error_code="agent_attempts_exhausted",
                        error_message=_SAFE_MESSAGES["agent_attempts_exhausted"])
                    return repo.outcome(row)
                raise ApplicationError("provider step failed", type="ProviderFailure") from None
            if datetime.now(UTC) >= deadline:  # no checkpoint after the deadline (R-EXEC-8)
                return await self._expire(conn, inp, version, attempt)
            state, answer = dict(result.state), result.answer
            pending = dict(result.pending) if result.pending is not None else None
            if pending is not None and pending.get("kind") == "approval":
                pending = approval_request(inp.run_id, inp.generation, step, pending)
            usage = _merge_usage(usage, dict(result.usage))
            BEFORE_CHECKPOINT.reach(run_id=inp.run_id, step=step, attempt=attempt)
            version = await repo.commit_checkpoint(
                conn, inp.run_id, expected_row_version=version, generation=inp.generation,
                attempt=attempt, step=step, state=state, usage=usage, answer=answer,
                pending=pending,
            )
            AFTER_CHECKPOINT.reach(run_id=inp.run_id, step=step, attempt=attempt)
        if pending is not None:
            approval = pending.get("kind") == "approval"
            row = await repo.finish(
                conn, inp.run_id, expected_row_version=version, generation=inp.generation,
                attempt=attempt,
                state=RunState.AWAITING_APPROVAL if approval else RunState.AWAITING_INPUT,
                result={"pending_approval" if approval else "pending_input": pending}, usage=usage,
            )
            return repo.outcome(row)
        BEFORE_FINAL.reach(run_id=inp.run_id, attempt=attempt)
        row = await repo.finish(
            conn, inp.run_id, expected_row_version=version, generation=inp.generation,
            attempt=attempt, state=RunState.COMPLETED, result={"answer": answer}, usage=usage,
        )
        AFTER_FINAL.reach(run_id=inp.run_id, attempt=attempt)
        return repo.outcome(row)

    async def _expire(self, conn: Any, inp: RunInput, version: int, attempt: int) -> dict[str, Any]:
        row = await repo.finish(
            conn, inp.run_id, expected_row_version=version, generation=inp.generation,
            attempt=attempt, state=RunState.EXPIRED, error_code="deadline_exceeded",
            error_message="the run's deadline passed",
        )
        return repo.outcome(row)

    async def _connect(self, tenant_id: str) -> psycopg.AsyncConnection[Any]:
        """A short-lived connection scoped to ``tenant_id`` (row-level security)."""
        conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True,
                                                     application_name="qimpl-worker")
        await conn.execute("SELECT set_config('qimpl.tenant', %s, false)", (tenant_id,))
        return conn

    async def _saved_outcome_if_terminal(self, run_id: str, tenant_id: str) -> dict[str, Any] | None:
        try:
            async with await self._connect(tenant_id) as conn:
                row = await repo.get_run(conn, run_id)
        except psycopg.Error:
            return None
        if row is not None and RunState(row["state"]) in TERMINAL:
            return repo.outcome(row)
        return None

    @activity.defn(name="run_agent_v1")
    async def run_agent_v1(self, run_id: str) -> dict[str, Any]:
        """Version-1 activity: the legacy inline loop, no lease and no checkpoints."""
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            cur = await conn.execute("SELECT qimpl_tenant_of_run(%s)", (run_id,))
            found = await cur.fetchone()
            await conn.execute("SELECT set_config('qimpl.tenant', %s, false)",
                               (found[0] if found and found[0] else "",))
            state = await run_inline(conn, self.provider, run_id)
        return {"run_id": run_id, "state": str(state)}

    @activity.defn(name="fail_run_v2")
    async def fail_run(self, inp: FailInput) -> dict[str, Any]:
        """After retry exhaustion or at the deadline: end the generation ``failed`` or
        ``expired`` with a safe code, unless it is already terminal (R-EXEC-6, R-EXEC-8).
        ``error_message`` is a fixed sentence: never an exception text or a trace."""
        target = RunState(inp.state)
        message = (_SAFE_MESSAGES.get(inp.error_code)
                   or "the agent could not complete after repeated attempts")
        async with await self._connect(inp.tenant_id) as conn:
            row = await repo.end_unowned(conn, inp.run_id, generation=inp.generation, state=target,
                                         error_code=inp.error_code, error_message=message)
            if row is None:
                row = await repo.get_run(conn, inp.run_id)
        return repo.outcome(row) if row else {"run_id": inp.run_id, "state": "unknown"}


_SAFE_MESSAGES = {
    "agent_attempts_exhausted": "the agent could not complete after repeated attempts",
    "agent_activity_failed": "the agent activity failed and cannot be retried",
    "deadline_exceeded": "the run's deadline passed",
}
