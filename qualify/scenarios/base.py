"""What a scenario is and what it gets to work with.

A scenario is a function of a ``ScenarioContext`` registered with ``@scenario``. It
drives real processes through HTTP and faults, records what it did in the history,
and may add scenario-specific checks; the runner adds the generic checkers.

Why one module of about 430 lines: ``ScenarioContext`` is the whole surface a scenario
sees (client operations, barriers, crash points, database reads, the network), each
recorded in the history the same way; one class in one file is what a scenario author
reads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from qimpl.crashpoints import arm_path
from qualify import http, interrupt
from qualify.checkers import Check
from qualify.errors import HarnessError, InvariantViolation
from qualify.faults import Nemesis
from qualify.forkserver import ENTRY_POINTS
from qualify.history import HistoryRecorder
from qualify.processes import Deployment, ManagedProcess, Processes
from qualify.procs import poll
from qualify.run_notices import RunNotices
from qualify.timing import spends, spent

#: The spec's default deadline (R-EXEC-8: 1 h), independent of the implementation's.
SPEC_DEFAULT_DEADLINE_S = 3600

__all__ = ["REGISTRY", "Scenario", "ScenarioContext", "json_object", "outcome", "scenario"]

API_KEY = "dev-key"
TERMINAL = ("completed", "failed", "expired", "cancelled")


def outcome(run: Any) -> str:
    """A run read's state and error code for a check's detail: ``failed, error_code
    workflow_vanished``, ``completed`` (no code shown when it has none), never ``failed
    None``; a read that did not come (None) is said so."""
    if not run:
        return "no run read"
    code = run.get("error_code")
    return f"{run.get('state')}, error_code {code}" if code else f"{run.get('state')}, no error_code"

#: An id in a check's name (eight hex digits or more, letters and digits mixed: a run id,
#: a key's digest): checks are compared by name across runs (``qualify diff``, the gate).
_ID_IN_NAME = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b")
#: A measurement in a check's name (two decimals or more: "worst 1.11 s"): it differs
#: between two runs of the same code, as an id does. A bound is written with ``:g``.
_MEASURED_IN_NAME = re.compile(r"\d\.\d{2,}")


@dataclass(frozen=True)
class Scenario:
    id: str
    title: str
    requirements: tuple[str, ...]
    body: Callable[[ScenarioContext], None]
    faults: tuple[str, ...] = ()
    crash_points: tuple[str, ...] = ()
    #: For generated scenarios: the schedule (JSON) that the body executes.
    schedule: str | None = None
    #: For a schedule replayed from a file (``qualify repro --schedule``): that file, the
    #: only way to run the same schedule again (its id, ``random-<i>``, names the seed's).
    schedule_file: str | None = None
    #: Restarts or stops PostgreSQL or Temporal: refused on a stack the harness did not boot.
    needs_platform: bool = False
    #: Why the scenario accepts no run in its database (it works on another one): without
    #: a reason, a scenario that accepted no run is ``vacuous``.
    no_runs_because: str = ""
    #: Why the scenario execs its API and worker processes (``python -m ...``, a fresh
    #: interpreter each) under ``--spawn auto`` instead of forking them from the preloaded
    #: fork server: the named set that qualifies the real entry points under the faults
    #: that matter for each (issue 24). Empty: forked.
    exec_because: str = ""
    #: Which of its entry points (``api``, ``worker``) an exec-set scenario execs; the
    #: others are forked. Empty: both. Only what ``exec_because`` names needs a fresh
    #: interpreter; an exec'd process costs about 0.5-1 s of imports.
    exec_kinds: tuple[str, ...] = ()
    #: Why the scenario runs on a Temporal dev server with the server's default timers
    #: even when the stack's own is tuned (``--temporal-timers tuned``): the named set
    #: that keeps what users' servers do qualified (the takeover scenarios). Empty: the
    #: stack's server.
    default_timers_because: str = ""

    @property
    def execs(self) -> bool:
        """Whether ``--spawn auto`` execs this scenario's processes."""
        return bool(self.exec_because)

    @property
    def exec_only(self) -> frozenset[str]:
        """The entry points ``--spawn auto`` execs for this scenario: ``exec_kinds``, or
        both when it names none; nothing outside the exec set."""
        if not self.execs:
            return frozenset()
        return frozenset(self.exec_kinds or ENTRY_POINTS)


REGISTRY: dict[str, Scenario] = {}


def scenario(
    id: str, *, title: str, requirements: tuple[str, ...], faults: tuple[str, ...] = (),
    crash_points: tuple[str, ...] = (), needs_platform: bool = False, no_runs_because: str = "",
    exec_because: str = "", exec_kinds: tuple[str, ...] = (), default_timers_because: str = "",
) -> Callable[[Callable[[ScenarioContext], None]], Callable[[ScenarioContext], None]]:
    """Register ``body`` as scenario ``id``. ValueError for an id registered twice, or
    ``exec_kinds`` outside ``ENTRY_POINTS`` or without ``exec_because``."""

    def register(body: Callable[[ScenarioContext], None]) -> Callable[[ScenarioContext], None]:
        if id in REGISTRY:
            raise ValueError(f"scenario {id!r} registered twice")
        if exec_kinds and (not exec_because or not set(exec_kinds) <= set(ENTRY_POINTS)):
            raise ValueError(f"scenario {id!r}: exec_kinds {exec_kinds} needs exec_because and "
                             f"names only {ENTRY_POINTS}")
        REGISTRY[id] = Scenario(id, title, requirements, body, faults, crash_points,
                                needs_platform=needs_platform, no_runs_because=no_runs_because,
                                exec_because=exec_because, exec_kinds=tuple(exec_kinds),
                                default_timers_because=default_timers_because)
        return body

    return register


@dataclass
class ScenarioContext:
    deployment: Deployment
    processes: Processes
    history: HistoryRecorder
    nemesis: Nemesis
    rng: random.Random
    checks: list[Check] = field(default_factory=list)
    #: How many times each check asserted more than once was asserted (``expect``).
    _asserted: dict[str, int] = field(default_factory=dict)
    figures: dict[str, float] = field(default_factory=dict)
    #: The bound a check held a figure to, by figure name (``figure``): "<= 7 s".
    figure_bounds: dict[str, str] = field(default_factory=dict)
    #: Tables the report shows under the scenario: name -> ``{"columns": [...], "rows": [[...]]}``.
    tables: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    #: The stack, for faults that strike PostgreSQL or Temporal themselves.
    stack: Any = None
    #: The side-effect sink (``qualify.processes.SinkProcess``), for faults that strike it.
    sink: Any = None
    #: Network proxies the scenario put between a process and a server (R-Q-11); the
    #: runner stops them after the processes.
    proxies: list[Any] = field(default_factory=list)
    #: The scenario's own database session for ``sql`` (opened on first use, reopened when
    #: the server closed it; the runner closes it at teardown).
    _db: Any = field(default=None, repr=False)
    _db_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: The scenario's ``RunNotices`` (started on the first wait for a run; closed with ``close``).
    _notices: Any = field(default=None, repr=False)

    def waiting(self, kind: str) -> Any:
        """A span of the scenario's time of ``kind`` (``qualify.timing.KINDS``): ``with
        ctx.waiting("wait_takeover"): ...``."""
        return spent(kind)

    # -- the network ------------------------------------------------------------
    def postgres_proxy(self, name: str, role: str = "qimpl_worker") -> tuple[Any, dict[str, str]]:
        """A ``TcpProxy`` to the scenario's PostgreSQL and the environment that sends a
        process of ``role`` through it: ``ctx.processes.worker("w", **env)``."""
        from urllib.parse import urlsplit

        from qualify.proxy import TcpProxy

        dsn = self.deployment.app_dsn(role)
        where = urlsplit(dsn).netloc.rsplit("@", 1)[-1]
        proxy = TcpProxy(name, where).start()
        self.proxies.append(proxy)
        return proxy, {"QIMPL_DATABASE_URL": dsn.replace("@" + where + "/", "@" + proxy.address + "/", 1)}

    def temporal_proxy(self, name: str, *, grpc: bool = False) -> tuple[Any, dict[str, str]]:
        """A proxy to Temporal (``GrpcProxy`` when ``grpc``, else ``TcpProxy``) and the
        environment that sends a process through it."""
        from qualify.proxy import GrpcProxy, TcpProxy

        proxy: Any = (GrpcProxy if grpc else TcpProxy)(name, self.deployment.temporal_address).start()
        self.proxies.append(proxy)
        return proxy, {"QIMPL_TEMPORAL_ADDRESS": proxy.address}

    @property
    def control(self) -> Path:
        return self.deployment.control_dir

    # -- checks -----------------------------------------------------------------
    def figure(self, name: str, value: float, *, at_most: float | None = None,
               at_least: float | None = None, unit: str = "") -> float:
        """Record figure ``name`` (a measurement the report shows) with the bound the check
        that judges it uses, so the report shows the two side by side; returns ``value``."""
        self.figures[name] = value
        said = [f"{op} {b:g}{' ' + unit if unit else ''}" for op, b in ((">=", at_least), ("<=", at_most))
                if b is not None]
        if said:
            self.figure_bounds[name] = " and ".join(said)
        return value

    def expect(self, name: str, ok: bool, detail: str = "", *requirements: str, judged: int = 1) -> bool:
        """Record a scenario check; bearer secrets in ``detail`` (stream keys) are redacted
        before anything is stored or reported. ``judged`` is how many items the assertion
        looked at (one, unless it is a statement about a collection: pass its size, so an
        empty collection covers no requirement, R-Q-12). Raises HarnessError when ``name``
        carries an id: two runs of the same code must have the same checks (put the id in
        ``detail``)."""
        if _ID_IN_NAME.search(name):
            raise HarnessError(f"check name carries an id (put it in the detail): {name!r}")
        if _MEASURED_IN_NAME.search(name):
            raise HarnessError(f"check name carries a measurement (put it in the detail): {name!r}")
        check = Check(name, bool(ok), redact(detail), tuple(requirements), judged=judged)
        earlier = next((i for i, c in enumerate(self.checks) if c.name == name), None)
        if earlier is None:
            self.checks.append(check)
            return bool(ok)
        # The same check asserted again (an ``expect`` in a retry loop): one check, ok while
        # every assertion is, judging them all, its detail the first failure's (else the
        # last's), so the report counts it once however many rounds a run took.
        was = self.checks[earlier]
        times = self._asserted[name] = self._asserted.get(name, 1) + 1
        detail = was.detail if was.ok is False else check.detail
        self.checks[earlier] = dataclasses.replace(
            was, ok=bool(was.ok and ok), judged=was.judged + judged,
            requirements=tuple(dict.fromkeys((*was.requirements, *check.requirements))),
            detail=f"{detail.split(' [asserted ')[0]} [asserted {times} times]")
        return bool(ok)

    def table(self, name: str, columns: list[str], rows: list[list[Any]]) -> None:
        """Attach a table to the scenario's report (for example the API contract matrix):
        ``columns`` are the headings, each row one cell per column (strings or numbers)."""
        self.tables[name] = {"columns": list(columns), "rows": [[redact(str(c)) for c in r] for r in rows]}

    # -- client operations (invoke, then ok / fail / info) -----------------------
    def create_run(self, api: ManagedProcess, *, prompt: str, agent_id: str = "agent-1",
                   key: str | None = None, deadline_seconds: int | None = None,
                   timeout_s: float = 15.0) -> httpx.Response | None:
        """POST a durable run; returns the response, or None when the outcome is unknown."""
        key = key or str(uuid.UUID(int=self.rng.getrandbits(128)))
        body: dict[str, Any] = {"prompt": prompt, "durable_temporal": True}
        if deadline_seconds is not None:
            body["deadline_seconds"] = deadline_seconds
        self.history.record("client", op="create", phase="invoke", key=key, process=api.name,
                            deadline_seconds=body.get("deadline_seconds", SPEC_DEFAULT_DEADLINE_S))
        try:
            resp = http.post(f"{api.base_url}/v1/agents/{agent_id}/runs", json=body,
                              headers={"Authorization": f"Bearer {API_KEY}", "Idempotency-Key": key},
                              timeout=timeout_s)
        except httpx.HTTPError as exc:
            self.history.record("client", op="create", phase="info", key=key,
                                error=type(exc).__name__)
            return None
        doc = json_object(resp)
        run_id = doc.get("run_id") or (doc.get("receipt") or {}).get("run_id")
        phase = "ok" if resp.status_code == 202 else "fail"
        self.history.record("client", op="create", phase=phase, key=key, status=resp.status_code,
                            run_id=run_id, code=doc.get("code"))
        return resp

    def create_until_accepted(self, api: ManagedProcess, *, prompt: str, key: str,
                              timeout_s: float = 20.0, interval_s: float = 0.2) -> httpx.Response | None:
        """The same create (``key``) repeated every ``interval_s`` until it answers 202 (a
        dependency that came back may take a moment to answer again); the 202, or None
        after ``timeout_s`` seconds."""
        def attempt() -> httpx.Response | None:
            resp = self.create_run(api, prompt=prompt, key=key)
            return resp if resp is not None and resp.status_code == 202 else None
        return poll(attempt, timeout_s, interval_s=interval_s)

    def read_run(self, api: ManagedProcess, run_id: str, agent_id: str = "agent-1",
                 *, retry_s: float = 10.0) -> dict[str, Any]:
        """Read a run; transport errors and 5xx (a restarting dependency) are retried for
        ``retry_s``; anything else non-200 is a HarnessError."""
        deadline = time.monotonic() + retry_s
        while True:
            try:
                resp = http.get(f"{api.base_url}/v1/agents/{agent_id}/runs/{run_id}",
                                 headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10)
            except httpx.HTTPError:
                resp = None
            if (resp is None or resp.status_code >= 500) and time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            break
        if resp is None:
            raise HarnessError(f"read of run {run_id}: the API did not answer")
        if resp.status_code != 200:
            raise HarnessError(f"read of run {run_id} answered {resp.status_code}: {resp.text[:200]}")
        return json_object(resp)

    def notices(self) -> RunNotices:
        """The scenario's LISTEN session on the product's run notifications (started on
        first use): waits for a run read it again when it changed, not on an interval."""
        if self._notices is None:
            self._notices = RunNotices(self.deployment.dsn).start()
        return self._notices

    def read_until(self, api: ManagedProcess, run_id: str, done: Callable[[dict[str, Any]], bool], *,
                   timeout_s: float) -> dict[str, Any]:
        """Read the run through the API until ``done(read)`` or ``timeout_s`` seconds passed,
        again each time the product notifies a change of it (``qualify.run_notices``; at
        least every 0.5 s); returns the last read, for the caller to judge."""
        deadline = time.monotonic() + timeout_s
        notices = self.notices()
        while True:
            mark = notices.seen(run_id)  # before the read: a change after it wakes the wait
            doc = self.read_run(api, run_id)
            if done(doc) or time.monotonic() > deadline:
                return doc
            interrupt.check()
            notices.wait(run_id, mark, deadline - time.monotonic())

    @spends("wait_run")
    def wait_terminal(self, api: ManagedProcess, run_id: str, *, timeout_s: float = 30.0) -> dict[str, Any]:
        """Read the run until it is terminal (``read_until``); records the final read.
        HarnessError on timeout."""
        self.history.record("client", op="read", phase="invoke", run_id=run_id)
        doc = self.read_until(api, run_id, lambda d: d["state"] in TERMINAL, timeout_s=timeout_s)
        if doc["state"] not in TERMINAL:
            self.history.record("client", op="read", phase="info", run_id=run_id, state=doc["state"])
            raise HarnessError(f"run {run_id} still {doc['state']} after {timeout_s} s")
        self.history.record("client", op="read", phase="ok", run_id=run_id,
                            state=doc["state"], row_version=doc["row_version"], usage=doc.get("usage"))
        return doc

    @spends("wait_run")
    def wait_state(self, api: ManagedProcess, run_id: str, state: str, *, timeout_s: float = 30.0) -> dict[str, Any]:
        """Read the run until it is in ``state`` (``read_until``); HarnessError on timeout
        or another terminal state."""
        doc = self.read_until(api, run_id, lambda d: d["state"] == state or d["state"] in TERMINAL,
                              timeout_s=timeout_s)
        if doc["state"] != state:
            raise HarnessError(f"run {run_id} is {doc['state']}, waited for {state}")
        return doc

    # -- synthetic provider barriers ------------------------------------------------
    @spends("wait_barrier")
    def wait_barrier(self, name: str, *, timeout_s: float = 30.0) -> dict[str, Any]:
        """Wait until a worker holds at barrier ``name``; returns what it reported."""
        path = self.control / f"barrier.{name}.reached"
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            interrupt.check()
            if time.monotonic() > deadline:
                raise HarnessError(f"barrier {name} not reached in {timeout_s} s")
            time.sleep(0.01)
        doc: dict[str, Any] = json.loads(path.read_text())
        self.history.record("barrier", name=name, **doc)
        return doc

    def release_barrier(self, name: str) -> None:
        (self.control / f"barrier.{name}.release").touch()

    # -- crash points ---------------------------------------------------------------
    def crash_evidence(self, point: str, pid: int | None = None) -> list[dict[str, Any]]:
        """Lines a process wrote to ``crash_points.jsonl`` before striking at ``point``."""
        path = self.control / "crash_points.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        docs = [json.loads(line) for line in lines if line.strip()]
        return [d for d in docs if d["point"] == point and (pid is None or d["pid"] == pid)]

    @spends("wait_crash_point")
    def wait_crash_point(self, point: str, proc: ManagedProcess, *, timeout_s: float = 30.0) -> dict[str, Any]:
        """Wait until ``proc`` struck ``point``; returns its evidence line."""
        if not (found := poll(lambda: self.crash_evidence(point, proc.pid), timeout_s, interval_s=0.01)):
            raise HarnessError(f"{proc.name} did not reach crash point {point} in {timeout_s} s")
        return found[-1]

    def wait_crash_point_for(self, point: str, proc: ManagedProcess, *, timeout_s: float = 30.0,
                             **context: str) -> dict[str, Any]:
        """Wait until ``proc`` struck ``point`` at a reach whose context has ``context``'s
        values (an armed point strikes once per arming); returns that evidence line."""
        def matching() -> list[dict[str, Any]]:
            return [e for e in self.crash_evidence(point, proc.pid)
                    if all(e.get("context", {}).get(k) == str(v) for k, v in context.items())]

        if not (found := poll(matching, timeout_s, interval_s=0.01)):
            raise HarnessError(f"{proc.name} did not reach crash point {point} for {context} in {timeout_s} s")
        return found[-1]

    def lock_waiters(self, *, want: int, timeout_s: float = 3.0, application_name: str | None = None,
                     query_like: str | None = None) -> int:
        """How many sessions wait on a lock (``pg_stat_activity``: ``wait_event_type =
        'Lock'``), of that ``application_name`` and running a query ``LIKE query_like`` when
        given, once ``want`` do or ``timeout_s`` (s) passed: the evidence that a held lock
        had contenders."""
        query, args = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'", list[str]()
        if application_name is not None:
            query, args = query + " AND application_name = %s", [*args, application_name]
        if query_like is not None:
            query, args = query + " AND query LIKE %s", [*args, query_like]
        deadline = time.monotonic() + timeout_s
        while (n := int(self.sql(query, *args)[0][0])) < want and time.monotonic() < deadline:
            time.sleep(0.01)
        return n

    def arm_crash_point(self, point: str, context: dict[str, Any]) -> None:
        """Arm ``point`` (a ``?armed`` directive) for one reach whose context has these
        values, atomically (``qimpl.crashpoints``); a ``hold`` so struck waits for the
        ``release`` its evidence names."""
        arm = arm_path(self.control, point)
        tmp = arm.with_suffix(".tmp")
        tmp.write_text(json.dumps(context))
        os.replace(tmp, arm)

    def strike_worker(self, point: str, name: str, *, timeout_s: float = 30.0) -> dict[str, Any]:
        """Start worker ``name`` armed to SIGKILL itself at ``point``; wait for it to die
        there and record the fault with its evidence (the crash-point line, pid gone)."""
        proc = self.processes.worker(name, QIMPL_CRASH_POINTS=f"{point}:kill")
        evidence = self.wait_crash_point(point, proc, timeout_s=timeout_s)
        assert proc.proc is not None
        try:
            code = proc.proc.wait(timeout=10)
        except subprocess.TimeoutExpired as exc:
            raise HarnessError(f"{name} survived its crash point {point}") from exc
        return self.nemesis.crash_point(proc, evidence, exit_code=code)

    def create_on_dying_api(self, point: str, *, name: str, prompt: str, key: str | None = None,
                            **env: str) -> dict[str, Any]:
        """Start API ``name`` armed to SIGKILL itself at ``point``, create a run on it (no
        answer may come back), and record the fault. Returns the crash point's evidence,
        whose context names the run."""
        doomed = self.processes.api(name, QIMPL_CRASH_POINTS=f"{point}:kill", **env)
        answered = self.create_run(doomed, prompt=prompt, key=key)
        if answered is not None:
            raise HarnessError(f"{name} answered {answered.status_code} instead of dying at {point}")
        evidence = self.wait_crash_point(point, doomed)
        self.nemesis.crash_point(doomed, evidence)
        return evidence

    def release_crash_point(self, point: str) -> None:
        (self.control / f"crash.{point}.release").touch()

    # -- direct reads of the database (as an operator would) ------------------------------
    def db_now(self) -> float:
        """The database's clock now (epoch s): the clock every bound is judged on."""
        return float(self.sql("SELECT extract(epoch FROM clock_timestamp())::float8")[0][0])

    def db_clock_offset(self) -> float:
        """The database's clock minus this host's (seconds), from the shortest of five round
        trips (off by at most half of it). This host's clock is also its API's and workers'
        (the harness starts them), so a time they stamped (crash-point evidence, history)
        plus this offset is comparable with the database's ``at`` columns."""
        best: tuple[float, float] | None = None
        for _ in range(5):
            t0 = time.time()
            db = self.db_now()
            t1 = time.time()
            if best is None or t1 - t0 < best[0]:
                best = (t1 - t0, db - (t0 + t1) / 2)
        assert best is not None
        return best[1]

    def on_db_clock(self, t: float) -> float:
        """``t`` (epoch s, stamped on this host: crash-point evidence, history) as the
        database's clock read it (``db_clock_offset``)."""
        return t + self.db_clock_offset()

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        """Run ``query`` (autocommit) as the schema owner and return its rows; raises what
        psycopg raises. One session serves the whole scenario (a connection per call cost
        a backend start and a SCRAM exchange each, and scenarios poll): it is reopened
        when the server has closed it (a restart, a terminated session: its socket turned
        readable while idle), and a call that breaks it raises and the next reconnects."""
        import psycopg

        with self._db_lock:
            if self._db is not None and (self._db.closed or _closed_by_server(self._db)):
                self._drop_db()
            if self._db is None:
                self._db = psycopg.connect(self.deployment.dsn, autocommit=True)
            try:
                return self._db.execute(query, params).fetchall()  # type: ignore[no-any-return]
            except psycopg.OperationalError:
                if self._db.broken:
                    self._drop_db()
                raise

    def _drop_db(self) -> None:
        """Close the scenario's own session only (``sql`` reopens it). Not ``close``: that
        also stops the run notices, waking their thread through ``sql``, which would wait
        on the lock ``sql`` holds (a scenario that read the database before a PostgreSQL
        restart and again after it hung there)."""
        db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(Exception):
                db.close()

    def close(self) -> None:
        """Close the scenario's database sessions (idempotent)."""
        notices, self._notices = self._notices, None
        if notices is not None:
            notices.close(wake=self.sql)
        with self._db_lock:
            self._drop_db()

    def cancel_run(self, api: ManagedProcess, run_id: str, agent_id: str = "agent-1") -> dict[str, Any]:
        self.history.record("client", op="cancel", phase="invoke", run_id=run_id)
        resp = http.post(f"{api.base_url}/v1/agents/{agent_id}/runs/{run_id}/cancel",
                          headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10)
        doc = json_object(resp)
        self.history.record("client", op="cancel", phase="ok" if resp.status_code == 200 else "fail",
                            run_id=run_id, status=resp.status_code, cancelled=doc.get("cancelled"))
        if resp.status_code != 200:
            raise HarnessError(f"cancel answered {resp.status_code}: {resp.text[:200]}")
        return doc

    def temporal(self, op: Callable[[Any], Any]) -> Any:
        """``op(client)`` (a coroutine function given a ``temporalio.client.Client`` of the
        scenario's namespace), run to its end on a client of its own; returns its result and
        raises what it raises (an unreachable Temporal: ``RuntimeError`` from the connect)."""
        import asyncio

        from temporalio.client import Client

        async def go() -> Any:
            client = await Client.connect(self.deployment.temporal_address, namespace=self.deployment.namespace)
            return await op(client)

        return asyncio.run(go())

    def workflow_result(self, workflow_id: str, *, timeout_s: float = 30.0) -> Any:
        """The result Temporal recorded for ``workflow_id`` (waits for it to close).

        What Temporal *answers* about the workflow is a finding, not a harness fault: no such
        workflow, or one that failed, is an ``InvariantViolation`` (the scenario fails with a
        ``scenario invariant`` check naming it); only Temporal unreachable stays a
        ``HarnessError`` (crashed)."""
        import asyncio

        from temporalio.client import WorkflowFailureError
        from temporalio.service import RPCError, RPCStatusCode

        async def fetch(client: Any) -> Any:
            return await asyncio.wait_for(client.get_workflow_handle(workflow_id).result(), timeout_s)

        try:
            return self.temporal(fetch)
        except WorkflowFailureError as exc:
            raise InvariantViolation(f"workflow {workflow_id} failed: {exc.cause or exc}") from None
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise InvariantViolation(f"workflow {workflow_id}: Temporal has no such workflow") from None
            raise HarnessError(f"workflow {workflow_id} could not be read: {exc}") from exc
        except TimeoutError:
            raise InvariantViolation(f"workflow {workflow_id} did not close within {timeout_s} s") from None

    def workflow_executions(self, workflow_id: str) -> int:
        """How many executions of ``workflow_id`` Temporal's visibility lists, open or
        closed (R-CREATE-5: one per generation). Temporal unreachable is a HarnessError."""
        async def count(client: Any) -> int:
            return len([wf async for wf in client.list_workflows(f"WorkflowId = '{workflow_id}'")])

        try:
            found: int = self.temporal(count)
            return found
        except Exception as exc:
            raise HarnessError(f"executions of {workflow_id} could not be listed: {exc}") from exc

    def workflow_outcome(self, workflow_id: str, *, timeout_s: float = 20.0) -> tuple[str, Any]:
        """``(status, result)`` of ``workflow_id`` once it closed: ``("completed", result)``,
        or its closed status in lower case (``"failed"``, ``"terminated"``…) with None; or
        ``("running", None)`` when it was still open after ``timeout_s`` seconds.

        As ``workflow_result``: no such workflow is an ``InvariantViolation`` (a failed
        ``scenario invariant`` check), only Temporal unreachable a ``HarnessError``."""
        import asyncio

        from temporalio.client import WorkflowExecutionStatus
        from temporalio.service import RPCError, RPCStatusCode

        async def poll(client: Any) -> tuple[str, Any]:
            handle = client.get_workflow_handle(workflow_id)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                desc = await handle.describe()
                if desc.status == WorkflowExecutionStatus.COMPLETED:
                    return "completed", await handle.result()
                if desc.status != WorkflowExecutionStatus.RUNNING:
                    return str(desc.status.name if desc.status else "unknown").lower(), None
                await asyncio.sleep(0.1)
            return "running", None

        try:
            outcome: tuple[str, Any] = self.temporal(poll)
            return outcome
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise InvariantViolation(f"workflow {workflow_id}: Temporal has no such workflow") from None
            raise HarnessError(f"workflow {workflow_id} could not be read: {exc}") from exc


_SECRET = re.compile(r"""(["']?stream_key["']?\s*[:=]\s*["']?)[A-Za-z0-9_\-]{8,}""")


def redact(text: str) -> str:
    """``text`` with stream keys replaced by ``<redacted>``."""
    return _SECRET.sub(r"\1<redacted>", text)


def _closed_by_server(conn: Any) -> bool:
    """Whether an idle autocommit session's socket has something to read: nothing is
    owed to it between statements (no LISTEN), so that is the server closing it."""
    import select

    try:
        return bool(select.select([conn.fileno()], [], [], 0)[0])
    except (OSError, ValueError):
        return True


def json_object(resp: httpx.Response) -> dict[str, Any]:
    """A response's JSON object ({} for anything else)."""
    try:
        doc = resp.json()
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}
