"""The mutant catalog of ``qualify selftest`` (R-Q-9): one small patch per mechanism the
contract relies on, the scenario that must catch it and the check that must fire. Pure
data; ``qualify.selftest`` applies each to a temporary copy of the code and runs it.

A mutant is *caught* when its scenario's verdict is ``fail`` with the named check among
the failed ones. Every patch must still apply exactly once: the self-test refuses a
stale catalog (a mutant that no longer applies proves nothing).

Why one module of about 590 lines: it is one table, pure data, one entry per mechanism
(86 of them); a reviewer reads every mechanism the self-test breaks, and the check that
must catch it, in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CATALOG", "CI_SUBSET", "Mutant", "Patch"]


@dataclass(frozen=True)
class Patch:
    path: str
    old: str
    new: str
    #: When set, the patch applies to the text after this anchor (which must occur exactly
    #: once): a revision carries both the definition its downgrade restores and its own.
    after: str = ""


@dataclass(frozen=True)
class Mutant:
    name: str
    mechanism: str
    patches: tuple[Patch, ...]
    scenario: str
    check: str


GUARD_ALL_WRITES = "qimpl/db/migrations/versions/20261205_090000_guard_all_writes.py"
#: Where that revision's own guard starts (the guard before it, which its downgrade
#: restores, comes first in the file).
_NEW_GUARD = '\nGUARD_SQL = f"""'


def _guard(old: str, new: str) -> Patch:
    """A patch to the triggers 20261205_090000_guard_all_writes installs (its guard
    functions were since replaced: ``_transition_guard``, ``_checkpoint_guard``)."""
    return Patch(GUARD_ALL_WRITES, old, new, after=_NEW_GUARD)


JUDGED_AT = "qimpl/db/migrations/versions/20261210_090000_judged_at.py"
HARDENING_FOUR = "qimpl/db/migrations/versions/20261213_090000_hardening_four.py"


def _transition_guard(old: str, new: str) -> Patch:
    """A patch to the transition guard 20261210_090000_judged_at installs (the one in
    effect; the guard it replaces comes first in that file)."""
    return Patch(JUDGED_AT, old, new, after=_NEW_GUARD)


LATE_CHECKPOINTS = "qimpl/db/migrations/versions/20261209_090000_late_checkpoints.py"
#: The head's ``qimpl_prune_event_streams`` (its retention floor, its bound) is this revision's.
HARDENING_FOUR = "qimpl/db/migrations/versions/20261213_090000_hardening_four.py"


def _checkpoint_guard(old: str, new: str) -> Patch:
    """A patch to the checkpoint guard 20261209_090000_late_checkpoints installs (the one
    in effect; the guard it replaces comes first in that file)."""
    return Patch(LATE_CHECKPOINTS, old, new, after=_NEW_GUARD)


_CHECKPOINT_TRIGGER = ("\nCREATE TRIGGER run_checkpoints_guard BEFORE INSERT OR UPDATE OR DELETE ON"
                       " public.run_checkpoints\n"
                       "    FOR EACH ROW EXECUTE FUNCTION public.run_checkpoints_guard();\n")

CATALOG: tuple[Mutant, ...] = (
    Mutant(
        "skip-checkpoint-restore", "checkpoint restore (R-EXEC-4)",
        (Patch("qimpl/workflows/activities.py",
               "checkpoint = await repo.latest_checkpoint(owner.conn, inp.run_id)", "checkpoint = None"),),
        "worker-killed-mid-activity", "no provider step repeated after its checkpoint"),
    Mutant(
        "lease-without-idle-in-transaction-timeout", "ownership lease bound (R-EXEC-11)",
        (Patch("qimpl/db/lease.py",
               'MANDATORY_SETTINGS = ("idle_session_timeout", "idle_in_transaction_session_timeout", "lock_timeout")',
               'MANDATORY_SETTINGS = ("idle_session_timeout", "lock_timeout")'),),
        "owner-paused-inside-checkpoint-transaction", "a new attempt took over within the lease + 3.5 s (6.5 s)"),
    Mutant(
        "storage-refusal-not-counted", "counted failures (R-EXEC-6, R-EXEC-12)",
        (Patch("qimpl/workflows/activities.py",
               'raise _StepFailed(f"unstored_result:{type(exc).__name__}") from None', "raise"),),
        "unstorable-provider-output", "NUL in the answer: failed agent_attempts_exhausted"),
    Mutant(
        "pre-tool-checkpoint-not-restored", "tool journal replay (R-TOOL-2)",
        (Patch("qimpl/workflows/activities.py",
               'calls: list[dict[str, Any]] = list(checkpoint["tool_calls"] or []) if checkpoint else []',
               "calls: list[dict[str, Any]] = []"),),
        "tool-kill-before-intent-commit", "the sink executed the call exactly 1 time(s), requested as often"),
    Mutant(
        "unknown-outcome-taken-as-settled", "unknown outcomes park (R-TOOL-3)",
        (Patch("qimpl/tool_journal/steps.py",
               '                if row["status"] == "intent":',
               '                if row["status"] == "intent" and False:'),),
        "tool-kill-after-reply", "parked awaiting_input with error_message side_effect_outcome_unknown"),
    Mutant(
        "side-effect-before-intent", "intent before the side effect (R-TOOL-1)",
        (Patch("qimpl/tool_journal/steps.py",
               "            await BEFORE_INTENT.areach(run_id=owner.run_id, step=step, attempt=owner.attempt)",
               "            outcome = await self._invoke(owner, spec, invocation, tenant_id=tenant_id)\n"
               "            await BEFORE_INTENT.areach(run_id=owner.run_id, step=step, attempt=owner.attempt)"),),
        "tool-kill-before-intent-commit", "no tool execution without a committed intent"),
    Mutant(
        "finalising-tool-without-approval", "no automatic finalisation (R-TOOL-5)",
        (Patch("qimpl/tool_journal/seam.py", "return self.requires_approval or self.finalising",
               "return self.requires_approval"),),
        "finalising-tool-needs-approval", "no finalising side effect without its own approval"),
    Mutant(
        "resume-past-unknown-outcome", "reconciliation before resume (R-RESUME-3)",
        (Patch("qimpl/api/routers/controls.py", '    unsettled = await journal_db.unsettled(conn, str(row["run_id"]))',
               "    unsettled: list[dict[str, Any]] = []"),
         _transition_guard(
               "    IF OLD.state = 'awaiting_input' AND NEW.generation > OLD.generation",
               "    IF false AND OLD.state = 'awaiting_input' AND NEW.generation > OLD.generation")),
        "tool-reply-lost", "a normal resume answers 409 run_reconciliation_required"),
    Mutant(
        "tenant-slots-ignored", "tenant slots (R-EXEC-9)",
        (Patch("qimpl/db/owner.py", 'if row["state"] == RunState.QUEUED and slot_limit > 0:',
               'if row["state"] == RunState.QUEUED and slot_limit < 0:'),),
        "tenant-slots", "never more than 2 slot holders"),
    Mutant(
        "stale-action-version-accepted", "approval binding (R-APPROVAL-1)",
        (Patch("qimpl/db/runs.py", 'if pending.get("action_version") != action_version:', "if False:"),),
        "approval-flow", "an unknown action_version is 409 action_version_mismatch and runs nothing"),
    Mutant(
        "denial-runs-the-tool", "a denied call is journaled denied, never run (R-APPROVAL-1)",
        (Patch("qimpl/tool_journal/steps.py", '                if not decision.get("approved"):',
               "                if False:"),),
        "approval-races", "denied: the call the model asked for anyway is journaled denied and never runs"),
    Mutant(
        "approval-decided-without-the-row-lock", "one decision per approval: the run's row lock (R-APPROVAL-1)",
        (Patch("qimpl/db/runs.py", 'SELECT * FROM runs WHERE run_id = %s FOR UPDATE", (run_id,))',
               'SELECT * FROM runs WHERE run_id = %s", (run_id,))'),),
        "approval-races",
        "the held decision wins; every opposite decision that waited on its lock is 409 approval_conflict"),
    Mutant(
        "workflow-id-reuse-allowed", "duplicate workflow ids rejected (R-CREATE-5)",
        (Patch("qimpl/dispatch.py", "id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,",
               "id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,"),),
        "late-sweep-after-the-run-finished", "the late start of the finished run's workflow id was refused: one execution"),
    Mutant(
        "reconciler-ignores-the-grace-period", "the reconciler leaves the API's own dispatch its grace (R-OPS-3)",
        (Patch("qimpl/reconciler.py", "            (res.tenant, grace_s, limit),", "            (res.tenant, 0, limit),"),),
        "reconciler-dispatches-orphan", "dispatched by the reconciler after the grace period, within two sweeps of it"),
    Mutant(
        "reconciler-grace-cut-short", "the reconciler leaves the API's own dispatch its whole grace, not "
        "0.85 of it (R-OPS-3)",
        (Patch("qimpl/reconciler.py", "            (res.tenant, grace_s, limit),", "            (res.tenant, grace_s * 0.85, limit),"),),
        "reconciler-grace-after-resume",
        "the reconciler dispatched nothing: its grace runs from the generation's dispatch request, not from acceptance"),
    Mutant(
        "cancel-without-the-row-lock", "a cancel serialises with the final commit: the run's row lock (R-CANCEL-1)",
        (Patch("qimpl/db/runs.py", """                          " WHERE run_id = %s FOR UPDATE", (run_id,))
        row = await cur.fetchone()
        if row is None:
            raise LookupError(run_id)
        # The harness holds a cancel here""", """                          " WHERE run_id = %s", (run_id,))
        row = await cur.fetchone()
        if row is None:
            raise LookupError(run_id)
        # The harness holds a cancel here"""),),
        "cancel-vs-completion",
        "a cancel holding the row lock wins over the final commit that waited on it: answer true, cancelled, never completed"),
    Mutant(
        "stream-ignores-last-event-id", "stream replay (R-EVENT-2)",
        (Patch("qimpl/api/routers/events.py", "str(run_id), int(last_event_id or 0),", "str(run_id), 0,"),),
        "event-stream", "stream events complete, ordered and ending in the run's terminal state"),
    Mutant(
        "event-catch-up-skipped", "event stream catch-up after the listener resubscribes (R-EVENT-2)",
        (Patch("qimpl/api/event_hub.py",
               "self.wake()  # catch up: events committed while nobody listened", "pass"),),
        "stream-survives-listener-loss",
        "subscriber-1: every event exactly once (none sent again), in order, ending with the terminal event"),
    Mutant(
        "event-written-before-the-step", "events appended at commit, in the change's transaction (R-EVENT-1)",
        (Patch("qimpl/db/migrations/versions/20261202_090000_event_journal.py",
               "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.run_transitions_event();",
               "NOT DEFERRABLE FOR EACH ROW EXECUTE FUNCTION public.run_transitions_event();"),),
        "tool-kill-after-reply", "event journal consistent with the run record"),
    Mutant(
        "event-prune-unbounded", "event stream pruning bound (R-EVENT-5)",
        (Patch(HARDENING_FOUR, "LIMIT least(greatest(p_limit, 0), 100)", "LIMIT greatest(p_limit, 0)"),
         Patch("qimpl/db/events.py", "min(limit, PRUNE_LIMIT)))", "100000))")),
        "event-streams-pruned", "at most 100 event streams pruned per tenant per sweep, only ended runs"),
    Mutant(
        "event-prune-ignores-the-retention", "event streams kept for their retention (R-EVENT-5)",
        (Patch("qimpl/db/events.py", "(float(retention_s), reconciler, min(limit, PRUNE_LIMIT))",
               "(0.0, reconciler, min(limit, PRUNE_LIMIT))"),),
        "event-streams-pruned",
        "no stream pruned before its retention (2 s after its run ended, the database's clock)"),
    Mutant(
        "reconciler-expires-nothing", "reconciler expiry (R-EXEC-8, R-OPS-3)",
        (Patch("qimpl/reconciler.py", 'AND deadline_at <= clock_timestamp()"', 'AND false"'),),
        "expiry-without-worker", "one-shot sweep exits 0 and reports one expiry"),
    Mutant(
        "idempotency-key-not-binding", "idempotency keys (R-CREATE-2)",
        (Patch("qimpl/db/runs.py",
               "            (tenant_id, principal_id, route, idempotency_key, fingerprint, run_id),",
               "            (tenant_id, principal_id, route, f'{idempotency_key}-{run_id}', fingerprint, run_id),"),
         Patch("qimpl/db/runs.py", "                                AND route = %(route)s AND key = %(key)s)",
               "                                AND route = %(route)s AND key = %(key)s AND false)")),
        "same-key-twenty-requests", "exactly one run committed"),
    Mutant(
        "dispatch-identity-not-the-generation", "dispatch identity (R-CREATE-5)",
        (Patch("qimpl/lifecycle.py", 'return f"agent-run-{run_id}-g{generation}"',
               'return f"agent-run-{run_id}-g{generation + 1}"'),),
        "happy-path", "one Temporal workflow per run generation"),
    Mutant(
        "fence-without-row-version", "fenced update: row_version (R-EXEC-7)",
        (Patch("qimpl/db/owner.py",
               '"WHERE run_id = %(run_id)s AND row_version = %(expected)s AND generation = %(generation)s"',
               '"WHERE run_id = %(run_id)s AND generation = %(generation)s"'),),
        "stale-writers-refused", "the fence refuses a stale row_version"),
    Mutant(
        "fence-without-attempt", "fenced update: owner attempt (R-EXEC-7)",
        (Patch("qimpl/db/owner.py", "\" AND owner_attempt = %(attempt)s AND state = 'running'\"",
               "\" AND state = 'running'\""),),
        "stale-writers-refused", "the fence refuses an attempt that never claimed"),
    Mutant(
        "advisory-lock-not-taken", "the run's session advisory lock (R-EXEC-2)",
        (Patch("qimpl/db/lease.py",
               'cur = await conn.execute(f"SELECT pg_try_advisory_lock({lock_key_sql})", (self.run_id,))',
               'cur = await conn.execute("SELECT true")'),),
        "happy-path", "every write by its owner"),
    Mutant(
        "guard-lets-an-attempt-go-back", "transition guard: fencing token only goes forward (R-EXEC-7)",
        (_transition_guard(
               "    IF NEW.generation = OLD.generation AND OLD.owner_attempt IS NOT NULL\n",
               "    IF false AND NEW.generation = OLD.generation AND OLD.owner_attempt IS NOT NULL\n"),),
        "stale-writers-refused", "the guard refuses an attempt taking its generation back (QG008)"),
    Mutant(
        "late-attempt-claims-the-run-back", "the claim's fence: a superseded attempt delivered late "
        "cannot take the run back (R-EXEC-7); both the claim's own check and the guard's QG008 off",
        (Patch("qimpl/db/owner.py",
               'if row["owner_attempt"] is not None and attempt < int(row["owner_attempt"]):',
               "if False:"),
         _transition_guard(
               "    IF NEW.generation = OLD.generation AND OLD.owner_attempt IS NOT NULL\n",
               "    IF false AND NEW.generation = OLD.generation AND OLD.owner_attempt IS NOT NULL\n")),
        "superseded-attempt-delivered-late",
        "the late attempt 1 reached its claim and the fence refused it; it ended without writing"),
    Mutant(
        "worker-logs-the-grant", "grants never appear in logs (R-READ-3)",
        (Patch("qimpl/workflows/activities.py",
               "            result = await self._ask(owner, StepContext(\n",
               '            log.info("asking step %s with grant %s", step, grant)\n'
               "            result = await self._ask(owner, StepContext(\n"),),
        "happy-path", "no workspace grant in any process log"),
    Mutant(
        "database-503-not-logged", "every 503 database_unavailable is logged (issue 22, items 7 and 11)",
        (Patch("qimpl/api/errors.py",
               '    logging.getLogger("qimpl.api").warning(\n        "database unavailable: %s"',
               '    logging.getLogger("qimpl.api").debug(\n        "database unavailable: %s"'),),
        "api-partitioned-from-postgres-mid-create", "the API's log names the 503 database_unavailable it answered"),
    Mutant(
        "guard-expires-early", "transition guard: no expiry before the deadline (R-EXEC-12)",
        (_transition_guard(
               "IF NEW.state = 'expired' AND v_now < OLD.deadline_at THEN",
               "IF false THEN"),),
        "stale-writers-refused", "the guard refuses expired before the deadline (QG007)"),
    Mutant(
        "rls-runs-readable-by-any-tenant", "row-level security (R-AUTH-4)",
        (Patch("qimpl/db/migrations/versions/20261007_230000_run_lifecycle.py",
               "CREATE POLICY tenant_isolation ON runs\n    USING (tenant_id = current_setting('qimpl.tenant', true))",
               "CREATE POLICY tenant_isolation ON runs\n    USING (true)"),),
        "stale-writers-refused", "row-level security: qimpl_api of t-other, read runs: 0 rows"),
    Mutant(
        "cancel-not-delivered", "cancellation reaches the running activity (R-Q34-1)",
        # Both paths: Temporal's cancellation (delivered with a heartbeat) and the lease
        # touch that reads the run's state; either alone stops the step in time.
        (Patch("qimpl/db/lease_carriers.py", "        if state in ENDED_STATES:", "        if False:"),
         Patch("qimpl/api/routers/controls.py",
               "await asyncio.wait_for(handle.cancel(), timeout=svc.settings.dispatch_timeout_s)",
               "pass")),
        "cancel-stops-a-long-step", "the provider step was cancelled within 1 s of the cancel commit"),
    Mutant(
        "provider-call-recorded-after-the-call", "observed usage (R-Q34-2)",
        (Patch("qimpl/workflows/activities.py", "        call = await owner.call_started(ctx.step)\n",
               "        call = 0\n"),
         Patch("qimpl/workflows/activities.py",
               "            tokens_in, tokens_out = reported_tokens(result.usage)\n",
               "            call = await owner.call_started(ctx.step)\n"
               "            tokens_in, tokens_out = reported_tokens(result.usage)\n")),
        "worker-killed-mid-activity", "observed usage counts every provider call"),
    Mutant(
        "usage-from-the-checkpoint", "observed usage (R-Q34-2)",
        (Patch("qimpl/usage.py", "    if durable:\n", "    if False:\n"),),
        "worker-killed-mid-activity", "observed usage counts every provider call"),
    Mutant(
        "provider-timeout-not-a-timeout", "provider failures (R-PROV-1, R-EXEC-12)",
        (Patch("qimpl/providers/openai_chat.py", "            raise ProviderTimedOut() from None",
               '            raise ProviderFailed("provider_error") from None'),),
        "openai-provider-through-the-lifecycle",
        "the provider-call record: both failures counted under safe codes"),

    Mutant(
        "usage-event-not-journaled", "usage events in the event journal (R-EVENT-1, R-Q34-2)",
        (Patch("qimpl/db/migrations/versions/20261207_100000_unknown_tokens.py",
               "    SELECT r.row_version INTO v FROM public.runs r WHERE r.run_id = NEW.run_id;",
               "    RETURN NULL;"),),
        "happy-path", "one usage event per settled provider call"),

    Mutant(
        "output-delta-unfenced", "output deltas are owner writes (R-EVENT-1, R-EXEC-7)",
        (Patch("qimpl/db/migrations/versions/20261202_120000_output_deltas.py",
               "    IF r.state IS DISTINCT FROM 'running' OR r.generation <> p_generation\n"
               "       OR r.owner_attempt IS DISTINCT FROM p_attempt OR r.row_version <> p_row_version THEN",
               "    IF r.state IS DISTINCT FROM 'running' THEN"),),
        "stale-writers-refused", "the output fence refuses a delta from a stale row_version (QG013)"),

    Mutant(
        "checkpoint-split-from-its-fence", "a checkpoint and its row_version bump in one transaction (R-EXEC-3)",
        # The checkpoint commits on its own, just before the fenced UPDATE that bumps the
        # run to its row version: the same values, two commits a millisecond apart.
        (Patch("qimpl/db/owner.py",
               '            what=f"checkpoint {step} of run {self.run_id}", then=insert_checkpoint)',
               '            what=f"checkpoint {step} of run {self.run_id}")'),
         Patch("qimpl/db/owner.py",
               '        await self._write(\n'
               '            "UPDATE runs SET row_version = row_version + 1, checkpoint_step = %(step)s,"',
               '        async with self.conn.transaction(), self.conn.cursor() as cur:\n'
               '            await insert_checkpoint(cur, (self.row_version + 1,))\n'
               '        await self._write(\n'
               '            "UPDATE runs SET row_version = row_version + 1, checkpoint_step = %(step)s,"'),
         # The database's own checkpoint guard (QG015) refuses the split too: off, so that
         # this proves the harness's check, which watches what the database accepted.
         _guard(_CHECKPOINT_TRIGGER, "\n"),
         # ... and the revision that makes every trigger fire always must not look for it.
         Patch(HARDENING_FOUR, '    ("run_checkpoints", "run_checkpoints_guard"),\n', "")),
        "happy-path", "every row committed in its write's transaction"),
    Mutant(
        "watcher-never-fails-a-token", "lease-driven takeover by the owner's task token (R-EXEC-13)",
        (Patch("qimpl/watcher.py",
               "        self.tracker.token_failed(key, token)\n        try:\n",
               "        self.tracker.token_failed(key, token)\n        return\n        try:\n"),),
        "takeover-after-sigkill", "the watcher ended the killed attempt by its task token, not as unclaimed"),
    Mutant(
        "no-takeover-watcher", "lease-driven takeover (R-EXEC-13): the watcher off by default",
        (Patch("qimpl/settings/worker.py",
               "    takeover_watch: bool = Field(\n        default=True,",
               "    takeover_watch: bool = Field(\n        default=False,"),),
        "takeover-after-sigkill",
        "a survivor committed the next checkpoint within the lease + 2 s (3 s) of the kill (heartbeat timeout 30 s)"),
    Mutant(
        "watcher-ignores-unclaimed-attempts", "takeover of a retry a paused worker swallowed (R-EXEC-13)",
        (Patch("qimpl/takeover.py",
               "        return now - seen.pending_since >= bound\n",
               "        return False\n"),),
        "takeover-of-a-swallowed-retry",
        "the watcher failed the swallowed retry (started, never run) within the lease + 3 s (4 s) of the SIGSTOP "
        "(heartbeat timeout 30 s)"),
    Mutant(
        "watcher-never-moves-the-retry",
        "a paused owner's retry goes to the watcher's takeover queue, not to the paused poll (R-EXEC-13)",
        (Patch("qimpl/watcher.py",
               "        if (self.task_queue is None or self.takeover_queue is None",
               "        if True or (self.task_queue is None or self.takeover_queue is None"),),
        "takeover-queue-beats-the-paused-poll",
        "the next attempt claimed the run on the live worker's takeover queue within the lease + 2 s "
        "(3 s; heartbeat timeout 30 s); none was handed to the paused worker's poll"),
    Mutant(
        "workflow-never-redispatches",
        "a never-started activity (ScheduleToStart timeout) is scheduled again, not the run failed (R-EXEC-13)",
        (Patch("qimpl/workflows/agent_run.py",
               "        self._redispatch = True  # version 3 re-dispatches a never-started activity\n",
               "        self._redispatch = False\n"),),
        "retry-stranded-on-a-dead-takeover-queue",
        "the run completed within 15 s of the third worker's start"),
    Mutant(
        "watcher-ignores-the-workflow-version",
        "the watcher knows a version-3 workflow re-dispatches without reading a patch marker (R-EXEC-13)",
        (Patch("qimpl/watcher.py",
               "        answer = _workflow_type(history.events[0] if history.events else None) == WORKFLOW_TYPE or any(\n",
               "        answer = False or any(\n"),),
        "retry-stranded-on-a-dead-takeover-queue",
        "the third worker's watcher moved the timed-out retry off the dead queue"),
    Mutant(
        "watcher-leaves-a-stranded-retry",
        "a timed-out retry on a dead worker's takeover queue is moved off it (R-EXEC-13)",
        (Patch("qimpl/watcher.py",
               "own=self.takeover_queue, redispatches=True)\n",
               "own=self.takeover_queue)\n"),),
        "retry-stranded-on-a-dead-takeover-queue",
        "the third worker's watcher moved the timed-out retry off the dead queue"),
    Mutant(
        "lost-lease-session-ends-every-session",
        "a lost lease session ends the ownership of exactly the runs it carried (R-EXEC-14)",
        (Patch("qimpl/db/lease_carriers.py",
               "            return\n        self.broken = True\n",
               "            return\n        self.broken = True\n"
               "        for other in list(self.peers._carriers if self.peers else []):\n"
               "            await other.break_(reason='a peer was lost')\n"),
         Patch("qimpl/db/lease_carriers.py",
               "        self.broken = False\n        self._keeper",
               "        self.broken = False\n        self.peers: Any = None\n        self._keeper"),
         Patch("qimpl/db/lease_carriers.py",
               "        carrier = Carrier(conn, lease_s=self.lease_s, number=self._numbers)\n",
               "        carrier = Carrier(conn, lease_s=self.lease_s, number=self._numbers)\n"
               "        carrier.peers = self\n")),
        "one-lease-session-terminated",
        "exactly the runs the terminated lease session carried got a new owner; the others kept theirs"),
    Mutant(
        "lease-session-never-touched",
        "a shared lease session is touched every lease / 4, so a live worker keeps it (R-EXEC-11)",
        (Patch("qimpl/db/lease_carriers.py",
               "                await asyncio.sleep(self.lease_s / 4)\n                async with self.turn:",
               "                await asyncio.sleep(3600)\n                async with self.turn:"),),
        "lock-session-killed", "the owner's provider call was cancelled within 1 s of losing its lease"),
    Mutant(
        "lease-session-shared-without-a-turn",
        "each block of a lease's statements holds its shared session alone (R-EXEC-2)",
        (Patch("qimpl/db/lease_carriers.py",
               "        async with self.turn:\n            self.holder = task",
               "        async with contextlib.nullcontext():\n            self.holder = task"),),
        "model-bound-worker-killed", "every write by its owner"),
    Mutant(
        "one-watcher-election-per-database",
        "each task queue elects its own takeover watcher (R-EXEC-13, issue 55)",
        (Patch("qimpl/db/takeover.py",
               "'qimpl-takeover-watcher:' || %(queue)s, 0)",
               "'qimpl-takeover-watcher' || left(%(queue)s, 0), 0)"),),
        "stranded-retry-beside-another-deployment",
        "the third worker's watcher moved the timed-out retry off the dead queue"),
    Mutant(
        "guard-skips-inserts", "the transition guard runs on INSERT too (R-STATE-1)",
        (_guard(
               "CREATE TRIGGER runs_transition_guard BEFORE INSERT OR UPDATE ON public.runs",
               "CREATE TRIGGER runs_transition_guard BEFORE UPDATE ON public.runs"),),
        "stale-writers-refused",
        "the guard refuses a run inserted straight into completed at row version 7 by qimpl_api (QG014)"),
    Mutant(
        "guard-blind-to-null", "the fencing attempt cannot go back through NULL (R-EXEC-7)",
        (_transition_guard(
               "       AND (NEW.owner_attempt IS NULL OR NEW.owner_attempt < OLD.owner_attempt) THEN",
               "       AND NEW.owner_attempt < OLD.owner_attempt THEN"),),
        "stale-writers-refused", "the guard refuses an attempt going back through NULL (QG008)"),
    Mutant(
        "guard-lets-the-prompt-change", "a run's request is immutable after acceptance (R-STATE-1)",
        (_transition_guard(
               "OR NEW.agent_id IS DISTINCT FROM OLD.agent_id OR NEW.prompt IS DISTINCT FROM OLD.prompt",
               "OR NEW.agent_id IS DISTINCT FROM OLD.agent_id"),),
        "stale-writers-refused", "the guard refuses a changed prompt (QG004)"),
    Mutant(
        "guard-lets-generations-jump", "a generation steps by exactly one (R-STATE-1)",
        (_transition_guard(
               "OR NEW.generation IS NULL OR NEW.generation NOT IN (OLD.generation, OLD.generation + 1) THEN",
               "OR NEW.generation < OLD.generation THEN"),),
        "stale-writers-refused", "the guard refuses a generation that jumps (QG004)"),
    Mutant(
        "checkpoint-guard-off", "a checkpoint only from its run's owner (R-EXEC-4, R-EXEC-7)",
        (_guard(_CHECKPOINT_TRIGGER, "\n"),
         Patch(HARDENING_FOUR, '    ("run_checkpoints", "run_checkpoints_guard"),\n', "")),
        "stale-writers-refused",
        "the checkpoint guard refuses a checkpoint of step 99 outside the owner's fenced write (QG015)"),
    Mutant(
        "checkpoint-guard-ignores-the-transaction",
        "a checkpoint only in the transaction of its owner's fenced write (R-EXEC-3)",
        (_checkpoint_guard(
               "       OR NOT EXISTS (SELECT 1 FROM public.run_transitions t\n",
               "       OR false AND NOT EXISTS (SELECT 1 FROM public.run_transitions t\n"),),
        "stale-writers-refused",
        "the checkpoint guard refuses a checkpoint of step 1 outside the owner's fenced write (QG015)"),
    Mutant(
        "checkpoint-guard-ignores-the-deadline",
        "no checkpoint row past its run's deadline, whenever the run's own write was (R-EXEC-8)",
        (_checkpoint_guard("    IF r.lifecycle_version = 2 AND NEW.created_at >= r.deadline_at THEN\n",
                           "    IF false THEN\n"),),
        "stale-writers-refused",
        "the checkpoint guard refuses a checkpoint row after the deadline, its run's write before it (QG006)"),
    Mutant(
        "backoff-forgotten-on-takeover", "a retry that came without Temporal's delay still waits out the backoff (R-EXEC-6)",
        (Patch("qimpl/workflows/activities.py", "            await self._wait_out_backoff(owner, row, inp)\n", ""),),
        "failure-backoff-after-a-lost-report",
        "the next ask came at least the 5 s Retry-After after the counted failure ended, on the database's clock"),
    Mutant(
        "stream-accepts-unknown-event-ids", "a Last-Event-ID the run never sent is refused (R-EVENT-2)",
        (Patch("qimpl/api/routers/events.py",
               "    if last_event_id is not None and int(last_event_id) > int(newest or 0):\n",
               "    if False:\n"),),
        "stream-survives-listener-loss",
        "a Last-Event-ID beyond the live run's journal (one past the journal) is 400 last_event_id_unknown"),
    Mutant(
        "poison-step-asked-forever", "a step is asked a bounded number of times whatever ends its asks (R-EXEC-12)",
        (Patch("qimpl/workflows/activities.py",
               "            if asked >= inp.max_provider_failures:\n",
               "            if False:\n"),),
        "poison-step", "the run failed agent_step_asks_exhausted"),
    Mutant(
        "crash-loop-left-to-the-deadline", "a crash loop is judged by the generic checker, not only by its scenario (R-EXEC-12)",
        (Patch("qimpl/workflows/activities.py",
               "            if asked >= inp.max_provider_failures:\n",
               "            if False:\n"),),
        "poison-step", "no crash loop: each step asked a bounded number of times, attempts make progress"),
    Mutant(
        "deadline-metric-misses-expiries", "the deadline metric counts every expiry (R-OPS-6)",
        (Patch("qimpl/metrics.py", '        if state == "expired":\n            ended = n\n', ""),),
        "expiry-mid-run", "the deadline metric counts the expired run"),
    Mutant(
        "ended-runs-keep-their-requests", "a run that ends asks for nothing (R-READ-2)",
        (Patch("qimpl/db/migrations/versions/20261211_090000_clear_pending.py",
               "    IF NEW.result_json ? 'pending_input' OR NEW.result_json ? 'pending_approval' THEN\n",
               "    IF false THEN\n"),),
        "resume-at-the-deadline", "no ended run's result_json still holds a pending request"),
    Mutant(
        "claims-journaled-as-checkpoints", "a takeover claim is a claim event, not a checkpoint (R-EVENT-1)",
        (Patch("qimpl/db/migrations/versions/20261207_110000_failure_codes.py",
               "                    kind := 'claim';\n", "                    kind := 'checkpoint';\n"),),
        "takeover-after-sigkill", "event journal consistent with the run record"),
    Mutant(
        "streams-unbounded-per-run", "open event streams of one run are bounded (R-EVENT-2)",
        (Patch("qimpl/api/routers/events.py",
               "    if svc.events.streams_of(str(run_id)) >= svc.settings.event_streams_per_run:\n",
               "    if False:\n"),),
        "streams-per-run-bounded",
        "a third stream of the run is 429 too_many_streams with Retry-After, by key, after an event or by token"),
    Mutant(
        "watcher-forgets-the-lost-worker",
        "a retry swallowed by the lost owner's own worker is judged on the short bound (R-EXEC-13)",
        (Patch("qimpl/takeover.py",
               "                seen.lost_workers.add(pending.worker)\n",
               "                pass\n"),),
        "takeover-of-a-swallowed-retry",
        "the swallowed retry was judged as taken by the paused owner's own worker "
        "(the shorter bound: unclaimed / 3)"),
    Mutant(
        "watcher-ignores-the-lock", "the watcher ends only owners whose lease is gone (R-EXEC-13)",
        (Patch("qimpl/db/migrations/versions/20261213_100000_watcher_scale.py",
               "      AND NOT EXISTS (SELECT 1 FROM held\n",
               "      AND NOT EXISTS (SELECT 1 FROM held WHERE false AND\n"),
         Patch("qimpl/db/migrations/versions/20261213_100000_watcher_scale.py",
               "                      WHERE held.key = pg_catalog",
               "                      held.key = pg_catalog")),
        "watcher-never-ends-a-live-owner",
        "the watcher ended only attempts of the killed worker or attempts that never ran"),
    Mutant(
        "one-approval-serves-identical-calls", "one approval runs one call (R-TOOL-5): the used set and the call binding",
        (Patch("qimpl/tool_journal/rules.py", "    taken = set(used)\n", "    taken: set[str] = set()\n"),
         Patch("qimpl/tool_journal/rules.py",
               '            if decision["call_id"] == call_id and decision.get("action_version") == version:',
               '            if True:')),
        "one-approval-one-call", "identical call 2 waited for an approval of its own, 1 run so far"),
    Mutant(
        "guard-lets-a-late-run-resume", "after its deadline a run may only end (QG006 alone, R-EXEC-8)",
        (_transition_guard(
               "    IF OLD.lifecycle_version = 2 AND v_now >= OLD.deadline_at\n",
               "    IF false AND OLD.lifecycle_version = 2 AND v_now >= OLD.deadline_at\n"),),
        "stale-writers-refused",
        "the guard refuses a new generation after the deadline: the run may only end (QG006)"),
    Mutant(
        "guard-lets-a-resume-past-an-unknown-outcome", "no new generation over an unsettled tool call (QG010 alone, R-RESUME-3)",
        (_transition_guard(
               "    IF OLD.state = 'awaiting_input' AND NEW.generation > OLD.generation\n",
               "    IF false AND OLD.state = 'awaiting_input' AND NEW.generation > OLD.generation\n"),),
        "tool-reply-lost", "the guard refuses a new generation while a tool outcome is unknown (QG010)"),
    Mutant(
        "owner-trusts-its-own-clock", "the deadline by the database's clock, counted down on the monotonic one (R-EXEC-8, R-EXEC-12)",
        (Patch("qimpl/db/owner.py",
               '_LEFT = "extract(epoch FROM deadline_at - clock_timestamp())::float8 AS deadline_left_s"',
               '_LEFT = "extract(epoch FROM deadline_at)::float8 AS deadline_left_s"'),
         Patch("qimpl/db/owner.py",
               "        self._deadline_mono = time.monotonic() + deadline_left_s\n",
               "        self._deadline_mono = time.monotonic() + deadline_left_s - time.time()\n")),
        "skewed-worker-clocks-meet-the-deadline",
        "the run of the worker 300 s ahead completed: its own clock did not expire it"),
    Mutant(
        "keeper-touches-inside-the-owners-transaction", "the lease bounds an owner stalled inside its transaction, keeper running (R-EXEC-11)",
        (Patch("qimpl/db/lease.py",
               "        if conn.info.transaction_status != pq.TransactionStatus.IDLE:\n            return\n",
               ""),),
        "owner-held-inside-checkpoint-transaction",
        "a new attempt took over within the lease + 1.5 s (4.5 s) of the stall"),
    Mutant(
        "lease-never-touched", "the lease keeper's touch keeps a live owner's lease (R-EXEC-11, R-EXEC-13)",
        (Patch("qimpl/db/lease.py",
               "        conn = self.conn\n        if conn.info.transaction_status",
               "        return\n        conn = self.conn\n        if conn.info.transaction_status"),),
        "owner-partitioned-from-temporal",
        "the owner's lease session lived through its partition from Temporal"),
    Mutant(
        "confirmation-ignores-the-generation", "a dispatch confirmation names its generation (R-CREATE-5)",
        (Patch("qimpl/db/runs.py",
               "                    WHERE run_id = %s AND generation = %s AND state IN ('accepted', 'queued')\n",
               "                    WHERE run_id = %s AND generation >= %s AND state IN ('accepted', 'queued')\n"),),
        "slow-confirmation-names-its-generation",
        "the late confirmation of generation 1 left generation 2 accepted and unconfirmed"),
    # The network nemesis (R-Q-11): each partition or RPC error guards a mechanism.
    Mutant(
        "reconciler-trusts-one-not-found", "a workflow is judged missing on two sweeps, not one answer (R-OPS-8)",
        (Patch("qimpl/reconciler.py",
               'if status == "missing" and key not in _missing_since:',
               'if False and status == "missing" and key not in _missing_since:'),),
        "reconciler-sees-one-not-found", "one NOT_FOUND did not end the run: it completed"),
    Mutant(
        "watcher-blind-to-a-partitioned-owner", "takeover of an owner cut off from PostgreSQL (R-EXEC-13)",
        (Patch("qimpl/watcher.py",
               "        self.tracker.token_failed(key, token)\n        try:\n",
               "        self.tracker.token_failed(key, token)\n        return\n        try:\n"),),
        "owner-partitioned-from-postgres", "the watcher ended the cut-off attempt by its task token"),
    Mutant(
        "lock-not-taken-under-a-temporal-partition", "the advisory lock keeps a cut-off owner's run (R-EXEC-2)",
        (Patch("qimpl/db/lease.py",
               'cur = await conn.execute(f"SELECT pg_try_advisory_lock({lock_key_sql})", (self.run_id,))',
               'cur = await conn.execute("SELECT true")'),),
        # Which scenario check fires first is Temporal's timing (a retry claims while the
        # owner's session lives, or the owner loses it first); the generic check that every
        # write held the run's advisory lock fires every time.
        "owner-partitioned-from-temporal", "every write by its owner"),
    Mutant(
        "api-waits-on-a-silent-database", "the API's client-side database bound (QIMPL_API_DB_TIMEOUT_S)",
        (Patch("qimpl/db/sessions.py",
               "handle = asyncio.get_running_loop().call_later(seconds, cut)",
               "handle = asyncio.get_running_loop().call_later(3600, cut)"),),
        "api-partitioned-from-postgres-mid-create",
        "a request to the cut-off API got 503 database_unavailable, retryable"),
    Mutant(
        "peer-principal-reads-the-run", "runs are scoped to their principal (R-AUTH-1)",
        (Patch("qimpl/api/deps.py",
               'if row is None or row["principal_id"] != principal.principal_id or row["agent_id"] != agent_id:',
               'if row is None or row["agent_id"] != agent_id:'),),
        "api-contract-matrix", "GET /v1/agents/{agent_id}/runs/{run_id}: every credential kind gets its one answer"),
    Mutant(
        "revoked-key-authenticates", "a revoked API key is no credential (R-AUTH-1)",
        (Patch("qimpl/db/migrations/versions/20261207_090000_key_admin.py",
               'live = "k.revoked_at IS NULL" + (', 'live = "TRUE" + ('),),
        "api-contract-matrix", "POST /v1/agents/{agent_id}/runs: every credential kind gets its one answer"),
    Mutant(
        "age-filter-inverted", "the operator's accepted-age filter keeps the runs that old (R-READ-5)",
        (Patch("qimpl/db/listing.py", "r.accepted_at <= clock_timestamp() - make_interval",
               "r.accepted_at <= clock_timestamp() + make_interval"),),
        "runs-listed", "operator filter accepted at least the split age ago: exactly the database's runs"),
    Mutant(
        "pages-merged-out-of-order", "an operator's pages merge the tenants in accepted order (R-READ-5)",
        (Patch("qimpl/api/paging.py", "reverse=newest_first)", "reverse=not newest_first)"),),
        "runs-listed", "the operator's pages are its tenant's runs, oldest accepted first, each once"),
    Mutant(
        "reconciliation-filter-blind-to-intents", "a run parked on an unknown outcome is listed as "
        "awaiting reconciliation (R-READ-5)",
        (Patch("qimpl/db/listing.py", "t.run_id = r.run_id AND t.status = 'intent'",
               "t.run_id = r.run_id AND t.status = 'requested'"),),
        "tool-kill-after-intent-commit",
        "the operator finds the run by listing runs awaiting reconciliation (and only it)"),
    Mutant(
        "expired-key-authenticates", "a rotated key stops working when its grace ends (R-AUTH-1)",
        (Patch("qimpl/db/migrations/versions/20261207_090000_key_admin.py",
               '" AND (k.expires_at IS NULL OR k.expires_at > pg_catalog.clock_timestamp())" if expiry else ""',
               '"" if expiry else ""'),),
        "api-contract-matrix", "POST /v1/agents/{agent_id}/runs: every credential kind gets its one answer"),
    Mutant(
        "unknown-tokens-read-as-zero", "tokens a provider did not report are unknown, not 0 (R-Q34-2)",
        (Patch("qimpl/usage.py", "usage[key] = None if observed.get(key) is None else int(observed[key])",
               "usage[key] = int(observed.get(key) or 0)"),),
        "happy-path", "observed usage counts every provider call"),
    Mutant(
        "failure-code-not-recorded", "the run names its last counted failure's code (R-EXEC-6)",
        (Patch("qimpl/db/owner.py", "last_failure_code = %(failure_code)s", "last_failure_code = NULL"),),
        "retry-exhaustion", "the run record names its last counted failure's safe code (not its first)"),
    Mutant(
        "terminal-event-without-the-record", "the terminal event equals the run record (R-EVENT-2)",
        (Patch("qimpl/api/events.py", "data.update({k: record[k] for k in RECORD_FIELDS if k in record})",
               "data.update({})"),),
        "retry-exhaustion", "the terminal event equals the run record (state, result, error, usage)"),
    Mutant(
        "failure-backoff-ignored", "counted failures are spaced by the backoff (R-EXEC-6): both layers off",
        # Two layers space the asks: the retry delay the failing attempt hands Temporal,
        # and the next attempt's own wait for what is left of it; either alone keeps the
        # exponential spacing, so this mutant removes both.
        (Patch("qimpl/workflows/activities.py",
               'type="StepFailure", next_retry_delay=timedelta(seconds=delay))', 'type="StepFailure")'),
         Patch("qimpl/workflows/activities.py", "            await self._wait_out_backoff(owner, row, inp)\n", "")),
        "provider-outage-survived", "every run in flight waited out the 30 s outage and completed"),
    Mutant(
        "retry-delay-not-handed-to-temporal",
        "the failing attempt hands its retry delay to Temporal, Retry-After included (R-EXEC-6)",
        # The next attempt's own wait keeps the spacing (its failure record keeps the
        # Retry-After), but it waits holding the run and a worker's slot.
        (Patch("qimpl/workflows/activities.py",
               'type="StepFailure", next_retry_delay=timedelta(seconds=delay))', 'type="StepFailure")'),),
        "provider-outage-survived",
        "Temporal held the 429's retry for its Retry-After: no later attempt claimed the run sooner"),
    Mutant(
        "failure-count-keeps-the-token",
        # Two mechanisms guard this race since issue 55, each masking the other's absence:
        # the count takes the token off the run, and the run is no orphan until its
        # backoff has passed (retry_not_before). Either alone passes the scenario.
        "a counted failure takes its attempt's task token off the run before its report, and the "
        "run is no orphan during its backoff (R-EXEC-13, R-EXEC-6)",
        (Patch("qimpl/db/owner.py",
               'f" last_failure_code = %(failure_code)s, owner_task_token = NULL,"',
               'f" last_failure_code = %(failure_code)s,"'),
         Patch("qimpl/db/migrations/versions/20261213_100000_watcher_scale.py",
               "      AND (r.retry_not_before IS NULL OR r.retry_not_before <= pg_catalog.clock_timestamp())\n",
               "")),
        "failure-reported-after-the-lease",
        "Temporal held the retry for the 3 s Retry-After: no later attempt claimed the run sooner after "
        "the failed call ended, on the database's clock"),
    Mutant(
        "retry-after-not-recorded", "a failed call's record keeps its provider's Retry-After (R-EXEC-6)",
        # Only an attempt that never got the failing attempt's delay from Temporal needs it.
        (Patch("qimpl/workflows/activities.py",
               'await _settle(owner, call, status="failed", code=kind, retry_after_s=retry_after)',
               'await _settle(owner, call, status="failed", code=kind)'),),
        "failure-backoff-after-a-lost-report",
        "the next ask came at least the 5 s Retry-After after the counted failure ended, on the database's clock"),
    Mutant(
        "retry-after-ignored", "a provider's Retry-After is honoured (R-EXEC-6)",
        (Patch("qimpl/backoff.py", "if retry_after_s is not None and retry_after_s > delay:", "if False:"),),
        "provider-outage-survived", "a 429 with Retry-After 8 s was not asked again sooner (the backoff alone says 3 s)"),
    Mutant(
        "stream-token-never-expires", "a stream token stops working at its expiry (R-EVENT-6)",
        (Patch("qimpl/api/routers/events.py", "    if parsed.expires <= found[1]:", "    if False:"),),
        "browser-stream-token",
        "another run's, a forged, an expired and a re-dated token, and none, are refused with their codes"),
    Mutant(
        "cors-allows-any-origin", "cross-origin access for the allow-listed origins only (R-EVENT-6)",
        (Patch("qimpl/api/app.py", "allow_origins=list(settings.cors_origins)", 'allow_origins=["*"]'),),
        "browser-stream-token",
        "CORS: the allowed origin's preflight and request are granted; another origin, or one that only "
        "begins like it, is not"),
    Mutant(
        "stream-token-logged", "stream tokens stay out of the access log (R-EVENT-6)",
        (Patch("qimpl/logs.py", "    handler.addFilter(StreamTokenFilter())\n", ""),),
        "browser-stream-token",
        "the access log shows each token request redacted; no log holds a token or most of one"),
    Mutant(
        "client-listing-shows-the-tenants-runs", "a client lists its own runs only (R-READ-5, R-AUTH-1)",
        (Patch("qimpl/api/routers/listing.py",
               "principal_id=principal.principal_id, agent_id=agent_id)", "agent_id=agent_id)"),),
        "api-contract-matrix",
        "GET /v1/agents/{agent_id}/runs lists the target run to ['owner'] and never to ['other-tenant', 'peer']"),
    Mutant(
        "legacy-create-ignores-the-key-owner", "one key, one request, whichever path it took (R-CREATE-2)",
        (Patch("qimpl/api/routers/runs.py",
               'if record is None or record["fingerprint"] != digest:\n                raise ApiError(422,',
               'if record is None or record["fingerprint"] != digest:\n                raise ApiError(409,'),),
        "idempotency-per-field", "same key, durable_temporal changed: 422 idempotency_key_reused"),
    Mutant(
        "same-key-resume-answered-as-a-rival", "a keyed resume that lost the race answers as its key (R-CREATE-2)",
        (Patch("qimpl/api/routers/controls.py",
               "                    if record is not None:\n                        replay = await replayable(",
               "                    if False:\n                        replay = await replayable("),),
        "same-key-resume-loses-the-race",
        "the held request, which lost the compare-and-set, answers as its key: a replay of that receipt"),
    Mutant(
        "resumed-generation-gets-a-fresh-deadline", "a resume keeps deadline_at (R-RESUME-1, R-EXEC-8)",
        (Patch("qimpl/dispatch.py", 'deadline_at=row["deadline_at"].isoformat(),',
               'deadline_at=(row["deadline_at"] if int(row["generation"]) == 1 else row["deadline_at"]'
               ' + (row["deadline_at"] - row["accepted_at"])).isoformat(),'),),
        "concurrent-resumes", "each workflow started with its own run, generation and deadline_at"),
    Mutant(
        "stream-resumes-at-the-last-event", "Last-Event-ID resumes after that event (R-EVENT-2)",
        (Patch("qimpl/api/events.py", "WHERE run_id = %s AND seq > %s", "WHERE run_id = %s AND seq >= %s"),),
        "stream-every-last-event-id",
        "every Last-Event-ID from 0 to the terminal id: every later event exactly once, in order, "
        "then the terminal event (204 after it)"),
    Mutant(
        "checkpoint-delta-drops-appends", "a delta chain folds back to the checkpointed state (R-EXEC-4)",
        (Patch("qimpl/state_delta.py", "out[key] = [*before, *tail]", "out[key] = list(tail)"),),
        "checkpoint-deltas", "each step was handed the state the previous step checkpointed"),
    Mutant(
        "search-attributes-never-tag-the-outcome", "a generation's workflow tags the run's state (issue 25)",
        (Patch("qimpl/workflows/agent_run.py", 'if tagged and isinstance(outcome.get("state"), str):',
               "if False:"),),
        "runs-found-in-temporal",
        "a query by tenant and state finds each run's generation under its own state only"),
    Mutant(
        "dispatch-starts-untagged", "a generation's workflow is started with its tenant, run id and generation (issue 25)",
        (Patch("qimpl/dispatch.py", "                                   if inp.search_attributes else None),\n",
               "                                   if False else None),\n"),),
        "runs-found-in-temporal",
        "every generation is found in Temporal by tenant and run id, tagged with the tenant, run id, "
        "generation and the state the database holds"),
    Mutant(
        "worker-starts-without-search-attributes", "a worker refuses a namespace without them (R-OPS-3)",
        (Patch("qimpl/workflows/worker.py", "    await check_search_attributes(client, settings)\n", ""),),
        "runs-found-in-temporal",
        "a worker in a namespace without the search attributes exits 64 naming each one"),
    Mutant(
        "cut-stream-counted-unreachable", "a body cut after the 200 is provider_stream_broken (R-PROV-1)",
        (Patch("qimpl/providers/openai_chat.py",
               '"provider_stream_broken" if answered else "provider_unreachable"', '"provider_unreachable"'),),
        "openai-provider-stream-breaks",
        "cut_body: one counted failure under provider_error:provider_stream_broken, then the retry succeeded"),
    Mutant(
        "heartbeat-throttle-uncapped", "heartbeats fresh enough that the watcher beats Temporal's timeout (R-EXEC-13)",
        (Patch("qimpl/workflows/worker.py",
               "return timedelta(seconds=heartbeat_throttle_s(settings.heartbeat_timeout_s, settings.lease))",
               "return timedelta(seconds=0.8 * settings.heartbeat_timeout_s)"),),
        "owner-paused-mid-run",
        "the watcher ended the paused attempt by its task token, before Temporal's heartbeat timeout "
        "could (qimpl.takeover.watcher_margin_s)"),
    Mutant(
        "pool-hands-out-dead-connections", "the API's pool replaces dead connections on checkout",
        (Patch("qimpl/api/deps.py",
               "conn = await checkout(self.pool, self.settings.api_pool_timeout_s, check=_check_and_forget_tenant)",
               "conn = await self.pool.getconn(timeout=self.settings.api_pool_timeout_s)"),),
        "api-pool-connections-killed", "none failed: the pool replaced every dead connection on checkout"),
    Mutant(
        "stream-ends-before-its-terminal-event", "a stream ends with its terminal event (R-EVENT-3)",
        (Patch("qimpl/api/routers/events.py", "int(last_event_id) >= int(newest))", "int(last_event_id) >= int(newest) - 1)"),),
        "stream-every-last-event-id", "terminal - 1: only the terminal event, matching the run record"),
    Mutant(
        "client-settles-a-sent-call", "only an operator records a sent call's outcome (R-TOOL-3, R-OPS-7)",
        (Patch("qimpl/api/routers/tools.py", "_CLIENT_KINDS = frozenset({str(ToolKind.DEVELOPER_HOSTED)})",
               "_CLIENT_KINDS = frozenset({str(ToolKind.DEVELOPER_HOSTED), str(ToolKind.INSTRUMENTED)})"),),
        "tool-reply-lost",
        "a client posting a result for the sent call is 409 tool_call_kind_mismatch and settles nothing"),
    Mutant(
        "provider-timeout-recorded-as-the-deadline", "only the deadline expires a run (R-EXEC-12)",
        (Patch("qimpl/workflows/activities.py", 'kind, retry_after = "provider_timeout", None',
               'kind, retry_after = "deadline_exceeded", None'),),
        "provider-timeout-is-not-the-deadline",
        "recorded as provider_timeout (the provider's own timeout, not the deadline)"),
    Mutant(
        "journaled-result-not-fed", "a retry or resume feeds the journaled result (R-TOOL-2)",
        (Patch("qimpl/tool_journal/rules.py", '"status": r["status"], "result": r["result"], "step"',
               '"status": r["status"], "result": None, "step"'),),
        "developer-hosted-tool", "each provider call was fed the journal's settled outcomes, result included"),
    Mutant(
        "intent-committed-after-the-call", "the intent is committed before the side effect (R-TOOL-1)",
        (Patch("qimpl/tool_journal/steps.py",
               "            await owner.journal(invocation, status=\"intent\", usage=usage)\n"
               "            await AFTER_INTENT.areach(run_id=owner.run_id, step=step, attempt=owner.attempt)\n"
               "            await owner.before_call()  # paused since the intent? then the lease may be gone\n"
               "            outcome = await self._invoke(owner, spec, invocation, tenant_id=tenant_id)\n",
               "            await owner.before_call()  # paused since the intent? then the lease may be gone\n"
               "            outcome = await self._invoke(owner, spec, invocation, tenant_id=tenant_id)\n"
               "            await owner.journal(invocation, status=\"intent\", usage=usage)\n"
               "            await AFTER_INTENT.areach(run_id=owner.run_id, step=step, attempt=owner.attempt)\n"),),
        "tool-call-outcomes", "no tool execution without a committed intent"),
    Mutant(
        "intent-digest-not-of-its-arguments", "the intent records its arguments' digest (R-TOOL-1)",
        (Patch("qimpl/tool_journal/steps.py", '"digest": arguments_digest(call["tool"], call["arguments"])}',
               '"digest": arguments_digest(call["tool"], {})}'),),
        "tool-call-outcomes", "no tool execution without a committed intent"),
    Mutant(
        "lease-four-times-too-long", "PostgreSQL ends a paused owner's session at the lease (R-EXEC-11)",
        (Patch("qimpl/db/lease.py", "    return max(1, int(lease_s * 1000))",
               "    return max(1, int(lease_s * 4000))"),),
        "paused-owner", "PostgreSQL ended the paused owner's lease session within the lease + 0.5 s of "
                        "the pause (database's clock)"),
    Mutant(
        "reconciler-expires-on-its-own-clock", "deadlines on the database's clock (R-EXEC-8)",
        (Patch("qimpl/reconciler.py",
               '" WHERE tenant_id = %s AND state NOT IN {_TERMINAL} AND deadline_at <= clock_timestamp()"\n'
               '            " ORDER BY deadline_at LIMIT %s FOR UPDATE SKIP LOCKED",\n'
               "            (res.tenant, limit),",
               '" WHERE tenant_id = %s AND state NOT IN {_TERMINAL} AND deadline_at <= %s"\n'
               '            " ORDER BY deadline_at LIMIT %s FOR UPDATE SKIP LOCKED",\n'
               "            (res.tenant, datetime.now(UTC), limit),"),),
        "parked-runs-expire", "no sweep met an error (the guard refused no early expiry by the skewed reconciler)"),
    Mutant(
        "sweep-confirms-before-the-start", "a sweep confirms only a dispatch Temporal answered (R-OPS-3)",
        (Patch("qimpl/reconciler.py",
               "        try:\n            started = await dispatch(client, row, settings)",
               "        await repo.confirm_dispatch(conn, run_id, generation)\n"
               "        try:\n            started = await dispatch(client, row, settings)"),),
        "postgres-restarted-mid-sweep", "the run was not yet confirmed while the sweep held after Temporal's start"),
    Mutant(
        "api-work-unbounded", "the API's work bound on a checked-out connection (R-Q-11)",
        (Patch("qimpl/api/deps.py",
               "async with conn, cut_after(conn, self.settings.api_db_timeout_s):",
               "async with conn:"),),
        "api-cut-off-inside-a-create",
        "it was answered within the API's work bound (3 s, QIMPL_API_DB_TIMEOUT_S) of the release"),
    Mutant(
        'tool-outcome-misrecorded', "the journal records the tool's real outcome (R-TOOL-2)",
        (Patch('qimpl/tool_journal/steps.py',
               'return "succeeded", json.loads(json.dumps(dict(result), allow_nan=False))',
               'return "succeeded", {"receipt": "bogus"}'),),
        'tool-kill-before-intent-commit',
        "the journal holds what really happened as the call's outcome: the sink's reply, recorded by the worker"),
    Mutant(
        'tool-calls-counted-twice', 'usage counts each tool call sent once (R-Q34-2)',
        (Patch('qimpl/tool_journal/steps.py',
               '"tool_calls": int(usage.get("tool_calls", 0)) + 1}',
               '"tool_calls": int(usage.get("tool_calls", 0)) + 2}'),),
        'tool-kill-after-reply',
        'usage counts the tool calls sent'),
    Mutant(
        'provider-deltas-not-streamed', 'the provider adapter streams output deltas (R-EVENT-1, R-CREATE-7)',
        (Patch('qimpl/providers/openai_chat.py',
               'if delta and ctx.emit is not None:',
               'if False and ctx.emit is not None:'),),
        'openai-provider-through-the-lifecycle',
        'the answer was streamed as output deltas by the attempt that gave it'),
    Mutant(
        'provider-failures-not-counted', 'a provider failure is counted (R-EXEC-6)',
        (Patch('qimpl/db/owner.py',
               'provider_failures = provider_failures + 1,',
               'provider_failures = provider_failures,'),),
        'openai-provider-truncated-stream',
        'the truncated stream is a counted failure under a safe code'),
    Mutant(
        'approved-call-arguments-changed', 'an approved call runs with the arguments approved (R-APPROVAL-1)',
        (Patch('qimpl/tool_journal/steps.py',
               '            await BEFORE_INTENT.areach(run_id=owner.run_id, step=step, attempt=owner.attempt)',
               '            if spec.needs_approval:\n                invocation = {**invocation, "arguments": {**invocation["arguments"], "bcc": "x@evil.invalid"}}\n                invocation["digest"] = arguments_digest(call["tool"], invocation["arguments"])\n            await BEFORE_INTENT.areach(run_id=owner.run_id, step=step, attempt=owner.attempt)'),),
        'approved-tool-killed-after-effect',
        'the approved tool executed exactly once, with the approved arguments'),
    Mutant(
        'oldest-accepted-metric-of-the-youngest', "the oldest accepted run's age (R-OPS-6)",
        (Patch('qimpl/metrics.py',
               'clock_timestamp() - min(accepted_at)',
               'clock_timestamp() - max(accepted_at)'),),
        'oldest-accepted-metric',
        "the metric is the age of the oldest accepted run by the database's clock (not an older queued run's, not a younger accepted run's)"),
    Mutant(
        'worker-exits-without-its-drain', 'a worker drains its activities on SIGTERM (rolling restarts)',
        (Patch('qimpl/workflows/worker.py',
               'loop.add_signal_handler(sig, stop.set)',
               'loop.add_signal_handler(sig, lambda: os._exit(0))'),),
        'rolling-restarts',
        'each restarted instance ended by itself on its SIGTERM, not SIGKILLed after the grace; a worker exited 0 after its own drain (its worker.stopped line)'),
    Mutant(
        'replay-never-redispatches', 'a replay of an accepted run retries its dispatch (R-CREATE-5)',
        (Patch('qimpl/api/receipts.py',
               '    if row["state"] == RunState.ACCEPTED:\n        try:',
               '    if row["state"] == RunState.ACCEPTED and replayed:\n        return dispatch_unknown(row, headers)\n    if row["state"] == RunState.ACCEPTED:\n        try:'),),
        'dispatch-unknown',
        'the same key once Temporal is back replays and dispatches its run: 202 queued, same receipt'),
    Mutant(
        "dispatch-unbounded", "the API's dispatch bound (R-CREATE-5)",
        (Patch("qimpl/dispatch.py", "                rpc_timeout=timedelta(seconds=settings.dispatch_timeout_s),\n", ""),
         Patch("qimpl/dispatch.py", '            timeout=settings.dispatch_timeout_s,\n        )\n        return "started"',
               '            timeout=None,\n        )\n        return "started"')),
        "dispatch-unknown", "with Temporal silent, 503 durable_dispatch_unknown with the receipt within the dispatch "
                            "bound (2 s, QIMPL_DISPATCH_TIMEOUT_S) + 1 s"),
    Mutant(
        "api-exits-without-its-drain", "an API finishes its requests on SIGTERM (rolling restarts)",
        (Patch("qimpl/api/app.py", "        services.events.start()\n        yield\n",
               "        services.events.start()\n        import os as _os\n        import signal as _signal\n"
               "        _signal.signal(_signal.SIGTERM, lambda *_: _os._exit(0))\n        yield\n"),),
        "rolling-restarts", "a create in flight at its API's SIGTERM was answered 202 queued, and its run completed"),
    Mutant(
        "queued-runs-redispatched-uncounted", "a sweep dispatches a run once, not every sweep (R-OPS-3)",
        (Patch("qimpl/reconciler.py",
               "                   res: SweepResult, limit: int, grace_s: float) -> None:\n",
               "                   res: SweepResult, limit: int, grace_s: float) -> None:\n"
               "    if client is not None:\n"
               "        async with conn.cursor(row_factory=dict_row) as again:\n"
               "            await again.execute(\"SELECT * FROM runs WHERE tenant_id = %s AND state = 'queued'\"\n"
               "                                \" AND dispatch_confirmed_at IS NOT NULL\", (res.tenant,))\n"
               "            for queued in await again.fetchall():\n"
               "                try:\n"
               "                    await dispatch(client, queued, settings)\n"
               "                except Exception:  # noqa: BLE001\n"
               "                    pass\n"),),
        "slot-wait-not-redispatched",
        "Temporal was asked to start B's generation-2 workflow once while B waited (counted at the reconciler's gRPC proxy)"),
    Mutant(
        "workflow-started-again-under-another-id", "one workflow per run generation (R-CREATE-5)",
        (Patch("qimpl/dispatch.py", "    except WorkflowAlreadyStartedError:\n        pass\n",
               "    except WorkflowAlreadyStartedError:\n"
               "        try:\n"
               "            await client.start_workflow(WORKFLOW_TYPE, inp, id=wf_id + \"-again\",\n"
               "                                        task_queue=settings.task_queue)\n"
               "        except WorkflowAlreadyStartedError:\n"
               "            pass\n"),),
        "lost-response-after-dispatch", "one Temporal workflow per run generation"),
    Mutant(
        "stream-closed-at-the-terminal-row", "a stream ends with its terminal event (R-EVENT-3)",
        (Patch("qimpl/api/events.py",
               "                yield event\n                if event[\"event\"] == \"terminal\":\n                    return\n",
               "                if event[\"event\"] == \"terminal\":\n                    return\n                yield event\n"),),
        "event-stream", "stream events complete, ordered and ending in the run's terminal state"),
    Mutant(
        "usage-event-tokens-swapped", "a usage event carries its call's token counts (R-Q34-2)",
        (Patch("qimpl/db/migrations/versions/20261207_100000_unknown_tokens.py",
               "        'input_tokens', NEW.input_tokens, 'output_tokens', NEW.output_tokens,",
               "        'input_tokens', NEW.output_tokens, 'output_tokens', NEW.output_tokens,"),),
        "happy-path", "one usage event per settled provider call"),
    Mutant(
        "provider-call-outlives-the-deadline", "the owner stops a provider call at the deadline (R-EXEC-8)",
        (Patch("qimpl/workflows/activities.py",
               "async with asyncio.timeout(owner.seconds_left()) as deadline:",
               "async with asyncio.timeout(owner.seconds_left() + 5) as deadline:"),),
        "resume-at-the-deadline", "deadline respected"),
    Mutant(
        "checkout-waits-between-dead-sessions", "a pooled session that died with the server is "
        "replaced and the next tried at once, not after 1 s, 2 s ... (R-Q-2)",
        (Patch("qimpl/db/checkout.py", "            skipped += 1\n",
               "            skipped += 1\n            await asyncio.sleep(2 ** (skipped - 1))\n"),),
        "postgres-restart-mid-run", "the API answered its first read after the restart within 0.5 s"),
    Mutant(
        "pool-reconnects-on-its-own-backoff", "after an outage the API's pool connects as soon as the "
        "server is back, not seconds later (R-Q-2)",
        (Patch("qimpl/api/deps.py", "            reconnect_timeout=RECONNECT_TIMEOUT_S,\n", ""),),
        "postgres-down-then-back", "the API accepted a create within 2.5 s of the server's return"),
    Mutant(
        "lease-sessions-reuse-a-lost-one", "after an outage the worker's runs come back as soon as the "
        "server does: a lease session lost while it was down is never handed to a new lease "
        "(R-Q-2, R-EXEC-2)",
        (Patch("qimpl/db/lease_carriers.py",
               "        self._carriers = [c for c in self._carriers if not c.broken]\n",
               "        self._carriers = list(self._carriers)\n"),),
        "postgres-down-with-runs-in-flight", "every accepted run ended in a terminal state"),
)

#: The mutants CI runs on every change (the whole catalog runs with ``qualify selftest``).
CI_SUBSET: tuple[str, ...] = (
    "skip-checkpoint-restore",
    "side-effect-before-intent",
    "finalising-tool-without-approval",
    "unknown-outcome-taken-as-settled",
    "checkpoint-split-from-its-fence",
)
