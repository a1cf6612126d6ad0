"""Where a scenario's time goes, by kind (issue 24, item 1).

A ``Ledger`` is bound to the thread that runs a scenario (``bind``); code anywhere in the
harness marks a span with ``spent(kind)`` and its seconds go to that kind. Spans nest:
an inner span's seconds are its kind's alone, not its parent's as well, so the kinds of
one scenario add up to at most its wall time and ``other`` is what no span claimed.
Spans in any other thread (a client pool's workers) are not counted: they overlap the
main thread's own waiting, which is what the wall time is made of.

Kinds (``KINDS``): ``stack`` (a server the scenario needs booted: the default-timer
Temporal server, on first need), ``database`` (the scenario's database cloned from the
template),
``process_start`` (an API or worker spawned until ready), ``wait_run`` (polling a run
to a state), ``wait_barrier``, ``wait_crash_point``, ``wait_takeover`` (a successor
taking over a killed or paused owner), ``wait_deadline`` (a run's deadline or expiry),
``wait_sweep`` (a reconciler's sweep), ``wait_condition`` (any other condition),
``teardown`` (stopping every process), ``collect`` (the history read back), ``checks``
and ``other``.
"""

from __future__ import annotations

import functools
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

__all__ = ["KINDS", "LOAD_PATH", "Ledger", "bind", "cpu_seconds", "expected_seconds", "expected_wall_s", "longest_first", "slice_load", "slices_for",
           "spends", "spent", "sum_by_kind"]

#: Each catalog scenario's seconds in a recent full run (``python -m qualify.timing
#: SUMMARY`` writes it): only the order of a parallel run depends on it.
SECONDS_PATH = Path(__file__).parent / "data" / "scenario_seconds.json"

#: The CPU one slice of a full run keeps busy (``slice_load`` of a recent full run at no
#: more slices than CPUs; ``python -m qualify.timing --load SUMMARY`` writes it): what
#: ``-n auto`` chooses its number of slices from (``slices_for``).
LOAD_PATH = Path(__file__).parent / "data" / "slice_load.json"

KINDS = ("stack", "database", "process_start", "wait_run", "wait_barrier", "wait_crash_point", "wait_takeover",
         "wait_deadline", "wait_sweep", "wait_condition", "teardown", "collect", "checks", "other")

_bound: dict[int, Ledger] = {}
_lock = threading.Lock()


class Ledger:
    """Seconds by kind for one scenario; ``total_s`` is its wall time once closed."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._stack: list[list[float]] = []  # [start, seconds of inner spans]
        self._t0 = time.monotonic()
        self.total_s = 0.0

    def _enter(self) -> None:
        self._stack.append([time.monotonic(), 0.0])

    def _exit(self, kind: str) -> None:
        start, inner = self._stack.pop()
        elapsed = time.monotonic() - start
        self.seconds[kind] = self.seconds.get(kind, 0.0) + max(0.0, elapsed - inner)
        if self._stack:
            self._stack[-1][1] += elapsed

    def close(self) -> dict[str, float]:
        """``{kind: seconds}`` rounded to ms, ``other`` the wall time no span claimed."""
        self.total_s = time.monotonic() - self._t0
        out = {k: round(v, 3) for k, v in self.seconds.items() if v > 0}
        out["other"] = round(max(0.0, self.total_s - sum(self.seconds.values())), 3)
        return out


@contextmanager
def bind(ledger: Ledger) -> Iterator[Ledger]:
    """Count the current thread's spans into ``ledger`` until the block ends."""
    me = threading.get_ident()
    with _lock:
        _bound[me] = ledger
    try:
        yield ledger
    finally:
        with _lock:
            _bound.pop(me, None)


@contextmanager
def spent(kind: str) -> Iterator[None]:
    """A span of ``kind`` (one of ``KINDS``): counted when the current thread is bound."""
    ledger = _bound.get(threading.get_ident())
    if ledger is None:
        yield
        return
    ledger._enter()
    try:
        yield
    finally:
        ledger._exit(kind)


def spends(kind: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a function whose every call is a span of ``kind``."""

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def inner(*args: P.args, **kwargs: P.kwargs) -> R:
            with spent(kind):
                return fn(*args, **kwargs)

        return inner

    return wrap


def sum_by_kind(scenarios: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Seconds by kind over a summary's scenarios (their ``time_by_kind``), in ``KINDS``
    order, kinds no scenario spent left out (pure)."""
    total: dict[str, float] = {}
    for sc in scenarios:
        for kind, s in (sc.get("time_by_kind") or {}).items():
            total[kind] = total.get(kind, 0.0) + float(s)
    return {k: round(total[k], 3) for k in KINDS if k in total}


def expected_seconds() -> dict[str, float]:
    """Each catalog scenario's expected seconds (``SECONDS_PATH``; empty when missing)."""
    return json.loads(SECONDS_PATH.read_text()) if SECONDS_PATH.exists() else {}


def longest_first(ids: Sequence[str], seconds: Mapping[str, float] | None = None) -> list[str]:
    """``ids`` with the longest expected first (pure but for reading ``SECONDS_PATH`` when
    ``seconds`` is None; an unknown id counts as the median): handed to parallel slices in
    this order, the long scenarios start at once and the short ones fill the gaps (the
    longest-processing-time rule), instead of a long one starting last and running alone."""
    if seconds is None:
        seconds = expected_seconds()
    known = sorted(float(v) for v in seconds.values())
    median = known[len(known) // 2] if known else 0.0
    return sorted(ids, key=lambda i: -float(seconds.get(i, median)))


def expected_wall_s(ids: Sequence[str], slices: int, seconds: Mapping[str, float] | None = None
                    ) -> float | None:
    """The wall seconds ``ids`` are expected to take over ``slices`` parallel slices: their
    expected seconds summed, over the slices (pure but for reading ``SECONDS_PATH`` when
    ``seconds`` is None); None when any id has no expected duration (a random schedule, a
    scenario added since the last measured run)."""
    if seconds is None:
        seconds = expected_seconds()
    if not ids or any(i not in seconds for i in ids):
        return None
    return sum(float(seconds[i]) for i in ids) / max(1, min(slices, len(ids)))


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and of every descendant it has reaped
    so far, the figure ``time`` prints for a command: the stacks' servers, the slices and
    the processes they forked all count once they are reaped."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def slice_load(*, cpu_s: float, wall_s: float, slices: int, cpus: int) -> dict[str, Any]:
    """The ``load`` of a run (pure): its CPU seconds over its wall seconds (cores kept
    busy), per slice, and as a share of the machine's ``cpus``. ValueError for a wall
    time or a slice count that is not positive."""
    if wall_s <= 0 or slices < 1 or cpus < 1:
        raise ValueError("wall_s, slices and cpus must be positive")
    cores = cpu_s / wall_s
    return {"slices": slices, "cpus": cpus, "cpu_s": round(cpu_s, 1), "wall_s": round(wall_s, 1),
            "cores_busy": round(cores, 3), "cpu_per_slice": round(cores / slices, 3),
            "cpu_share": round(cores / cpus, 3)}


def slices_for(cpus: int, cpu_per_slice: float | None = None, *, most_per_cpu: float = 2.5) -> int:
    """``-n auto``'s number of slices (pure but for reading ``LOAD_PATH`` when
    ``cpu_per_slice`` is None): as many as keep the ``cpus`` busy, ``cpus /
    cpu_per_slice`` rounded, at least 1 and at most ``most_per_cpu`` per CPU, rounded
    down (past that the harness's own CPU, not its waiting, is the limit: measured on 2
    cores on 2026-12-05, the catalog kept the machine 78 % busy at 4 slices (125 s), 87 %
    at 5 (113-116 s) and 95 % at 6 (110 s); an earlier, heavier catalog failed four timing
    bounds at 6). Without a measured load, one per CPU."""
    if cpu_per_slice is None:
        doc = json.loads(LOAD_PATH.read_text()) if LOAD_PATH.exists() else {}
        cpu_per_slice = doc.get("cpu_per_slice")
    cpus = max(1, cpus)
    if not cpu_per_slice or cpu_per_slice <= 0:
        return cpus
    return max(1, min(int(most_per_cpu * cpus), round(cpus / float(cpu_per_slice))))


def main(argv: Sequence[str]) -> int:
    """``python -m qualify.timing SUMMARY``: print the catalog's seconds per scenario of
    that full run as JSON (for ``SECONDS_PATH``); ``--load SUMMARY``: its load (for
    ``LOAD_PATH``), with the git commit it was measured at. A missing or unreadable
    SUMMARY is a usage error (exit 64), never a traceback."""
    from qimpl.scripts import UsageParser

    parser = UsageParser(prog="python -m qualify.timing",
                         description="Seconds per scenario (or, with --load, the load) of a full "
                                     "qualify run, from its summary.json.")
    parser.add_argument("--load", action="store_true",
                        help="print the run's load (for qualify/data/slice_load.json) instead")
    parser.add_argument("summary", metavar="SUMMARY", type=Path, help="a full run's summary.json")
    args = parser.parse_args(list(argv))
    try:
        summary = json.loads(args.summary.read_text())
    except (OSError, ValueError) as exc:
        parser.error(f"{args.summary}: not a readable summary.json ({type(exc).__name__})")
    if args.load:
        print(json.dumps({**summary["load"], "git_sha": summary.get("git_sha")}, indent=1))
        return 0
    out = {sc["id"]: round(float(sc["duration_s"]), 1) for sc in summary["scenarios"]
           if sc.get("schedule") is None}
    print(json.dumps(dict(sorted(out.items())), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
