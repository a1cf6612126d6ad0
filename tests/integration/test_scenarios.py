"""Every registered qualification scenario passes on the embedded stack (each cites its
R-IDs in ``qualify list``; the report maps them).

By default each scenario runs here, on the session's stack. With
``QUALIFY_SCENARIOS_SUMMARY`` set to the ``summary.json`` of a full ``qualify run`` of
this very commit (a clean tree: ``.ci/run`` runs the README's main job first), each test
judges that run's result for its scenario instead of running the scenario a second time
(issue 24: CI ran every scenario twice). A summary of another commit, of a dirty tree or
without the scenario fails the test: it never passes by default.
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from qualify.provenance import git_sha
from qualify.runner import run_scenario
from qualify.scenarios import REGISTRY
from qualify.verdict import Verdict

SUMMARY = os.environ.get("QUALIFY_SCENARIOS_SUMMARY", "")


@cache
def _summary_docs() -> dict[str, dict[str, Any]]:
    summary = json.loads(Path(SUMMARY).read_text())
    sha, dirty = git_sha(Path(__file__).parent)
    assert summary.get("git_sha") == sha and not summary.get("git_dirty") and not dirty, (
        f"{SUMMARY} is of {summary.get('git_sha')} (dirty={summary.get('git_dirty')}), "
        f"this tree is {sha} (dirty={dirty}): run the scenarios here instead")
    return {doc["id"]: doc for doc in summary["scenarios"]}


@pytest.mark.req("R-Q-2")
@pytest.mark.parametrize("scenario_id", list(REGISTRY))
def test_scenario_passes(scenario_id: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if SUMMARY:
        doc = _summary_docs().get(scenario_id)
        assert doc is not None, f"{scenario_id} is not in {SUMMARY}"
        failed = [f"{c['name']}: {c['detail']}" for c in doc["checks"] if c["ok"] is not True]
        assert doc["status"] == "pass", (doc["status"], failed, doc.get("error", "")[-2000:])
        return
    stack = request.getfixturevalue("stack")
    result = run_scenario(stack, REGISTRY[scenario_id], seed=20261130, out_dir=tmp_path)
    failed = [f"{c.name}: {c.detail}" for c in result.checks if c.ok is not True]
    assert result.verdict is Verdict.PASS, (result.verdict, failed, result.error[-2000:])
