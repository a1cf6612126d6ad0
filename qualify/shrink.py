"""Delta debugging of a failing random schedule down to a minimal one (``qualify repro
--shrink``): try ever smaller schedules, each replayed ``runs`` times (a candidate
"fails" if any replay fails), keep the first smaller one that still fails, repeat."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from qualify.schedule import Schedule, shrink_candidates

__all__ = ["minimise", "shrink"]


def minimise(schedule: Schedule, fails: Callable[[Schedule], bool],
             on_step: Callable[[Schedule], None] = lambda s: None) -> Schedule:
    """Greedy delta debugging (pure given ``fails``): a schedule from which no single
    shrink step still fails."""
    current = schedule
    improved = True
    while improved:
        improved = False
        for candidate in shrink_candidates(current):
            if fails(candidate):
                current, improved = candidate, True
                on_step(current)
                break
    return current


def shrink(stack: Any, schedule: Schedule, *, seed: int, out_dir: Path, runs: int = 2,
           on_event: Callable[[str, Any], None] = lambda k, d: None) -> tuple[Schedule, int]:
    """The smallest failing schedule found from ``schedule`` on ``stack``, and the number
    of replays it took."""
    from qualify.runner import run_scenario
    from qualify.scenarios.random_mix import schedule_scenario
    from qualify.verdict import Verdict

    tried = 0

    def fails(candidate: Schedule) -> bool:
        nonlocal tried
        for _ in range(runs):
            tried += 1
            sc = schedule_scenario(candidate, f"shrink-{tried}")
            result = run_scenario(stack, sc, seed=seed, out_dir=out_dir / sc.id)
            on_event("shrink_try", {"size": candidate.size, "shape": candidate.shape,
                                    "verdict": str(result.verdict)})
            if result.verdict is Verdict.FAIL:
                return True
        return False

    minimal = minimise(schedule, fails, lambda s: on_event("shrunk", {"size": s.size, "shape": s.shape}))
    return minimal, tried
