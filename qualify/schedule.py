"""Seeded random schedules of workload and faults (pure: no I/O, no global randomness).

A ``Schedule`` is a plan: which runs to create (steps, per-step delay) and which faults
to strike, each at a barrier that one run reaches at a chosen step. The same seed always
gives the same schedule (``tests/unit/test_schedule.py``). ``shrink_candidates`` yields
strictly smaller schedules for delta debugging a failure down to a minimal one.

Faults (R-Q-10, each strikes the run it names at its barrier, the start of step ``step``):
the six base actions, and five rarer ones, each in about one schedule of seven:

- ``pause-in-transaction``: the run's owner stops itself (SIGSTOP) inside the checkpoint
  transaction of ``step``, between the fenced UPDATE and the COMMIT (row lock held);
- ``kill-sink``: the run asks for a ``charge`` tool call at ``step`` (so ``step < steps``)
  and the side-effect sink is SIGKILLed while the call is out, then restarted (R-TOOL-3);
- ``skew-worker-clock``: every worker of the schedule runs with its wall clock skewed
  (alternately ahead and behind by ``SKEW_S``), and the run's owner at the barrier is one;
- ``restart-postgres-mid-sweep``, ``restart-temporal-mid-sweep``: the run is orphaned (its
  API dies right after the acceptance commit) and the reconciler dispatches it; PostgreSQL
  or Temporal restarts while that sweep holds between Temporal's start and the confirming
  commit (``step`` is unused: the run has no barrier).

``problems`` says why a schedule is not valid by construction (empty when it is).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace

__all__ = ["FAULT_ACTIONS", "NEW_FAULT_P", "PLATFORM_ACTIONS", "SIZE_UNIT", "SKEW_S", "SWEEP_ACTIONS", "TOOL_ACTIONS",
           "FaultPlan", "RunPlan", "Schedule", "generate", "problems", "shrink_candidates"]

#: The base faults: equally likely.
BASE_ACTIONS = ("sigkill-worker", "sigstop-worker", "terminate-lock-session", "restart-postgres",
                "restart-worker", "restart-temporal")
#: Rarer faults (see the module's docstring), drawn from a second stream of the seed so
#: the base faults of a seed stay what they were.
NEW_ACTIONS = ("pause-in-transaction", "kill-sink", "skew-worker-clock", "restart-postgres-mid-sweep",
               "restart-temporal-mid-sweep")
#: What a fault does when its run reaches the barrier.
FAULT_ACTIONS = BASE_ACTIONS + NEW_ACTIONS
#: The chance that a fault is one of ``NEW_ACTIONS`` (then each equally likely): with
#: about 1.75 faults a schedule, each new action is in about one schedule of seven.
NEW_FAULT_P = 0.45
#: Faults at a tool call of the run's ``step``: the run asks for one there, so ``step < steps``.
TOOL_ACTIONS = frozenset({"kill-sink"})
#: How far a skewed worker's wall clock is ahead (odd workers) or behind (even), seconds.
SKEW_S = 300
#: Faults that restart the platform itself: refused on a stack the harness did not boot.
PLATFORM_ACTIONS = frozenset({"restart-postgres", "restart-temporal", "restart-postgres-mid-sweep",
                              "restart-temporal-mid-sweep"})
#: Faults struck in the reconciler's sweep of an orphaned run, not at the run's barrier.
SWEEP_ACTIONS = frozenset({"restart-postgres-mid-sweep", "restart-temporal-mid-sweep"})


@dataclass(frozen=True)
class RunPlan:
    steps: int
    delay_ms: int


@dataclass(frozen=True)
class FaultPlan:
    run: int          # index into Schedule.runs
    step: int         # the barrier: held at the start of this step
    action: str


#: The unit of ``Schedule.size``, said wherever a size is printed.
SIZE_UNIT = "runs + faults + steps + delayed starts"


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
        """What ``qualify repro --shrink`` makes smaller: runs + faults + steps (over all
        runs) + delayed starts (``SIZE_UNIT``)."""
        return (len(self.runs) + len(self.faults) + sum(r.steps for r in self.runs)
                + sum(1 for r in self.runs if r.delay_ms))

    @property
    def shape(self) -> str:
        """The size in words: ``2 runs, 1 fault, 7 steps, 1 delayed start`` (zeros left out,
        but for runs)."""
        counts = (("run", len(self.runs)), ("fault", len(self.faults)),
                  ("step", sum(r.steps for r in self.runs)),
                  ("delayed start", sum(1 for r in self.runs if r.delay_ms)))
        return ", ".join(f"{n} {word}{'' if n == 1 else 's'}" for word, n in counts if n or word == "run")


def generate(seed: int, *, max_runs: int = 4, max_faults: int = 3) -> Schedule:
    """A random, valid schedule: at most one fault per run, at a step the run reaches."""
    rng = random.Random(seed)
    runs = tuple(RunPlan(steps=rng.randint(2, 6), delay_ms=rng.choice((0, 20, 80)))
                 for _ in range(rng.randint(1, max_runs)))
    targets = rng.sample(range(len(runs)), k=min(len(runs), rng.randint(1, max_faults)))
    faults = tuple(FaultPlan(run=i, step=rng.randint(1, runs[i].steps), action=rng.choice(BASE_ACTIONS))
                   for i in sorted(targets))
    rarer = random.Random(f"new-faults:{seed}")
    chosen = []
    for f in faults:
        if rarer.random() < NEW_FAULT_P:
            action = rarer.choice(NEW_ACTIONS)
            step = min(f.step, runs[f.run].steps - 1) if action in TOOL_ACTIONS else f.step
            f = replace(f, action=action, step=step)
        chosen.append(f)
    return Schedule(seed=seed, runs=runs, faults=tuple(chosen))


def _floor(s: Schedule, i: int) -> int:
    """The fewest steps run ``i`` may have: every barrier on it reachable, and a step
    after each tool call."""
    return max([f.step + (f.action in TOOL_ACTIONS) for f in s.faults if f.run == i], default=1)


def problems(s: Schedule) -> list[str]:
    """Why ``s`` is not valid by construction (empty when it is): a run to hold, at most
    one fault a run, each at a step its run reaches, a step after a tool call, known actions."""
    out = [] if s.runs else ["no run"]
    if len({f.run for f in s.faults}) != len(s.faults):
        out.append("two faults on one run")
    for f in s.faults:
        if f.action not in FAULT_ACTIONS:
            out.append(f"unknown action {f.action}")
        if not 0 <= f.run < len(s.runs):
            out.append(f"fault on run {f.run} of {len(s.runs)}")
        elif not 1 <= f.step or s.runs[f.run].steps < _floor(s, f.run):
            out.append(f"{f.action} at step {f.step} of a {s.runs[f.run].steps}-step run")
    return out


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
        floor = _floor(s, i)
        if run.steps > max(floor, 1):
            runs = list(s.runs)
            runs[i] = replace(run, steps=max(floor, 1))
            yield replace(s, runs=tuple(runs))
        if run.delay_ms:
            runs = list(s.runs)
            runs[i] = replace(run, delay_ms=0)
            yield replace(s, runs=tuple(runs))
