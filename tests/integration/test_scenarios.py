"""Every registered qualification scenario passes on the embedded stack (each cites its
R-IDs in ``qualify list``; the report maps them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from qualify.runner import run_scenario
from qualify.scenarios import REGISTRY
from qualify.verdict import Verdict


@pytest.mark.req("R-Q-2")
@pytest.mark.parametrize("scenario_id", list(REGISTRY))
def test_scenario_passes(scenario_id: str, stack: Any, tmp_path: Path) -> None:
    result = run_scenario(stack, REGISTRY[scenario_id], seed=20261130, out_dir=tmp_path)
    failed = [f"{c.name}: {c.detail}" for c in result.checks if c.ok is not True]
    assert result.verdict is Verdict.PASS, (result.verdict, failed, result.error[-2000:])
