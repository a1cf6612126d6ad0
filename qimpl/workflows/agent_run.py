"""The agent-run workflow: one generation of one run (R-EXEC-1). Version 3 is what the
dispatch starts; version 2 stays registered so that its histories still replay (R-EXEC-10).

Deterministic: the workflow only schedules activities; timeouts derive from the
time left before the run's deadline (R-EXEC-8).
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, RetryState, TimeoutType
from temporalio.exceptions import CancelledError as ActivityCancelledError
from temporalio.exceptions import TimeoutError as ActivityTimeoutError

with workflow.unsafe.imports_passed_through():
    from qimpl.workflows import search_attributes as attrs
    from qimpl.workflows.types import FailInput, RunInput

__all__ = ["CANCELLED_STATE_PATCH_ID", "DEADLINE_WAIT_PATCH_ID", "REDISPATCH_PATCH_ID", "WORKFLOW_TYPE", "AgentRunWorkflowV2",
           "AgentRunWorkflowV3"]

MIN_TIMEOUT = timedelta(seconds=1)

#: The workflow type the dispatch starts (``qimpl.dispatch``).
WORKFLOW_TYPE = "AgentRunWorkflowV3"

#: Behind this patch in version 2 (always in version 3), an agent activity Temporal ended
#: with a ScheduleToStart timeout (an attempt that never started: a retry stranded on a
#: dead worker's takeover queue and moved by a watcher, ``qimpl.takeover.should_move``) is
#: scheduled again, on the workflow's own task queue, instead of failing the run
#: (R-EXEC-13). Recorded at the workflow's first task, so a watcher can tell from the
#: history whether a version-2 workflow re-dispatches (``qimpl.watcher``); a history
#: recorded before it replays without it.
REDISPATCH_PATCH_ID = "qimpl-redispatch-unstarted-1"

#: Behind this patch (both versions), an agent activity Temporal gave up on before the
#: run's deadline because its next retry would start after the activity's
#: schedule-to-close timeout, which is the deadline (a counted failure whose backoff or
#: ``Retry-After``, cut to the deadline, reaches it: ``qimpl.backoff.failure_delay``),
#: waits for the deadline and expires the run, instead of failing it early: only the
#: deadline expires a run, and one rate limit is one counted failure (R-EXEC-12,
#: R-EXEC-6; issue 56, item 9). A history recorded before it fails such a run
#: ``agent_activity_failed`` as it did, and replays so.
DEADLINE_WAIT_PATCH_ID = "qimpl-wait-for-the-deadline-1"

#: Behind this patch (both versions), a tagged workflow whose cancel request reaches it
#: where no activity's result does — the agent activity answered in the very activation
#: the cancel arrived in (the SDK then raises the cancel, not the answer: two cancels of
#: one run 16 ms apart), while it waits for the deadline, or while ``fail_run_v2`` runs —
#: reads the run's state (``run_outcome_v2``), sets ``QimplRunState`` to it and
#: completes, as every other way it ends does, instead of ending ``Canceled`` with no
#: state (issue 56, item 13). A history recorded before it ends as it did, and replays so.
CANCELLED_STATE_PATCH_ID = "qimpl-cancelled-state-1"


def _never_started(err: ActivityError) -> bool:
    """Whether the activity ended because no attempt of it started in time."""
    return isinstance(err.cause, ActivityTimeoutError) and err.cause.type == TimeoutType.SCHEDULE_TO_START


def _out_of_time(err: ActivityError) -> bool:
    """Whether the activity ended for lack of time before the deadline, not for what an
    attempt reported: its last counted failure leaves no ask before the deadline (its
    ``DeadlineWait``, ``qimpl.workflows.activities``), or Temporal gave it up because its
    next retry would start after its schedule-to-close timeout (the deadline)."""
    return err.retry_state == RetryState.TIMEOUT or (
        isinstance(err.cause, ApplicationError) and err.cause.type == "DeadlineWait")


def _cancelled(exc: BaseException) -> bool:
    """Whether ``exc`` is the workflow's cancel request: raised into its code, or as the
    cancellation of the activity it was waiting for."""
    return isinstance(exc, asyncio.CancelledError) or (
        isinstance(exc, ActivityError) and isinstance(exc.cause, ActivityCancelledError))


class _Generation:
    """What both versions run: the agent activity until it returns, and the run's state
    as a search attribute when ``tagged``."""

    #: Whether an activity that never started is scheduled again (``REDISPATCH_PATCH_ID``).
    _redispatch: bool

    async def _tagged(self, inp: RunInput, tagged: bool) -> dict[str, Any]:
        try:
            outcome = await self._generation(inp)
        except (asyncio.CancelledError, ActivityError) as exc:
            if not (tagged and _cancelled(exc) and workflow.patched(CANCELLED_STATE_PATCH_ID)):
                raise
            # Whoever cancels wrote the run's end first (the API's cancel, the reconciler's
            # expiry): the database says how this generation ended.
            workflow.logger.info("run %s: cancel request; reading the run's state", inp.run_id)
            outcome = await workflow.execute_activity(
                "run_outcome_v2", inp, start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=2)))
        if tagged and isinstance(outcome.get("state"), str):
            workflow.upsert_search_attributes([attrs.RUN_STATE.value_set(outcome["state"])])
        return outcome

    async def _generation(self, inp: RunInput) -> dict[str, Any]:
        while True:
            left = datetime.fromisoformat(inp.deadline_at) - workflow.now()
            budget = max(left, MIN_TIMEOUT)
            try:
                result: dict[str, Any] = await workflow.execute_activity(
                    "run_agent_v2",
                    inp,
                    schedule_to_close_timeout=budget,
                    heartbeat_timeout=timedelta(seconds=inp.heartbeat_timeout_s),
                    # Unlimited attempts, bounded by the deadline: a crashed, paused or fenced
                    # attempt must never use up a run's retries (an attempt handed to a paused
                    # worker's outstanding poll is lost, too). Provider failures are counted in
                    # the run itself and end it `failed` (R-EXEC-6).
                    retry_policy=RetryPolicy(
                        initial_interval=timedelta(milliseconds=200),
                        backoff_coefficient=2.0,
                        maximum_interval=timedelta(seconds=1),
                        maximum_attempts=0,
                    ),
                )
                return result
            except ActivityError as err:
                deadline = datetime.fromisoformat(inp.deadline_at)
                overdue = workflow.now() >= deadline
                if self._redispatch and not overdue and _never_started(err):
                    # Nothing of it ran: the run's lease, checkpoint and fence are as the
                    # last attempt left them, and the next attempt claims as any retry.
                    workflow.logger.warning("run %s: activity never started; scheduled again", inp.run_id)
                    continue
                if not overdue and _out_of_time(err) and workflow.patched(DEADLINE_WAIT_PATCH_ID):
                    # A retry the deadline leaves no room for (a Retry-After past it): the
                    # run waits for its deadline, unowned, and then expires; a cancel
                    # meanwhile cancels it (the API cancels the row first).
                    workflow.logger.info("run %s: no retry before the deadline; waiting for it", inp.run_id)
                    await workflow.sleep(deadline - workflow.now())
                    overdue = True
                code = "deadline_exceeded" if overdue else "agent_activity_failed"
                workflow.logger.warning("run %s: activity gave up (%s)", inp.run_id, type(err.cause).__name__)
                failed: dict[str, Any] = await workflow.execute_activity(
                    "fail_run_v2",
                    FailInput(run_id=inp.run_id, generation=inp.generation, error_code=code,
                              state="expired" if overdue else "failed", tenant_id=inp.tenant_id),
                    start_to_close_timeout=timedelta(seconds=30),
                    retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=2)),
                )
                return failed


@workflow.defn(name="AgentRunWorkflowV3")
class AgentRunWorkflowV3(_Generation):
    """Started with its tenant, run id and generation as search attributes (``qimpl.dispatch``,
    so a generation no worker ran yet is found by tenant): it records no command for them and
    no patch marker, and always schedules a never-started activity again (R-EXEC-13). A
    worker of before it fails its workflow tasks (type not registered) until one of today
    takes them, so no history of it is ever written by other code."""

    @workflow.run
    async def run(self, inp: RunInput) -> dict[str, Any]:
        self._redispatch = True  # version 3 re-dispatches a never-started activity
        return await self._tagged(inp, inp.search_attributes)


@workflow.defn(name="AgentRunWorkflowV2")
class AgentRunWorkflowV2(_Generation):
    """Version 2, for its histories (R-EXEC-10): it sets the tenant, run id and generation
    itself, and both that and the re-dispatch are behind patches, so a history recorded
    before either replays without their commands."""

    @workflow.run
    async def run(self, inp: RunInput) -> dict[str, Any]:
        # A patch is evaluated once; its answer is memoised for the rest of the run.
        tagged = inp.search_attributes and workflow.patched(attrs.PATCH_ID)
        self._redispatch = workflow.patched(REDISPATCH_PATCH_ID)
        if tagged:
            workflow.upsert_search_attributes([
                attrs.TENANT.value_set(inp.tenant_id), attrs.RUN_ID.value_set(inp.run_id),
                attrs.GENERATION.value_set(inp.generation)])
        return await self._tagged(inp, tagged)
