"""Seeded random schedules of workload and faults (pure: no I/O, no global randomness).

A ``Schedule`` is a plan: which runs to create (steps, per-step delay) and which faults
to strike, each at a barrier that one run reaches at a chosen step. The same seed always
gives the same schedule (``tests/unit/test_schedule.py``). ``shrink_candidates`` yields
strictly smaller schedules for delta debugging a failure down to a minimal one.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace

__all__ = ["FAULT_ACTIONS", "PLATFORM_ACTIONS", "FaultPlan", "RunPlan", "Schedule", "generate", "shrink_candidates"]

#: What a fault does when its run reaches the barrier.
FAULT_ACTIONS = ("sigkill-worker", "sigstop-worker", "terminate-lock-session", "restart-postgres",
                 "restart-worker", "restart-temporal")
#: Faults that restart the platform itself: refused on a stack the harness did not boot.
PLATFORM_ACTIONS = frozenset({"restart-postgres", "restart-temporal"})


@dataclass(frozen=True)
class RunPlan:
    steps: int
    delay_ms: int


@dataclass(frozen=True)
class FaultPlan:
    run: int          # index into Schedule.runs
    step: int         # the barrier: held at the start of this step
    action: str


@dataclass(frozen=True)
class Schedule:
    seed: int
    runs: tuple[RunPlan, ...]
    faults: tuple[FaultPlan, ...]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Schedule:
        doc = json.loads(text)
        return cls(seed=int(doc["seed"]), runs=tuple(RunPlan(**r) for r in doc["runs"]),
                   faults=tuple(FaultPlan(**f) for f in doc["faults"]))

    @property
    def size(self) -> int:
        return (len(self.runs) + len(self.faults) + sum(r.steps for r in self.runs)
                + sum(1 for r in self.runs if r.delay_ms))


def generate(seed: int, *, max_runs: int = 4, max_faults: int = 3) -> Schedule:
    """A random, valid schedule: at most one fault per run, at a step the run reaches."""
    rng = random.Random(seed)
    runs = tuple(RunPlan(steps=rng.randint(2, 6), delay_ms=rng.choice((0, 20, 80)))
                 for _ in range(rng.randint(1, max_runs)))
    targets = rng.sample(range(len(runs)), k=min(len(runs), rng.randint(1, max_faults)))
    faults = tuple(FaultPlan(run=i, step=rng.randint(1, runs[i].steps), action=rng.choice(FAULT_ACTIONS))
                   for i in sorted(targets))
    return Schedule(seed=seed, runs=runs, faults=faults)


def _drop_run(s: Schedule, i: int) -> Schedule:
    faults = tuple(replace(f, run=f.run - (f.run > i)) for f in s.faults if f.run != i)
    return replace(s, runs=s.runs[:i] + s.runs[i + 1:], faults=faults)


def shrink_candidates(s: Schedule) -> Iterator[Schedule]:
    """Strictly smaller schedules, biggest cuts first: drop a fault, drop a run, shorten a
    run (keeping every barrier reachable), remove a delay."""
    for i in range(len(s.faults)):
        yield replace(s, faults=s.faults[:i] + s.faults[i + 1:])
    if len(s.runs) > 1:
        for i in range(len(s.runs)):
            yield _drop_run(s, i)
    for i, run in enumerate(s.runs):
        floor = max([f.step for f in s.faults if f.run == i], default=1)
        if run.steps > max(floor, 1):
            runs = list(s.runs)
            runs[i] = replace(run, steps=max(floor, 1))
            yield replace(s, runs=tuple(runs))
        if run.delay_ms:
            runs = list(s.runs)
            runs[i] = replace(run, delay_ms=0)
            yield replace(s, runs=tuple(runs))
