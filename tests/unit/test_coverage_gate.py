"""The requirement gate (R-Q-8): coverage by passing checks, not by citations."""

from __future__ import annotations

from typing import Any

import pytest

from qualify.coverage import gate


def _sc(sid: str, status: str, *checks: tuple[str, bool | None, tuple[str, ...]],
        cites: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"id": sid, "status": status, "requirements": list(cites),
            "checks": [{"name": n, "ok": ok, "requirements": list(r)} for n, ok, r in checks]}


@pytest.mark.req("R-Q-8")
def test_only_a_passing_check_in_a_passing_scenario_covers() -> None:
    scenarios = [
        _sc("a", "pass", ("c1", True, ("R-A",)), cites=("R-A", "R-B")),  # R-B only cited
        _sc("b", "fail", ("c2", True, ("R-C",))),                        # scenario failed
        _sc("c", "pass", ("c3", None, ("R-D",))),                        # checker raised
    ]
    judged = gate(scenarios, ["R-A", "R-B", "R-C", "R-D", "R-E"], waived={"R-E": "not built"})
    assert judged["covered"] == {"R-A": ["a: c1"]}
    assert judged["uncovered"] == ["R-B", "R-C", "R-D"]
    assert judged["waived"] == {"R-E": "not built"}


@pytest.mark.req("R-Q-8")
def test_a_waiver_for_a_covered_requirement_is_stale() -> None:
    judged = gate([_sc("a", "pass", ("c", True, ("R-A",)))], ["R-A"], waived={"R-A": "old"})
    assert judged["uncovered"] == [] and judged["waived"] == {} and judged["stale_waivers"] == ["R-A"]
