"""A legacy (inline) run whose answer PostgreSQL cannot store fails at once with a safe
code, never staying ``running`` until its deadline (R-CREATE-6, R-EXEC-6)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest

from qimpl.legacy import run_inline
from qimpl.provider import Provider, StepContext, StepResult


class NulAnswer(Provider):
    async def step(self, ctx: StepContext) -> StepResult:
        return StepResult(state={}, answer="a\x00b", usage={"provider_calls": 1})


@pytest.mark.req("R-EXEC-6", "R-CREATE-6")
def test_an_unstorable_legacy_answer_fails_the_run(stack: Any) -> None:
    dsn = stack.create_database()
    run_id = str(uuid.uuid4())
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt, stream_key,"
            " deadline_at, lifecycle_version, durability) VALUES (%s, 't-dev', 'p-dev', 'a', 'accepted',"
            " 'hi', 'k', now() + interval '1 hour', 1, 'legacy')", (run_id,))

    async def main() -> str:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return str(await run_inline(conn, NulAnswer(), run_id))

    assert asyncio.run(main()) == "failed"
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT state, error_code, error_message FROM runs WHERE run_id = %s",
                           (run_id,)).fetchone()
    assert row == ("failed", "agent_failed", "the agent's answer could not be stored")


class Answers(Provider):
    async def step(self, ctx: StepContext) -> StepResult:
        return StepResult(state={}, answer="done", usage={"provider_calls": 1})


@pytest.mark.req("R-READ-1", "R-CREATE-6")
def test_a_legacy_run_that_ran_reads_when_it_started(stack: Any) -> None:
    """A tester's finding: a completed (or failed) legacy run read ``started_at: null``
    beside its ``completed_at``, although its ``running`` transition was recorded."""
    dsn = stack.create_database()
    runs = {"completed": (str(uuid.uuid4()), Answers()), "failed": (str(uuid.uuid4()), NulAnswer())}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for run_id, _ in runs.values():
            conn.execute(
                "INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt, stream_key,"
                " deadline_at, lifecycle_version, durability) VALUES (%s, 't-dev', 'p-dev', 'a', 'accepted',"
                " 'hi', 'k', now() + interval '1 hour', 1, 'legacy')", (run_id,))

    async def main(run_id: str, provider: Provider) -> str:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return str(await run_inline(conn, provider, run_id))

    for end, (run_id, provider) in runs.items():
        assert asyncio.run(main(run_id, provider)) == end
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT state, accepted_at <= started_at, started_at <= completed_at"
                               " FROM runs WHERE run_id = %s", (run_id,)).fetchone()
        assert row == (end, True, True), (end, row)
