"""The requirement gate (R-Q-8, R-Q-12): coverage by passing checks that judged something,
not by citations, not by checkers that found nothing of their kind, not by restated guards.

``tests/data/gate_summary.json`` is the check table of a real full ``qualify run`` (each
scenario's id, status, declared requirements, module and checks; nothing else), written
by ``python -m tests.unit.test_coverage_gate REPORT_DIR/summary.json``. ``.ci/run`` runs
the family tests again on the summary of the run it just made (``QUALIFY_GATE_SUMMARY``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from qualify.checkers import GENERIC_CHECKERS, slot_limit_respected
from qualify.coverage import WAIVED, covers, gate, unreachable_waivers
from qualify.spec_ids import REQUIREMENTS

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "gate_summary.json"


def _sc(sid: str, status: str, *checks: tuple[str, bool | None, tuple[str, ...]],
        cites: tuple[str, ...] = (), judged: int = 1, restates: str = "") -> dict[str, Any]:
    return {"id": sid, "status": status, "requirements": list(cites),
            "checks": [{"name": n, "ok": ok, "requirements": list(r), "judged": judged,
                        **({"restates": restates} if restates else {})} for n, ok, r in checks]}


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


@pytest.mark.req("R-Q-12")
def test_a_check_that_judged_nothing_or_restates_a_guard_covers_nothing() -> None:
    assert covers({"ok": True, "requirements": ["R-A"], "judged": 3}) == ("R-A",)
    assert covers({"ok": True, "requirements": ["R-A"], "judged": 0}) == ()
    assert covers({"ok": True, "requirements": ["R-A"]}) == ()  # a document without the count
    assert covers({"ok": True, "requirements": ["R-A"], "judged": 9, "restates": "QG003"}) == ()
    judged = gate([_sc("a", "pass", ("vacuous", True, ("R-A",)), judged=0),
                   _sc("b", "pass", ("guard", True, ("R-B",)), restates="QG001")], ["R-A", "R-B"], waived={})
    assert judged["covered"] == {} and judged["uncovered"] == ["R-A", "R-B"]


def _all_generic() -> list[Callable[[Sequence[dict[str, Any]]], Any]]:
    return [*GENERIC_CHECKERS, slot_limit_respected(1)]


@pytest.mark.req("R-Q-12")
@pytest.mark.parametrize("checker", _all_generic(), ids=lambda c: c.__name__)
def test_every_generic_checker_on_an_empty_history_judges_and_covers_nothing(
        checker: Callable[[Sequence[dict[str, Any]]], Any]) -> None:
    check = checker([])
    assert check.ok is True, check
    assert check.judged == 0 and covers(check.as_dict()) == (), check


@pytest.mark.req("R-Q-12")
def test_a_history_with_one_plain_run_covers_nothing_of_tools_streams_or_workflows() -> None:
    """The issue's example: a one-run history with no tool, stream, workflow or provider
    record once "covered" 17 requirements; now only what it judged."""
    history = [
        {"type": "client", "op": "create", "phase": "ok", "run_id": "r1", "key": "k", "t": 1.0},
        {"type": "transition", "run_id": "r1", "id": 1, "row_version": 1, "old_state": None,
         "new_state": "accepted", "generation": 1, "owner_attempt": None, "t": 1.0},
        {"type": "transition", "run_id": "r1", "id": 2, "row_version": 2, "old_state": "accepted",
         "new_state": "cancelled", "generation": 1, "owner_attempt": None, "t": 1.1},
        {"type": "run", "run_id": "r1", "state": "cancelled", "row_version": 2, "generation": 1,
         "deadline_t": 100.0, "t": 1.0, "tenant_id": "t"},
    ]
    got = {r for c in (checker(history) for checker in _all_generic()) for r in covers(c.as_dict())}
    assert got == {"R-Q-5"}, got  # every accepted run ended, judged for the one run (the
    # terminal-state safety half restates the guard, QG001, and covers nothing: R-STATE-1)


def _naive_uncovered(scenarios: Sequence[Mapping[str, Any]]) -> list[str]:
    """The rule this gate replaced (any ``ok`` check that cites): kept only to show each
    family test below tells the two apart."""
    cited = {r for sc in scenarios if sc["status"] == "pass" for c in sc["checks"] if c["ok"] is True
             for r in c["requirements"]}
    return [r for r in REQUIREMENTS if r not in cited and r not in WAIVED]


#: Scenario families each of which is the only one to cover some requirement: without it
#: the gate must fail. (Families whose requirements other scenarios also judge — approvals,
#: the deadline, failures, infrastructure, lease, probes, security — leave it green, truly.)
FAMILIES: dict[str, Callable[[Mapping[str, Any]], bool]] = {
    "tool scenarios": lambda sc: sc["module"] == "tools",
    "stream scenarios": lambda sc: sc["module"] == "events",
    "cancel scenarios": lambda sc: any(r.startswith("R-CANCEL-") for r in sc["requirements"]),
    "provider scenarios": lambda sc: sc["module"] == "providers",
    "takeover scenarios": lambda sc: "R-EXEC-13" in sc["requirements"],
    "reconciler scenarios": lambda sc: sc["module"] == "reconciler",
    "legacy scenarios": lambda sc: sc["module"] == "legacy",
    "schema scenarios": lambda sc: sc["module"] == "schema",
    "network scenarios": lambda sc: sc["module"] == "network",
}


def _scenarios(source: str) -> list[dict[str, Any]]:
    """The fixture's scenarios, or those of the summary named by ``QUALIFY_GATE_SUMMARY``."""
    if source == "fixture":
        return list(json.loads(FIXTURE.read_text())["scenarios"])
    return list(trim(json.loads(Path(os.environ["QUALIFY_GATE_SUMMARY"]).read_text()))["scenarios"])


#: The fixture, and the fresh summary when ``.ci/run`` names one after its ``qualify run``.
SOURCES = ["fixture", *(["fresh"] if os.environ.get("QUALIFY_GATE_SUMMARY") else [])]


@pytest.mark.req("R-Q-12")
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_real_summary_without_a_scenario_family_fails_the_gate(source: str, family: str) -> None:
    scenarios = _scenarios(source)
    assert gate(scenarios, REQUIREMENTS)["uncovered"] == [], "the whole summary must pass the gate"
    gone = [sc for sc in scenarios if FAMILIES[family](sc)]
    kept = [sc for sc in scenarios if not FAMILIES[family](sc)]
    assert gone, f"no {family} in the summary"
    uncovered = gate(kept, REQUIREMENTS)["uncovered"]
    assert uncovered, f"the gate stays green without the {family}"
    assert set(uncovered) <= {r for sc in gone for r in sc["requirements"]}, (
        f"without the {family} the gate misses {uncovered}, which they do not even declare")


@pytest.mark.req("R-Q-12")
@pytest.mark.parametrize("source", SOURCES)
def test_without_the_cancel_scenarios_a_restated_guard_does_not_keep_cancel_covered(source: str) -> None:
    """The issue's finding on a real summary: every scenario's "no write after terminal"
    (a restatement of QG001) cites R-CANCEL-1, so the rule the gate replaced still called
    it covered with all eight cancel scenarios gone; the gate does not."""
    kept = [sc for sc in _scenarios(source) if not FAMILIES["cancel scenarios"](sc)]
    assert "R-CANCEL-1" in gate(kept, REQUIREMENTS)["uncovered"]
    assert "R-CANCEL-1" not in _naive_uncovered(kept)


@pytest.mark.req("R-Q-12")
def test_a_staging_run_waives_only_what_its_refused_scenarios_would_cover() -> None:
    unreachable = unreachable_waivers([("restart-pg", ("R-A", "R-B"))], "refused")
    judged = gate([_sc("a", "pass", ("c", True, ("R-A",)))], ["R-A", "R-B", "R-C"], waived={},
                  unreachable=unreachable)
    assert judged["covered"] == {"R-A": ["a: c"]}
    assert judged["waived"] == {"R-B": "refused: restart-pg"}
    assert judged["uncovered"] == ["R-C"] and judged["stale_waivers"] == []


def _staged(scenarios: list[dict[str, Any]], refused: Sequence[Any], ran_ids: set[str],
            unstruck: str = "") -> dict[str, Any]:
    """``full_run_gates`` on the scenarios ``ran_ids`` of a real summary, as if
    ``refused`` had been refused and nothing had struck ``unstruck``."""
    from qualify.session import crash_point_catalog, full_run_gates

    ran = [sc for sc in scenarios if sc["id"] in ran_ids]
    summary: dict[str, Any] = {"verdict": "pass", "crash_points": {
        p: sorted(sc["id"] for sc in ran if p in sc["crash_points"] and p != unstruck)
        for p in crash_point_catalog()}}
    full_run_gates(summary, ran, refused=refused)
    return summary


@pytest.mark.req("R-Q-12", "R-Q-4")
def test_a_staging_run_of_the_real_summary_is_gated() -> None:
    """``--stack existing`` refuses the scenarios that restart PostgreSQL or Temporal: the
    run is still gated. It passes only by waivers that name the refused scenarios (today:
    a crash point that only ``postgres-restarted-mid-sweep`` strikes; no requirement is
    theirs alone), and remove a family the others need and it fails."""
    from qualify.scenarios import REGISTRY

    scenarios = _scenarios("fixture")
    refused = [REGISTRY[sc["id"]] for sc in scenarios if sc["id"] in REGISTRY and REGISTRY[sc["id"]].needs_platform]
    assert refused, "the catalog has scenarios a staging run refuses"
    ids = {sc["id"] for sc in scenarios} - {r.id for r in refused}
    staged = _staged(scenarios, refused, ids)
    assert staged["verdict"] == "pass", staged.get("error")
    assert staged["uncovered_crash_points"] == []
    assert staged["waived_crash_points"], "no crash point waived: then the test below is the only one of waivers"
    for point, why in staged["waived_crash_points"].items():
        assert why.startswith("refused on a stack the harness did not boot") and any(
            r.id in why and point in r.crash_points for r in refused), (point, why)
    unreached = [sc for sc in scenarios if sc["id"] in ids]
    assert gate(unreached, REQUIREMENTS)["uncovered"] == [], "now a requirement is the refused ones' alone"
    takeover = {sc["id"] for sc in scenarios if FAMILIES["takeover scenarios"](sc)}
    worse = _staged(scenarios, refused, ids - takeover)
    assert worse["verdict"] == "fail" and "R-EXEC-13" in worse["error"], worse.get("error")


@pytest.mark.req("R-Q-12", "R-Q-4")
def test_what_only_a_refused_scenario_covers_is_waived_with_its_name() -> None:
    """A refused scenario that alone declares a crash point and a requirement: both are
    waived, naming it and why; the same run with nothing refused fails on them."""
    from qualify.scenarios import REGISTRY, Scenario

    scenarios = _scenarios("fixture")
    point = "activity.after_claim"
    # The takeover family goes too, with the crash points only its scenarios strike: the
    # refused scenario declares them as well.
    takeover = {sc["id"] for sc in scenarios if FAMILIES["takeover scenarios"](sc)}
    takeover_only = sorted({p for sc in scenarios if sc["id"] in takeover for p in sc["crash_points"]}
                           - {p for sc in scenarios if sc["id"] not in takeover for p in sc["crash_points"]})
    assert "takeover.after_move" in takeover_only
    alone = Scenario("restarts-everything", "a platform scenario", ("R-EXEC-13",), REGISTRY["happy-path"].body,
                     crash_points=(point, *takeover_only), needs_platform=True)
    ids = {sc["id"] for sc in scenarios} - takeover
    staged = _staged(scenarios, [alone], ids, unstruck=point)
    assert staged["verdict"] == "pass", staged.get("error")
    why = "refused on a stack the harness did not boot (it restarts or stops PostgreSQL or Temporal): restarts-everything"
    assert staged["waived_crash_points"] == dict.fromkeys((point, *takeover_only), why)
    assert "restarts-everything" in staged["requirement_gate"]["waived"]["R-EXEC-13"]
    plain = _staged(scenarios, [], ids, unstruck=point)
    assert plain["verdict"] == "fail" and point in plain["error"] and "R-EXEC-13" in plain["error"]


def trim(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The gate's inputs of a ``summary.json``: per scenario id, status, declared
    requirements, crash points, the entry points it exec'd, module
    (``qualify.scenarios.<module>``) and checks."""
    from qualify.scenarios import REGISTRY

    keep = ("name", "ok", "requirements", "judged", "restates")
    return {"from": summary.get("git_sha") or summary.get("provenance", {}).get("git_sha"),
            "scenarios": [{"id": sc["id"], "status": sc["status"], "requirements": sc["requirements"],
                           "crash_points": sc.get("crash_points", []), "execd": sc.get("execd", []),
                           "module": (REGISTRY[sc["id"]].body.__module__.rsplit(".", 1)[-1]
                                      if sc["id"] in REGISTRY else ""),
                           "checks": [{k: c[k] for k in keep if k in c} for c in sc["checks"]
                                      if c.get("requirements")]}
                          for sc in summary["scenarios"]]}


if __name__ == "__main__":  # python -m tests.unit.test_coverage_gate REPORT/summary.json
    doc = trim(json.loads(Path(sys.argv[1]).read_text()))
    rows = ",\n".join(json.dumps(sc) for sc in doc["scenarios"])  # one scenario per line: diffs stay readable
    FIXTURE.write_text(f'{{"from": {json.dumps(doc["from"])}, "scenarios": [\n{rows}\n]}}\n')
