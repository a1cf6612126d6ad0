"""The worker's workflow runner (issue 21): qimpl's workflows run unsandboxed unless
``QIMPL_WORKFLOW_SANDBOX`` asks for temporalio's sandbox, which imports the workflow
module afresh for every run (about 4-5 ms of the worker's CPU a run). What the sandbox
would catch at run time is judged here and in the replay tests instead: every
registered workflow passes the sandbox's own checks, and recorded histories replay in
it (``tests/integration/test_replay_*.py``, R-EXEC-10)."""

from __future__ import annotations

import asyncio

import pytest
from temporalio import workflow
from temporalio.worker import UnsandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from qimpl.settings import ConfigError, WorkerSettings, load
from qimpl.workflows.worker import WORKFLOWS, workflow_runner


@pytest.mark.req("R-EXEC-10")
@pytest.mark.parametrize("cls", WORKFLOWS, ids=lambda c: c.__name__)
def test_workflows_pass_the_sandbox(cls: type) -> None:
    """The sandbox imports the workflow's module under its restrictions and builds an
    instance: a non-deterministic call at import, or a module it refuses, fails here."""
    async def prepare() -> None:
        SandboxedWorkflowRunner().prepare_workflow(workflow._Definition.must_from_class(cls))

    asyncio.run(prepare())


@pytest.mark.req("R-EXEC-10")
def test_the_worker_runs_workflows_unsandboxed_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QIMPL_DATABASE_URL", "postgresql://u@127.0.0.1:1/d")
    assert isinstance(workflow_runner(load(WorkerSettings)), UnsandboxedWorkflowRunner)
    monkeypatch.setenv("QIMPL_WORKFLOW_SANDBOX", "true")
    assert isinstance(workflow_runner(load(WorkerSettings)), SandboxedWorkflowRunner)


def test_the_worker_runs_on_uvloop_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvloop

    from qimpl.workflows.worker import event_loop_factory

    monkeypatch.setenv("QIMPL_DATABASE_URL", "postgresql://u@127.0.0.1:1/d")
    with asyncio.Runner(loop_factory=event_loop_factory(load(WorkerSettings))) as runner:
        assert isinstance(runner.get_loop(), uvloop.Loop)
    monkeypatch.setenv("QIMPL_EVENT_LOOP", "asyncio")
    with asyncio.Runner(loop_factory=event_loop_factory(load(WorkerSettings))) as runner:
        assert not isinstance(runner.get_loop(), uvloop.Loop)
    monkeypatch.setenv("QIMPL_EVENT_LOOP", "trio")
    with pytest.raises(ConfigError, match="QIMPL_EVENT_LOOP"):
        load(WorkerSettings)
