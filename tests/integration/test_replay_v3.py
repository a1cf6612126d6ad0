"""Histories of workflow version 3 replay on today's code (R-EXEC-10). The history was
recorded by ``tests/data/record_history.py`` on the code that introduced
``AgentRunWorkflowV3``: a real two-step run, started with its search attributes, with no
patch marker. A change to version 3's commands fails here; it needs a version 4."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from qimpl.workflows import search_attributes as attrs
from qimpl.workflows.agent_run import AgentRunWorkflowV3
from qimpl.workflows.types import RunInput
from qimpl.workflows.worker import WORKFLOWS

HISTORY = Path(__file__).parents[2] / "qualify" / "data" / "agent_run_v3_history.json"


def _replay(workflows: list[type]) -> Exception | None:
    history = WorkflowHistory.from_json("agent-run-v3", HISTORY.read_text())
    result = asyncio.run(Replayer(workflows=workflows).replay_workflow(history, raise_on_replay_failure=False))
    return result.replay_failure


@pytest.mark.req("R-EXEC-10")
def test_a_version_3_history_replays() -> None:
    assert _replay(list(WORKFLOWS)) is None


@workflow.defn(name="AgentRunWorkflowV3", sandboxed=False)
class _TagsItself(AgentRunWorkflowV3):
    """Version 3 setting the tenant itself again, as version 2 did: a command the recorded
    history lacks, what the test above must catch. (A ``workflow.patched`` call would not
    be: on replay it answers False where the history has no marker.)"""

    @workflow.run
    async def run(self, inp: RunInput) -> dict[str, Any]:
        self._redispatch = True
        workflow.upsert_search_attributes([attrs.TENANT.value_set(inp.tenant_id)])
        return await self._tagged(inp, inp.search_attributes)


@pytest.mark.req("R-EXEC-10")
def test_replay_catches_a_changed_version_3() -> None:
    assert _replay([_TagsItself]) is not None
