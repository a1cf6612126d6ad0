"""A run whose checkpoint cannot be restored (issue 56, item 3): a failure before the
first provider call of an attempt is a counted failure like any other, so the run ends
``failed`` with a safe code after ``QIMPL_PROVIDER_MAX_FAILURES`` attempts, long before
its deadline, instead of being retried by Temporal until the deadline expires it
(R-EXEC-6, R-EXEC-12)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import psycopg
import pytest

from tests.conftest import assert_eventually
from tests.integration.deployed import Deployed, create, deployed

MAX_FAILURES = 3
#: Far beyond what MAX_FAILURES counted failures take (backoff 0.2 s doubling): only an
#: attempt retried without a count would still be going at it.
DEADLINE_S = 120
#: The state every step carries: large, so each checkpoint after the first is a delta.
BIG = "x" * 2000


@pytest.fixture
def deployment(stack: Any) -> Iterator[Deployed]:
    with deployed(stack, "restore") as d:
        yield d


@pytest.mark.req("R-EXEC-6", "R-EXEC-12")
def test_a_broken_delta_chain_fails_the_run_after_the_counted_bound(deployment: Deployed) -> None:
    dsn = deployment.dsn
    limit = {"QIMPL_PROVIDER_MAX_FAILURES": str(MAX_FAILURES)}
    api = deployment.processes.api(**limit)
    worker = deployment.processes.worker(**limit)
    with httpx.Client(base_url=api.base_url, headers={"Authorization": "Bearer dev-key"}, timeout=10) as http:
        # Steps 1 and 2 are checkpointed (2 as a delta); step 3 holds at a barrier, then
        # fails once (attempt 1): the next attempt must restore from the checkpoints.
        run_id = create(http, {"steps": 4, "state": {"big": BIG}, "barrier": {"step": 3, "name": "b"},
                               "fail": {"steps": [3], "attempts": [1]}}, deadline_s=DEADLINE_S)
        reached = deployment.control / "barrier.b.reached"
        assert_eventually(reached.exists, timeout=timedelta(seconds=30), what="step 3 at its barrier")
        with psycopg.connect(dsn, autocommit=True) as conn:
            kinds = conn.execute("SELECT step, state_json IS NULL FROM run_checkpoints WHERE run_id = %s"
                                 " ORDER BY step", (run_id,)).fetchall()
            assert kinds == [(1, False), (2, True)], kinds  # a whole state, then a delta
            # Break the chain as the table's owner with its guard off for one transaction (the
            # checkpoint guard refuses every change otherwise, and fires under any
            # session_replication_role: 20261213_090000_hardening_four): step 2's delta now
            # appends to a list with a number.
            with conn.transaction():
                conn.execute("ALTER TABLE run_checkpoints DISABLE TRIGGER run_checkpoints_guard")
                conn.execute("UPDATE run_checkpoints SET state_delta = '{\"append\": {\"trail\": 5}}'"
                             " WHERE run_id = %s AND step = 2", (run_id,))
                conn.execute("ALTER TABLE run_checkpoints ENABLE ALWAYS TRIGGER run_checkpoints_guard")
        (deployment.control / "barrier.b.release").touch()

        def ended() -> bool:
            return http.get(f"/v1/agents/a1/runs/{run_id}").json()["state"] not in (
                "accepted", "queued", "running")

        # Counted, the run fails within seconds (three failures 0.2 and 0.4 s apart, each
        # attempt within a Temporal retry); uncounted, it would run until its deadline.
        assert_eventually(ended, timeout=timedelta(seconds=45), what="the run ended")
        run = http.get(f"/v1/agents/a1/runs/{run_id}").json()
    assert (run["state"], run["error_code"]) == ("failed", "agent_attempts_exhausted"), run
    assert run["last_failure_code"] == "unrestored_state:ValueError", run
    message = run["error_message"] or ""
    assert "append" not in message and "ValueError" not in message and "trail" not in message, message
    with psycopg.connect(dsn, autocommit=True) as conn:
        failures, left = conn.execute(
            "SELECT provider_failures, extract(epoch FROM deadline_at - completed_at) FROM runs"
            " WHERE run_id = %s", (run_id,)).fetchone() or (None, None)
        codes = [r[0] for r in conn.execute(
            "SELECT data->>'code' FROM run_events WHERE run_id = %s AND kind = 'failure' ORDER BY seq",
            (run_id,)).fetchall()]
        claims = conn.execute("SELECT count(DISTINCT owner_attempt) FROM run_transitions"
                              " WHERE run_id = %s AND new_state = 'running'", (run_id,)).fetchone()
    assert failures == MAX_FAILURES
    assert codes == ["provider_error:SyntheticFailure"] + ["unrestored_state:ValueError"] * (MAX_FAILURES - 1)
    assert float(left) > DEADLINE_S / 2, f"ended {left} s before its deadline"
    # One claim per counted attempt, not one a second until the deadline.
    assert claims is not None and claims[0] <= MAX_FAILURES + 1, claims
    # The broken chain's own words (the ValueError's text) are in no log.
    logs = worker.log_path.read_text(errors="replace")
    assert "which is not a list or a string" not in logs
