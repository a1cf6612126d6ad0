"""Model-checked transition guard (R-STATE-1, R-EXEC-7).

A hypothesis state machine drives random sequences of writes — compare-and-set writes
from several writers holding possibly stale snapshots, and blind writes with any
``row_version`` bump — against the real trigger in PostgreSQL and against a pure model
built from ``qimpl.lifecycle``; both must agree on every step.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from qimpl.lifecycle import TERMINAL, RunState, is_allowed

STATES = st.sampled_from(list(RunState))
WRITERS = st.integers(min_value=0, max_value=2)


def model_blind(state: RunState, new: RunState, bump: int) -> str | None:
    """The guard's verdict on ``state -> new`` with ``row_version + bump``: an SQLSTATE or None."""
    if state in TERMINAL:
        return "QG001"
    if bump != 1:
        return "QG003"
    if not is_allowed(state, new):
        return "QG002"
    if new == RunState.EXPIRED:
        return "QG007"  # every run here has its deadline an hour away (R-EXEC-12)
    return None


@pytest.mark.req("R-STATE-1")
@pytest.mark.req("R-EXEC-7")
def test_guard_agrees_with_the_model(stack: Any) -> None:
    conn = psycopg.connect(stack.create_database(), autocommit=True)

    class GuardMachine(RuleBasedStateMachine):
        @initialize(start=STATES)
        def new_run(self, start: RunState) -> None:
            self.run_id = str(uuid.uuid4())
            conn.execute(
                "INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt,"
                " stream_key, deadline_at) VALUES (%s, 't', 'p', 'a', %s, 'x', 'k',"
                " now() + interval '1 hour')", (self.run_id, start.value))
            self.state, self.version = start, 1
            self.snapshots = [(start, 1)] * 3

        def _apply(self, sql: str, params: tuple[Any, ...]) -> tuple[int, str | None]:
            try:
                cur = conn.execute(sql, params)
                return cur.rowcount, None
            except psycopg.Error as exc:
                return 0, exc.sqlstate

        @rule(writer=WRITERS)
        def read(self, writer: int) -> None:
            self.snapshots[writer] = (self.state, self.version)

        @rule(writer=WRITERS, new=STATES)
        def compare_and_set(self, writer: int, new: RunState) -> None:
            _, seen = self.snapshots[writer]
            rows, err = self._apply(
                "UPDATE runs SET state = %s, row_version = %s WHERE run_id = %s AND row_version = %s",
                (new.value, seen + 1, self.run_id, seen))
            if seen != self.version:
                assert (rows, err) == (0, None), "a stale writer must match no row"
                return
            expected = model_blind(self.state, new, 1)
            assert err == expected, f"{self.state} -> {new}: db {err}, model {expected}"
            if expected is None:
                assert rows == 1
                self.state, self.version = new, self.version + 1

        @rule(new=STATES, bump=st.integers(min_value=-1, max_value=2))
        def blind_write(self, new: RunState, bump: int) -> None:
            rows, err = self._apply(
                "UPDATE runs SET state = %s, row_version = row_version + %s WHERE run_id = %s",
                (new.value, bump, self.run_id))
            expected = model_blind(self.state, new, bump)
            assert err == expected, f"{self.state} -> {new} (+{bump}): db {err}, model {expected}"
            if expected is None:
                assert rows == 1
                self.state, self.version = new, self.version + 1

        @invariant()
        def database_matches_model(self) -> None:
            if not hasattr(self, "run_id"):
                return
            row = conn.execute("SELECT state, row_version FROM runs WHERE run_id = %s",
                               (self.run_id,)).fetchone()
            assert row == (self.state.value, self.version)

    try:
        run_state_machine_as_test(
            GuardMachine, settings=settings(max_examples=60, stateful_step_count=25, deadline=None,
                                            database=None))
    finally:
        conn.close()
