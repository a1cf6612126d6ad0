"""How reproducible is the harness? (``qualify run --determinism-check``)

1. Schedules: for a sample of seeds, derive every random scenario's schedule twice and
   compare (pure; must always be identical).
2. Executions: run a sample of random scenarios twice each on one stack and compare their
   *scrubbed* histories — what was planned and struck, and how each run ended, with
   times, pids and ids removed. Interleavings on real processes may legitimately differ;
   the figure says how often they did not.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qualify.history import Event

__all__ = ["check_schedules", "scrub"]


def scrub(history: Sequence[Event]) -> list[tuple[Any, ...]]:
    """The timing-free skeleton of a history: faults (kind, target role, barrier, step,
    landed), barriers reached (name, step) and terminal states in run-creation order."""
    created: list[str] = []
    for e in history:
        if e["type"] == "client" and e.get("op") == "create" and e.get("phase") == "ok":
            created.append(str(e["run_id"]))
    order = {run: i for i, run in enumerate(created)}
    out: list[tuple[Any, ...]] = []
    for e in history:
        if e["type"] == "fault":
            ev = e.get("evidence", {})
            role = str(e.get("target", "")).split("-")[0]
            out.append(("fault", e["fault"], role, ev.get("barrier"), ev.get("step"), e["landed"]))
        elif e["type"] == "barrier":
            out.append(("barrier", e.get("name"), e.get("step")))
    finals = {str(e["run_id"]): e["state"] for e in history if e["type"] == "run"}
    out += [("final", order[r], finals.get(r)) for r in created]
    return out


def check_schedules(seeds: Sequence[int], n: int) -> tuple[int, int]:
    """(identical, total) schedule derivations over ``seeds`` x ``n`` random scenarios."""
    from qualify.scenarios.random_mix import random_scenario

    same = total = 0
    for seed in seeds:
        for i in range(n):
            total += 1
            same += random_scenario(i, seed).schedule == random_scenario(i, seed).schedule
    return same, total


def run_check(*, seeds: Sequence[int], sample: int, stack_kind: str, out_dir: Path) -> dict[str, Any]:
    """Both checks; returns the figures (written to ``determinism.json`` by the CLI)."""
    import json

    from qualify.runner import run_scenario
    from qualify.scenarios.random_mix import random_scenario
    from qualify.stack import make_stack

    same, total = check_schedules(seeds, 5)
    executions: list[dict[str, Any]] = []
    stack = make_stack(stack_kind)
    try:
        stack.start()
        for k, seed in enumerate(seeds[:sample]):
            sc = random_scenario(0, seed)
            skeletons = []
            for attempt in (1, 2):
                res = run_scenario(stack, sc, seed=seed, out_dir=out_dir / f"{k}-{attempt}")
                lines = (res.out_dir / "history.jsonl").read_text().splitlines()
                skeletons.append(scrub([json.loads(line) for line in lines if line.strip()]))
            executions.append({"seed": seed, "identical": skeletons[0] == skeletons[1],
                               "first": skeletons[0], "second": skeletons[1]})
    finally:
        stack.stop()
    return {
        "schedules_identical": f"{same}/{total}",
        "executions_identical": f"{sum(e['identical'] for e in executions)}/{len(executions)}",
        "executions": executions,
    }
