"""The agent-loop activity: lease, claim, restore, step, checkpoint, finish.

Implements R-EXEC-2 (lease before work), R-EXEC-3 (one checkpoint per step),
R-EXEC-4 (restore the last checkpoint), R-EXEC-5 (terminal run: saved outcome, no
provider call), R-EXEC-6 (counted failures, safe codes), R-EXEC-7 (fenced writes stop
the owner), R-EXEC-8/12 (only the deadline, by the database's clock, expires a run) and
R-EXEC-11 (an owner that loses its lease stops at once). Crash points mark every commit
boundary (R-Q-4).

The loop runs under the lease: one task keeps the lease (Temporal heartbeat plus a
touch of the lease session) beside the agent loop, in one ``asyncio.TaskGroup``; if the
lease is lost the loop is cancelled wherever it is — inside a provider call included —
so a retried attempt never runs a step beside a zombie. The activity returns a small
status (``qimpl.db.runs.outcome``), never the answer: Temporal carries no megabytes.

Why one module of about 440 lines: it is the agent loop of one attempt, read top to
bottom (lease, claim, backoff, restore, steps, count, finish) with every crash point
between its commits; the pieces it delegates already live apart (the fence in
``qimpl.db.owner``, the tool journal in ``qimpl.tool_journal``, output deltas, usage).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import psycopg
from temporalio import activity
from temporalio.exceptions import ApplicationError

from qimpl import metrics
from qimpl.approvals import approval_request
from qimpl.backoff import backoff_left, failure_delay
from qimpl.crashpoints import declare
from qimpl.db import runs as repo
from qimpl.db.lease import OwnershipLease
from qimpl.db.lease_carriers import AlreadyOwned, LeaseCarriers
from qimpl.db.owner import RunOwner
from qimpl.db.sessions import bound_session, keepalive_params
from qimpl.errors import (
    SAFE_MESSAGES,
    DeadlinePassed,
    LeaseSessionUnavailable,
    LockNotAcquired,
    LostOwnership,
    ProviderFailed,
)
from qimpl.legacy import run_inline
from qimpl.lifecycle import TERMINAL, RunState
from qimpl.provider import Provider, StepContext, StepResult
from qimpl.takeover import first_heartbeat_s, home_queue
from qimpl.tool_journal import store as journal_db
from qimpl.tool_journal.rules import tool_results
from qimpl.tool_journal.seam import ToolRegistry
from qimpl.tool_journal.steps import ToolSteps
from qimpl.usage import reported_tokens
from qimpl.watcher import move_home
from qimpl.workflows.deltas import OutputDeltas
from qimpl.workflows.types import FailInput, RunInput

__all__ = ["AgentActivities"]

log = logging.getLogger("qimpl.activity")

BEFORE_LEASE = declare("activity.before_lease", "an attempt started, before it asks for the run's lease")
AFTER_CLAIM = declare("activity.after_claim", "the attempt owns the run, before any step")
AFTER_FAILURE_COUNT = declare("activity.after_failure_count",
                              "a failed step is counted, Temporal not yet told when to retry")
BEFORE_FAILURE_REPORT = declare(
    "activity.before_failure_report",
    "a counted failure's attempt closed its lease, Temporal not yet told when to retry")
BEFORE_CHECKPOINT = declare(
    "activity.before_checkpoint_commit", "a step's provider call returned, its checkpoint not yet committed"
)
AFTER_CHECKPOINT = declare("activity.after_checkpoint_commit", "a step's checkpoint is committed")
BEFORE_FINAL = declare("activity.before_final_commit", "the answer is known, `completed` not yet committed")
AFTER_FINAL = declare(
    "activity.after_final_commit", "`completed` is committed, Temporal not yet told"
)


def _merge_usage(total: dict[str, Any], step: dict[str, Any]) -> dict[str, Any]:
    """Add a step's usage counters to the run's; ValueError unless each is an int >= 0 or
    None (a count the provider did not report: unknown, added as nothing; the run's
    observed usage then shows the total as unknown, issue 25 item 9)."""
    out = dict(total)
    for k, v in step.items():
        if v is None:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"usage {k!r} is not a count")
        out[k] = int(out.get(k, 0)) + v
    return out


def _json_object(value: Any, what: str) -> dict[str, Any]:
    """``value`` as a JSON object (ValueError/TypeError when it is not one)."""
    doc = json.loads(json.dumps(dict(value), allow_nan=False))
    if not isinstance(doc, dict):
        raise ValueError(f"{what} is not a JSON object")
    return doc


@contextlib.asynccontextmanager
async def _counted(run_id: str, step: int) -> AsyncIterator[None]:
    """Storing a step's result: any failure while the lease session lives — a value the
    database refuses (a NUL character), one the runtime refuses (a NaN, a negative count),
    a lock or statement timeout — is one counted failure (R-EXEC-6, R-EXEC-12), so the step
    is asked of the provider a bounded number of times. Lost ownership and the deadline
    pass through; a lost session means the lease is gone, and the next attempt retries."""
    try:
        yield
    except (LostOwnership, DeadlinePassed):
        raise
    except Exception as exc:  # noqa: BLE001 - any failure after the provider call is counted
        log.warning("step %s of run %s could not be stored: %s", step, run_id, type(exc).__name__,
                    extra={"run_id": run_id, "step": step})
        raise _StepFailed(f"unstored_result:{type(exc).__name__}") from None


@contextlib.asynccontextmanager
async def _restoring(run_id: str) -> AsyncIterator[None]:
    """Reading what an attempt goes on from, before it asks the provider: the latest
    checkpoint (whose fold raises ValueError on a broken delta chain), the tool journal,
    the workspace grant, the last failure's backoff, a step's asks. Any failure while the
    lease session lives is one counted failure (R-EXEC-6), ``unrestored_state:<type>``,
    so a run whose state cannot be read ends ``failed`` with a safe code after
    ``max_provider_failures`` attempts, each after its backoff, instead of failing an
    attempt that Temporal retries without limit until the deadline expires the run
    (issue 56, item 3). Only the exception's type is logged, never its text. Lost
    ownership and the deadline pass through; after a lost session the count itself
    fails, and the next attempt retries as after any lost lease."""
    try:
        yield
    except (LostOwnership, DeadlinePassed):
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to read the run's state is counted
        log.warning("run %s could not be restored: %s", run_id, type(exc).__name__,
                    extra={"run_id": run_id, "event": "activity.restore_failed"})
        raise _StepFailed(f"unrestored_state:{type(exc).__name__}") from None


def _failure_kind(exc: Exception) -> str:
    """The log's and the call record's word for a provider error: its fixed ``code``
    when it is a ``ProviderFailed`` (R-PROV-1), else its type's name; never its text."""
    code = exc.code if isinstance(exc, ProviderFailed) else type(exc).__name__
    return f"provider_error:{code}"


async def _settle(owner: RunOwner, call: int, **outcome: Any) -> None:
    """Record a provider call's outcome (R-Q34-2). A database error while the session
    lives leaves the record ``started`` (no outcome seen; the call is still counted);
    a refusal (LostOwnership) passes through: the owner stops."""
    try:
        await owner.call_ended(call, **outcome)
    except psycopg.Error as exc:
        log.warning("outcome of provider call %s of run %s not recorded: %s", call, owner.run_id,
                    type(exc).__name__, extra={"run_id": owner.run_id})


class _StepFailed(Exception):
    """A counted failure of one step (R-EXEC-6); ``kind`` names its class for the log and
    the run; ``retry_after_s`` is how long the provider asked to be left alone (None: it
    did not say)."""

    def __init__(self, kind: str, retry_after_s: float | None = None) -> None:
        super().__init__(kind)
        self.kind = kind
        self.retry_after_s = retry_after_s


def _nothing() -> None:
    """The claim callback of an attempt that heartbeated first thing."""


class AgentActivities:
    """Activities bound to one database and one provider (created by the worker)."""

    def __init__(self, *, dsn: str, provider: Provider, tools: ToolRegistry | None = None,
                 slot_limit: int = 0, lock_timeout_s: float = 5.0,
                 carriers: LeaseCarriers | None = None, unclaimed_s: float = 0.3) -> None:
        self.dsn = dsn
        #: The takeover watcher's bound for a silent unclaimed attempt, seconds
        #: (``QIMPL_TAKEOVER_UNCLAIMED_S``): sets when a first attempt heartbeats.
        self.unclaimed_s = unclaimed_s
        #: The worker's lease sessions, each carrying many runs' locks
        #: (``qimpl.db.lease_carriers``); None: each attempt connects its own.
        self.carriers = carriers
        self.provider = provider
        self.tools = ToolSteps(tools or ToolRegistry())
        self.slot_limit = slot_limit
        self.lock_timeout_s = lock_timeout_s
        #: Attempts running now that the takeover watcher moved to this worker's takeover
        #: queue (each takes one of its takeover slots).
        self.taken_over = 0
        #: This worker's own (lease, heartbeat timeout), seconds: its lease sessions and
        #: heartbeat throttle are sized for them; None: not checked.
        self.own_timing: tuple[float, float] | None = None
        self._timing_warned: set[tuple[float, float]] = set()

    @activity.defn(name="run_agent_v2")
    async def run_agent(self, inp: RunInput) -> dict[str, Any]:
        """Run the agent loop for one generation; returns the run's saved outcome (a small
        status: ``run_id, state, row_version, generation, error_code``).

        Raises ApplicationError (retryable) when the lock is busy, no tenant slot is free,
        a step failed (counted in the run) or ownership was lost while the run is live.
        """
        attempt = activity.info().attempt
        self._check_timing(inp)
        moved = home_queue(activity.info().task_queue) != activity.info().task_queue
        # A heartbeat before the claim: the takeover watcher tells an attempt that runs from
        # one a paused worker's poll took and never runs by it (R-EXEC-13). A retry sends it
        # first thing; a first attempt only if it has not claimed the run by then
        # (``qimpl.takeover.first_heartbeat_s``).
        delay = first_heartbeat_s(attempt, moved=moved, unclaimed_s=self.unclaimed_s)
        beat: asyncio.TimerHandle | None = None
        if delay <= 0:
            activity.heartbeat()
        else:
            beat = asyncio.get_running_loop().call_later(delay, activity.heartbeat)
        self.taken_over += moved
        try:
            return await self._run_agent(inp, attempt, beat.cancel if beat else _nothing)
        except ApplicationError as exc:
            if exc.type in ("StepFailure", "DeadlineWait"):  # the lease is closed; the report is next
                await BEFORE_FAILURE_REPORT.areach(run_id=inp.run_id, attempt=attempt)
            raise
        finally:
            self.taken_over -= moved
            if beat is not None:
                beat.cancel()

    def _check_timing(self, inp: RunInput) -> None:
        """Warn once per pair (``owner.timing_differs``) when a run was dispatched with a
        lease or heartbeat timeout other than this worker's own: the run gets the API's,
        but this worker's lease sessions (a lease of another length connects its own) and
        heartbeat throttle (``qimpl.takeover.heartbeat_throttle_s``) were sized for its own."""
        got = (inp.lease, inp.heartbeat_timeout_s)
        if self.own_timing is None or got == self.own_timing or got in self._timing_warned:
            return
        self._timing_warned.add(got)
        log.warning("run %s was dispatched with lease %s s and heartbeat timeout %s s; this worker "
                    "has %s s and %s s: set QIMPL_LEASE_S and QIMPL_HEARTBEAT_TIMEOUT_S alike on the "
                    "API and the workers", inp.run_id, *got, *self.own_timing,
                    extra={"event": "owner.timing_differs", "run_id": inp.run_id,
                           "lease_s": got[0], "heartbeat_timeout_s": got[1]})

    async def _run_agent(self, inp: RunInput, attempt: int, claimed: Callable[[], None]) -> dict[str, Any]:
        await BEFORE_LEASE.areach(run_id=inp.run_id, attempt=attempt)
        try:
            async with OwnershipLease(
                self.dsn, inp.run_id, lease_s=inp.lease,
                application_name=f"qimpl-owner:{inp.run_id}", tenant_id=inp.tenant_id,
                carriers=self.carriers, writer=f"{inp.run_id}:{inp.generation}:{attempt}",
            ) as lease:
                return await self._under_lease(lease, inp, attempt, claimed)
        except AlreadyOwned as exc:
            # A second attempt of a run this worker owns (a reset's or a timed-out attempt's
            # retry delivered here while the old one still runs): its lock would be granted
            # again on the shared session; refused before any work (R-EXEC-2).
            log.warning("run %s (attempt %s): %s", inp.run_id, attempt, exc,
                        extra={"event": "owner.already_owned", "run_id": inp.run_id, "attempt": attempt})
            raise ApplicationError(str(exc), type="LockNotAcquired") from None
        except LockNotAcquired as exc:
            raise ApplicationError(str(exc), type="LockNotAcquired") from None
        except LeaseSessionUnavailable as exc:
            # Nothing claimed or written: not a lost ownership (owner.fenced), its own signal.
            metrics.LEASE_SESSIONS_UNAVAILABLE.inc()
            log.warning("run %s (attempt %s): %s", inp.run_id, attempt, exc,
                        extra={"event": "owner.no_lease_session", "run_id": inp.run_id, "attempt": attempt})
            raise ApplicationError(str(exc), type="LeaseSessionUnavailable") from None
        except (LostOwnership, psycopg.OperationalError,
                psycopg.errors.IdleInTransactionSessionTimeout) as exc:
            saved = await self._saved_outcome_if_terminal(inp.run_id, inp.tenant_id)
            if saved is not None:
                return saved
            log.warning("lost ownership of run %s (attempt %s): %s", inp.run_id, attempt, exc,
                        extra={"event": "owner.fenced", "run_id": inp.run_id, "attempt": attempt})
            raise ApplicationError("lost ownership", type="LostOwnership") from None

    async def _under_lease(self, lease: OwnershipLease, inp: RunInput, attempt: int,
                           claimed: Callable[[], None]) -> dict[str, Any]:
        """The agent loop beside the lease keeper and the Temporal heartbeat, in one task
        group: losing the lease cancels the loop within a touch interval (L / 4), inside a
        provider call included (R-EXEC-11). The heartbeat has a task of its own, so a
        statement waiting on a lock never delays it. Re-raises the first real error."""

        # Every touch interval (L / 4), or a quarter of the heartbeat timeout when that is
        # shorter (a lease far above H): the SDK sends at most one per
        # qimpl.takeover.heartbeat_throttle_s.
        every = min(lease.touch_interval_s, inp.heartbeat_timeout_s / 4)

        async def heartbeat() -> None:
            # Not at once: the claim below holds the run's lock, and a run that ends within
            # that interval costs Temporal no heartbeat.
            while True:
                await asyncio.sleep(every)
                activity.heartbeat()

        async def keep() -> None:
            # Not at once either: the lease was verified a moment ago, and the claim reads
            # the run's state itself, so a run that ended before this attempt is answered
            # by the claim (R-EXEC-5) rather than by a touch racing it.
            while True:
                await asyncio.sleep(lease.touch_interval_s)
                await lease.touch()  # LostOwnership when the session is gone

        try:
            async with asyncio.TaskGroup() as group:
                beats = group.create_task(heartbeat())
                keeper = group.create_task(keep())
                loop = group.create_task(self._loop(lease, inp, attempt, claimed))
                loop.add_done_callback(lambda _: (keeper.cancel(), beats.cancel()))
        except BaseExceptionGroup as failed:
            raise _first_error(failed) from None
        return loop.result()

    async def _loop(self, lease: OwnershipLease, inp: RunInput, attempt: int,
                    claimed: Callable[[], None]) -> dict[str, Any]:
        claim = await RunOwner.claim(lease.conn, inp.run_id, generation=inp.generation,
                                     attempt=attempt, slot_limit=self.slot_limit,
                                     task_token=activity.info().task_token, live=lease.live,
                                     lease_s=lease.lease_s)
        if claim.owner is None:
            if claim.waiting_for_slot and claim.row["generation"] == inp.generation:
                # No tenant slot free (R-EXEC-9): stay queued; Temporal retries (<= 1 s backoff).
                raise ApplicationError("no tenant slot free", type="SlotUnavailable")
            return repo.outcome(claim.row)  # R-EXEC-5: terminal, parked or superseded
        claimed()  # the run is ours and its lock held: no heartbeat before the loop's own
        owner, row = claim.owner, claim.row
        info = activity.info()
        if home_queue(info.task_queue) != info.task_queue:
            # Taken over on this worker's takeover queue (qimpl.takeover): later retries go
            # to the shared queue again.
            home = await move_home(activity.client(), namespace=str(info.workflow_namespace),
                                   workflow_id=str(info.workflow_id), activity_id=info.activity_id)
            log.info("run %s: attempt %s claimed on the takeover queue %s", inp.run_id, attempt,
                     info.task_queue, extra={"event": "owner.claimed_on_takeover_queue",
                                             "run_id": inp.run_id, "attempt": attempt,
                                             "task_queue": info.task_queue, "moved_home": home})
        await AFTER_CLAIM.areach(run_id=inp.run_id, attempt=attempt)
        try:
            if int(row["provider_failures"]) >= inp.max_provider_failures:
                # The last counted failure's attempt died before it could end the run.
                code = "agent_attempts_exhausted"
                return repo.outcome(await owner.fail(code, SAFE_MESSAGES[code]))
            async with _restoring(inp.run_id):
                await self._wait_out_backoff(owner, row, inp)
            return await self._steps(owner, row, inp)
        except DeadlinePassed:
            return repo.outcome(await owner.expire())
        except _StepFailed as failure:
            return await self._count(owner, inp, failure, counted=int(row["provider_failures"]))

    async def _steps(self, owner: RunOwner, row: dict[str, Any], inp: RunInput) -> dict[str, Any]:
        async with _restoring(inp.run_id):  # nothing asked yet: a failure here is counted too
            checkpoint = await repo.latest_checkpoint(owner.conn, inp.run_id)
            step = int(checkpoint["step"]) if checkpoint else 0
            state: dict[str, Any] = dict(checkpoint["state"]) if checkpoint else {}
            # The state of the run's latest checkpoint (None until it has one), kept apart
            # from the one the provider is handed: a provider that changes its state in
            # place must not change what the next checkpoint's delta is taken from.
            saved: dict[str, Any] | None = copy.deepcopy(state) if checkpoint else None
            answer: str | None = checkpoint["answer"] if checkpoint else None
            # A park checkpointed by this generation parks again; a resumed one goes on.
            pending: dict[str, Any] | None = (
                checkpoint["pending"] if checkpoint and checkpoint["generation"] == inp.generation else None)
            # The pre-tool checkpoint's calls: settled ones are reused, the rest run (R-TOOL-2).
            calls: list[dict[str, Any]] = list(checkpoint["tool_calls"] or []) if checkpoint else []
            inputs = tuple(str(i) for i in (row["request_json"] or {}).get("inputs", []))
            decisions = tuple((row["request_json"] or {}).get("decisions", []))
            usage: dict[str, Any] = dict(row["usage"] or {})
            results = tool_results(await journal_db.invocations(owner.conn, inp.run_id))
            # Read at every attempt, under the tenant's row-level security: a revoked grant
            # is None from the next attempt on. Never stored, logged or projected (R-READ-3).
            workspace_id = str(row["workspace_id"])
            grant = await repo.workspace_grant(owner.conn, tenant_id=inp.tenant_id,
                                               principal_id=row["principal_id"], workspace_id=workspace_id)
        while answer is None and pending is None:
            if calls:
                async with _counted(inp.run_id, step):
                    park, usage = await self.tools.run(owner, tenant_id=inp.tenant_id, step=step,
                                                       calls=calls, decisions=decisions, usage=usage)
                    if park is not None:
                        return repo.outcome(await owner.park(
                            park.pending, usage=usage, error_code=park.error_code,
                            error_message=park.error_message))
                calls = []
                async with _restoring(inp.run_id):
                    results = tool_results(await journal_db.invocations(owner.conn, inp.run_id))
            if owner.seconds_left() <= 0:
                return repo.outcome(await owner.expire())
            step += 1
            async with _restoring(inp.run_id):
                asked = await owner.asks(step)
            if asked >= inp.max_provider_failures:
                # Asked that often and never saved: each attempt died between the answer and
                # the checkpoint (a poison step). Bounded like counted failures (R-EXEC-12).
                log.warning("step %s of run %s asked %s times without a checkpoint: failing the run",
                            step, inp.run_id, inp.max_provider_failures,
                            extra={"run_id": inp.run_id, "step": step, "event": "step.asks_exhausted"})
                code = "agent_step_asks_exhausted"
                return repo.outcome(await owner.fail(code, SAFE_MESSAGES[code]))
            result = await self._ask(owner, StepContext(
                run_id=inp.run_id, tenant_id=inp.tenant_id, generation=inp.generation,
                attempt=owner.attempt, step=step, prompt=row["prompt"], state=state,
                inputs=inputs, decisions=decisions, tool_results=results,
                tools=self.tools.registry.describe(), workspace_id=workspace_id, grant_token=grant))
            if result is None:  # the deadline passed during the call (R-EXEC-8)
                return repo.outcome(await owner.expire())
            async with _counted(inp.run_id, step):
                state = _json_object(result.state, "state")
                usage = _merge_usage(usage, dict(result.usage))
                answer = result.answer
                pending = _json_object(result.pending, "pending") if result.pending is not None else None
                calls = self.tools.plan(inp.run_id, step, result.tool_calls)
                if calls and (answer is not None or pending is not None):
                    raise ValueError("a step that asks for tool calls has no answer and parks nothing")
                if pending is not None and pending.get("kind") == "approval":
                    pending = approval_request(inp.run_id, inp.generation, step, pending)
                await BEFORE_CHECKPOINT.areach(run_id=inp.run_id, step=step, attempt=owner.attempt)
                await owner.checkpoint(step, state=state, usage=usage, answer=answer, pending=pending,
                                       tool_calls=calls, previous=saved)
                saved = copy.deepcopy(state)
            await AFTER_CHECKPOINT.areach(run_id=inp.run_id, step=step, attempt=owner.attempt)
        async with _counted(inp.run_id, step):
            if pending is not None:
                return repo.outcome(await owner.park(pending, usage=usage))
            await BEFORE_FINAL.areach(run_id=inp.run_id, attempt=owner.attempt)
            done = await owner.complete(answer or "", usage=usage)
        await AFTER_FINAL.areach(run_id=inp.run_id, attempt=owner.attempt)
        return repo.outcome(done)

    async def _ask(self, owner: RunOwner, ctx: StepContext) -> StepResult | None:
        """One provider call bounded by the deadline. Returns None when the *deadline*
        passed during it; a provider's own timeout, or any other provider error, is a
        counted failure (_StepFailed), never an expiry (R-EXEC-12).

        The call is recorded before it is made and settled after (observed usage,
        R-Q34-2): a record the database refuses (LostOwnership, DeadlinePassed) means the
        call is not made."""
        call = await owner.call_started(ctx.step)
        deltas = OutputDeltas(owner, ctx.step)
        await owner.before_call()  # paused since the record? then the lease may be gone
        try:
            async with asyncio.timeout(owner.seconds_left()) as deadline:
                result = await self.provider.step(dataclasses.replace(ctx, emit=deltas.emit))
                await deltas.flush()
        except (LostOwnership, DeadlinePassed):
            raise  # a streamed delta was refused: this attempt no longer owns the run
        except TimeoutError:
            if deadline.expired():
                await _settle(owner, call, status="cancelled", code="deadline_exceeded")
                return None
            kind, retry_after = "provider_timeout", None
        except Exception as exc:  # noqa: BLE001 - any provider error is one counted failure
            kind = _failure_kind(exc)
            retry_after = exc.retry_after_s if isinstance(exc, ProviderFailed) else None
        else:
            tokens_in, tokens_out = reported_tokens(result.usage)
            await _settle(owner, call, status="succeeded", input_tokens=tokens_in,
                          output_tokens=tokens_out)
            return result
        log.warning("provider failed at step %s of run %s: %s", ctx.step, ctx.run_id, kind,
                    extra={"run_id": ctx.run_id, "step": ctx.step})
        await _settle(owner, call, status="failed", code=kind, retry_after_s=retry_after)
        raise _StepFailed(kind, retry_after)

    async def _wait_out_backoff(self, owner: RunOwner, row: dict[str, Any], inp: RunInput) -> None:
        """Wait what is left of the last counted failure's backoff, or of its provider's
        ``Retry-After`` when that is longer, before the first ask
        (``qimpl.backoff.backoff_left``, R-EXEC-6): Temporal's retry delay is the failing
        attempt's to set, and a retry that came without it (its report lost to a takeover
        of its lease, a crash after the count) must not ask sooner. Holding the lease."""
        failures = int(row["provider_failures"])
        if failures < 1:
            return
        last = await owner.last_failure()
        since, retry_after = last if last is not None else (None, None)
        left = min(backoff_left(failures, since, base_s=inp.failure_backoff_s,
                                max_s=inp.failure_backoff_max_s, retry_after_s=retry_after),
                   max(owner.seconds_left(), 0.0))
        if left > 0:
            log.info("run %s waits %.1f s more of its failure backoff (failure %s)", inp.run_id, left, failures,
                     extra={"event": "activity.backoff_resumed", "run_id": inp.run_id, "delay_s": left})
            await asyncio.sleep(left)

    async def _count(self, owner: RunOwner, inp: RunInput, failure: _StepFailed, *, counted: int) -> dict[str, Any]:
        """Count a failed step durably; after ``max_provider_failures`` end the run
        ``failed`` with a safe code, else fail the attempt so Temporal retries it after the
        failure's backoff (``qimpl.backoff``: doubling from ``failure_backoff_s``, at least
        the provider's ``Retry-After``, never past the deadline), not at once: a model
        server that is down for a while is waited out (issue 25, item 8).

        ``counted``: the run's failures before this one (the claim's row: no other writer
        counts while this attempt owns the run), so the count's own write stores when the
        retry is due (``retry_not_before``) and the watcher leaves the run alone until then."""

        def delay_after(failures: int) -> float:
            return failure_delay(failures, base_s=inp.failure_backoff_s, max_s=inp.failure_backoff_max_s,
                                 retry_after_s=failure.retry_after_s, deadline_left_s=owner.seconds_left())

        try:
            failures = await owner.count_failure(failure.kind, retry_in_s=delay_after(counted + 1))
            if failures >= inp.max_provider_failures:
                code = "agent_attempts_exhausted"
                return repo.outcome(await owner.fail(code, SAFE_MESSAGES[code]))
        except DeadlinePassed:
            return repo.outcome(await owner.expire())
        await AFTER_FAILURE_COUNT.areach(run_id=inp.run_id, attempt=owner.attempt)
        left = owner.seconds_left()
        # The same reading of the time left for the delay and the comparison below: two
        # readings apart, a delay cut to the deadline came out a hair below "left".
        delay = failure_delay(failures, base_s=inp.failure_backoff_s, max_s=inp.failure_backoff_max_s,
                              retry_after_s=failure.retry_after_s, deadline_left_s=left)
        if delay >= left:
            # No ask fits before the deadline (a Retry-After past it): a retry at the
            # deadline would race the activity's schedule-to-close, which Temporal may
            # refuse or time out. The workflow waits for the deadline instead and expires
            # the run there (DEADLINE_WAIT_PATCH_ID); this stays one counted failure.
            log.info("run %s waits for its deadline, %.1f s away (failure %s of %s: %s)", inp.run_id,
                     left, failures, inp.max_provider_failures, failure.kind,
                     extra={"event": "activity.waits_for_deadline", "run_id": inp.run_id, "delay_s": left})
            raise ApplicationError(f"step failed ({failure.kind}); {failures} of {inp.max_provider_failures};"
                                   " no ask before the deadline", type="DeadlineWait", non_retryable=True)
        log.info("run %s asks again in %.1f s (failure %s of %s: %s)", inp.run_id, delay, failures,
                 inp.max_provider_failures, failure.kind,
                 extra={"event": "activity.failure_backoff", "run_id": inp.run_id, "delay_s": delay})
        raise ApplicationError(f"step failed ({failure.kind}); {failures} of {inp.max_provider_failures}",
                               type="StepFailure", next_retry_delay=timedelta(seconds=delay))

    async def _connect(self, tenant_id: str) -> psycopg.AsyncConnection[Any]:
        """A short-lived connection scoped to ``tenant_id`` (row-level security)."""
        conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True,
                                                     application_name="qimpl-worker",
                                                     **keepalive_params(self.lock_timeout_s))
        await conn.execute("SELECT set_config('qimpl.tenant', %s, false)", (tenant_id,))
        await bound_session(conn, lock_timeout_s=self.lock_timeout_s)
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
        message = (SAFE_MESSAGES.get(inp.error_code)
                   or "the agent could not complete after repeated attempts")
        async with await self._connect(inp.tenant_id) as conn:
            row = await repo.end_unowned(conn, inp.run_id, generation=inp.generation, state=target,
                                         error_code=inp.error_code, error_message=message)
            if row is None:
                row = await repo.get_run(conn, inp.run_id)
        if (row is not None and target == RunState.EXPIRED and row["generation"] == inp.generation
                and row["state"] in (RunState.ACCEPTED, RunState.QUEUED, RunState.RUNNING)):
            # Temporal's clock reached the deadline before the database's: never expire
            # early (R-EXEC-12); Temporal retries this activity until the database agrees.
            raise ApplicationError("the deadline has not passed by the database's clock",
                                   type="DeadlineNotReached")
        return repo.outcome(row) if row else {"run_id": inp.run_id, "state": "unknown"}

    @activity.defn(name="run_outcome_v2")
    async def run_outcome(self, inp: RunInput) -> dict[str, Any]:
        """The run's saved outcome as the database has it, read only: for a workflow whose
        cancel request came where no activity's answer did (``CANCELLED_STATE_PATCH_ID``
        in ``qimpl.workflows.agent_run``), so that it still tags its final state."""
        async with await self._connect(inp.tenant_id) as conn:
            row = await repo.get_run(conn, inp.run_id)
        return repo.outcome(row) if row else {"run_id": inp.run_id, "state": "unknown"}


def _first_error(group: BaseExceptionGroup[Any]) -> BaseException:
    """The error to raise for a failed task group: the first that is not a cancellation."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _first_error(exc)
        if not isinstance(exc, asyncio.CancelledError):
            return exc
    return group.exceptions[0]


