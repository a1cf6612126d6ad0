"""A scenario's own look-up of Temporal (R-Q-2): what Temporal answers about a workflow
is a finding — the scenario fails a ``scenario invariant`` check — never a harness crash."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from qualify.errors import InvariantViolation
from qualify.processes import Deployment
from qualify.scenarios.base import ScenarioContext


@pytest.mark.integration
@pytest.mark.req("R-Q-2")
def test_a_workflow_temporal_does_not_have_fails_a_check(stack: Any, tmp_path: Path) -> None:
    deployment = Deployment(dsn="postgresql://unused@127.0.0.1:1/unused",
                            temporal_address=stack.info.temporal_address, task_queue="q-lookups",
                            control_dir=tmp_path, logs_dir=tmp_path)
    ctx = ScenarioContext(deployment=deployment, processes=None, history=None,  # type: ignore[arg-type]
                          nemesis=None, rng=None)  # type: ignore[arg-type]
    with pytest.raises(InvariantViolation, match="no such workflow"):
        ctx.workflow_result("agent-run-never-started-g1", timeout_s=5)
    with pytest.raises(InvariantViolation, match="no such workflow"):
        ctx.workflow_outcome("agent-run-never-started-g1", timeout_s=5)
