"""What every section of the benchmark shares: the one stack, the plan (how many
iterations), a place for logs, and the harness's own machinery to start and always reap
processes (``qualify.procs``) and to build a scenario's context (``qualify.processes``,
``qualify.scenarios.base``) without judging it."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from qimpl.settings.base import DEFAULT_HEARTBEAT_TIMEOUT_S, DEFAULT_LEASE_S
from qualify.faults import Nemesis
from qualify.history import HistoryRecorder
from qualify.processes import Deployment, Processes
from qualify.procs import kill_tree, spawn, wait_until
from qualify.scenarios.base import ScenarioContext

__all__ = ["DEFAULT_HEARTBEAT_TIMEOUT_S", "DEFAULT_LEASE_S", "BenchEnv", "ModelBoundPlan", "Plan", "SectionFailed",
           "Subprocess", "deployment_context", "python_m"]

ROOT = Path(__file__).resolve().parents[1]



@dataclass(frozen=True, kw_only=True)
class Plan:
    """How much to measure. ``quick`` is for development and the smoke test."""

    sequential: int
    concurrency: tuple[int, ...]
    sigkill_trials: int
    pause_trials: int
    boot_trials: int
    random_schedules: int
    commits: int

    def total(self, concurrency: int) -> int:
        """Operations per throughput level: at least one full wave and at least
        ``sequential // 2``; above concurrency 1, at least ``3 x sequential``. Until
        2026-12-05 concurrency 10 ran 50 operations, about two seconds of qimpl and one of
        the floor, mostly the closed loop's ramp and drain: one figure moved by +-10 % from
        run to run, a ratio to the floor by twice that."""
        steady = 3 * self.sequential if concurrency > 1 else 0
        return max(concurrency, self.sequential // 2, steady, 10)

    @classmethod
    def of(cls, quick: bool) -> Plan:
        if quick:
            return cls(sequential=10, concurrency=(1, 10), sigkill_trials=2, pause_trials=1,
                       boot_trials=2, random_schedules=4, commits=50)
        return cls(sequential=100, concurrency=(1, 10, 100, 500), sigkill_trials=10,
                   pause_trials=3, boot_trials=5, random_schedules=40, commits=500)


class SectionFailed(Exception):
    """A section that measured part of its figures and then failed: ``run_bench`` keeps
    ``figures`` and records the failure (``__cause__``) as the section's error."""

    def __init__(self, message: str, figures: dict[str, Any]) -> None:
        super().__init__(message)
        self.figures = figures


@dataclass(frozen=True, kw_only=True)
class ModelBoundPlan:
    """What the ``model_bound`` section measures: for each of ``runs``, that many runs of
    ``steps`` steps, each step waiting ``delay_ms`` on the provider, all started at once,
    on qimpl at its defaults, the floor and DBOS; ``slots``: qimpl again with a worker of
    that many activity slots each (``QIMPL_MAX_CONCURRENT_ACTIVITIES``)."""

    runs: tuple[int, ...] = (200, 1000)
    steps: int = 3
    delay_ms: int = 1000
    slots: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.runs or min(self.runs) < 1 or self.steps < 1 or self.delay_ms < 0 \
                or (self.slots and min(self.slots) < 1):
            raise ValueError(f"model-bound plan out of range: {self}")

    @classmethod
    def of(cls, quick: bool) -> ModelBoundPlan:
        """The defaults (1,000 and 200 runs x 3 steps x 1,000 ms), or with ``quick`` 20 x
        2 x 200 ms (development, smoke test)."""
        return cls(runs=(20,), steps=2, delay_ms=200) if quick else cls()


@dataclass
class BenchEnv:
    """The stack (booted once), the plan and the run's working directory."""

    stack: Any
    plan: Plan
    workdir: Path
    log: Any = print
    #: Also time the full ``qualify run`` at -n 1 and -n auto (slow: minutes each).
    full_qualify: bool = False
    #: Where a section keeps what must outlive the run (a failing qualification's report);
    #: beside the results file, created on demand.
    keep_dir: Path | None = None
    #: What the ``model_bound`` section measures.
    model_bound: ModelBoundPlan = ModelBoundPlan()

    @property
    def pg_dsn(self) -> str:
        return str(self.stack.info.pg_dsn)

    @property
    def temporal_address(self) -> str:
        return str(self.stack.info.temporal_address)

    def plain_database(self, name: str) -> str:
        """An empty database ``name`` on the stack's server; returns its superuser DSN."""
        with psycopg.connect(self.pg_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.stack.postgres.dsn(name)  # type: ignore[no-any-return]


class Subprocess:
    """A benchmark child (floor worker, DBOS app) in its own session, ready when its log
    has ``ready_line``; ``stop`` always reaps it (SIGTERM, grace, SIGKILL to the group)."""

    def __init__(self, argv: Sequence[str], *, log_path: Path, env: Mapping[str, str] | None = None,
                 ready_line: str = "", ready_timeout_s: float = 60.0) -> None:
        self.argv, self.log_path = list(argv), log_path
        # The child imports ``bench`` from this checkout wherever it was started from.
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        self.env = {**(env if env is not None else os.environ), "PYTHONPATH": path,
                    "PYTHONUNBUFFERED": "1"}
        self.ready_line, self.ready_timeout_s = ready_line, ready_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Subprocess:
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.proc = spawn(self.argv, log_path=self.log_path, env=self.env)
        if self.ready_line:
            wait_until(lambda: self.ready_line.encode() in self.log_path.read_bytes()[offset:],
                       timeout_s=self.ready_timeout_s, what=" ".join(self.argv[:3]), proc=self.proc)
        return self

    def sigkill(self) -> None:
        assert self.proc is not None
        kill_tree(self.proc, first=signal.SIGKILL, grace_s=0)

    def stop(self) -> None:
        if self.proc is not None:
            kill_tree(self.proc, first=signal.SIGTERM, grace_s=5)

    def __enter__(self) -> Subprocess:
        try:
            return self.start()
        except BaseException:  # not ready in time, or Ctrl-C while waiting: reap it all the same
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def python_m(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


@contextmanager
def deployment_context(env: BenchEnv, name: str, *, lease_s: float = DEFAULT_LEASE_S,
                       heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
                       seed: int = 0) -> Iterator[ScenarioContext]:
    """A scenario's context (fresh database cloned from the migrated template, its own
    task queue and control directory, real API/worker processes on demand) for ``name``,
    as ``qualify.runner`` builds it, but never judged: the benchmark only measures. Its
    processes run with the lease and heartbeat timeout given (seconds), by default
    qimpl's own (the targets are "with default settings").
    Every process started through it is stopped and reaped on exit."""
    db = "b_" + hashlib.sha256(f"{name}:{time.time_ns()}".encode()).hexdigest()[:12]
    dsn = env.stack.create_database(db)
    out = env.workdir / name
    control = out / "control"
    control.mkdir(parents=True, exist_ok=True)
    deployment = Deployment(dsn=dsn, temporal_address=env.temporal_address, task_queue=f"q-{db}",
                            control_dir=control, logs_dir=out / "logs",
                            heartbeat_timeout_s=heartbeat_timeout_s, lease_s=lease_s)
    history = HistoryRecorder(out / "history.jsonl")
    processes = Processes(deployment)
    ctx = ScenarioContext(deployment=deployment, processes=processes, history=history,
                          nemesis=Nemesis(history), rng=random.Random(seed), stack=env.stack)
    try:
        yield ctx
    finally:
        try:
            processes.stop_all()
        finally:
            history.close()
