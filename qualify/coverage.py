"""The requirement gate (R-Q-8, R-Q-12): a full run passes only when every requirement of
the spec has a passing *check* that covers it — a check that held in a scenario that
passed, judged at least one item of its kind, and is not a restatement of a database
guard — not merely a scenario that lists it, nor a checker that found nothing to judge.
Pure.

Requirements not qualified by a scenario yet are listed in ``WAIVED`` with the reason
(the open work they wait on, or the tests that cover them outside ``qualify run``); the
report shows them as waived, never as covered, and a waiver for a requirement that a
check now covers is reported as stale so the list only shrinks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["WAIVED", "check_coverage", "covers", "gate", "unreachable_waivers"]

#: Requirement -> why no scenario check covers it yet. Keep it short and honest.
WAIVED: Mapping[str, str] = {
    "R-Q-10": "the soak itself (qualify run --random 1000 -n 4: an hour, not in CI; its report is the evidence), "
              "tests/unit/test_forkserver.py, tests/unit/test_shards.py, tests/integration/test_qualify_run.py",
    "R-OPS-5": "qualified by tests/integration/test_pgbouncer.py (needs PgBouncer in transaction mode)",
    "R-Q-6": "a property of the report itself: tests/unit/test_verdict_and_report.py, "
             "tests/integration/test_qualify_run.py",
    "R-Q-7": "a property of the session: tests/unit/test_determinism.py, tests/integration/test_qualify_run.py",
    "R-Q-8": "this gate: tests/unit/test_coverage_gate.py",
    "R-Q-9": "qualify selftest; tests/integration/test_mutations.py runs the catalog's CI subset",
    # Added to the spec on 2026-12-01: a property of the gate itself, judged by its tests.
    "R-Q-12": "this gate: tests/unit/test_coverage_gate.py (the gate run on a real summary with each "
              "scenario family removed, and every generic checker on an empty history)",
    # Added to the spec on 2026-12-07; waived only until its issue lands.
    "R-Q-13": "not built yet: issue 58 (qualify upgrade --from REF: the rollout from an older release "
              "with runs in flight)",
}


def covers(check: Mapping[str, Any]) -> tuple[str, ...]:
    """The requirements one check (a ``Check.as_dict()``) covers (R-Q-12): those it cites
    when it held (``ok`` True), judged at least one item (``judged`` >= 1; a document
    without the field judged nothing) and restates no database guard (``restates``
    empty). Otherwise none."""
    if check.get("ok") is not True or int(check.get("judged") or 0) < 1 or check.get("restates"):
        return ()
    return tuple(check.get("requirements", ()))


def check_coverage(scenarios: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Requirement -> the ``scenario: check`` pairs that cover it (``covers``) in scenarios
    whose verdict is ``pass``."""
    out: dict[str, list[str]] = {}
    for sc in scenarios:
        if sc.get("status") != "pass":
            continue
        for check in sc.get("checks", []):
            for req in covers(check):
                out.setdefault(req, []).append(f"{sc['id']}: {check['name']}")
    return out


def unreachable_waivers(refused: Iterable[tuple[str, Sequence[str]]], why: str) -> dict[str, str]:
    """Waivers for a run that could not run some scenarios (a staging run's platform
    faults, R-Q-12): each requirement those scenarios name -> ``why`` and which of them
    it waited on. ``refused`` holds ``(scenario id, its requirements)``. The gate applies
    a waiver only to a requirement nothing else covered."""
    by_req: dict[str, list[str]] = {}
    for sid, reqs in refused:
        for req in reqs:
            by_req.setdefault(req, []).append(sid)
    return {req: f"{why}: {', '.join(sids)}" for req, sids in sorted(by_req.items())}


def gate(scenarios: Sequence[Mapping[str, Any]], requirements: Sequence[str],
         waived: Mapping[str, str] = WAIVED, unreachable: Mapping[str, str] | None = None
         ) -> dict[str, Any]:
    """``{"covered": {req: [...]}, "uncovered": [...], "waived": {req: why},
    "stale_waivers": [...]}``: ``uncovered`` (neither covered nor waived) fails a full run.
    ``unreachable`` waives, for this run only, what scenarios it could not run would have
    covered (``unreachable_waivers``); unlike ``waived`` such a waiver is never stale."""
    covered = check_coverage(scenarios)
    every = {**(unreachable or {}), **waived}
    return {
        "covered": {r: covered[r] for r in requirements if r in covered},
        "uncovered": [r for r in requirements if r not in covered and r not in every],
        "waived": {r: every[r] for r in requirements if r in every and r not in covered},
        "stale_waivers": sorted(r for r in waived if r in covered),
    }
