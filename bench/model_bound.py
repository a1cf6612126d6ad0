"""Section ``model_bound``: a load bound by the model, not by the platform (issue 55, item 1).

N runs of S steps, each step waiting D ms on its provider, all N started at once, on three
systems one after the other, on the one stack (same PostgreSQL server, same Temporal dev
server):

- **qimpl** at its defaults: the real API and one real worker (its default activity slots,
  ``QIMPL_MAX_CONCURRENT_ACTIVITIES``), the synthetic provider's script
  ``{"steps": S, "delay_ms": D}``; with ``--mb-slots K`` again with a worker of K slots;
- **the floor**: a bare temporalio workflow of S activities each ``asyncio.sleep(D)``
  (``bench.floor_worker``'s ``SleepyWorkflow``), the Python SDK's worker defaults;
- **DBOS**: a workflow of S async steps each sleeping D ms, one process
  (``bench.dbos_app model``), in a database of its own on the same server.

A run's latency is from the moment the client asked for its start (all N asked at once:
qimpl's POSTs go out on at most ``bench.qimpl_runs.HTTP_CONNECTIONS`` connections) to the
moment the client saw it complete (qimpl: its terminal state in the database; the floor:
the workflow's result; DBOS: the workflow function's return, in its own process); runs/s
is completed runs over the first ask to the last completion.

While a system runs, a thread of the bench samples every 0.1 s the whole server's client
sessions (``pg_stat_activity``, ``backend_type = 'client backend'``, the sampler's own
excepted) and the worker's (qimpl: the worker's role in its database; DBOS: its database;
the floor's worker has none), each process's RSS (API, worker, Temporal server, the bench
itself), and every 0.5 s the PostgreSQL processes' memory: the sum of their PSS
(``/proc/<pid>/smaps_rollup``; shared buffers counted once), or of their RSS where PSS
cannot be read (the figure says which). CPU seconds are each process's user + system time
over the window; PostgreSQL's include the backends that ended in it (the postmaster's
reaped children).

Figures: ``mb.<N>x<S>x<D>.<system>.<metric>`` (``bench.stats.mb_prefix``), system
``qimpl``, ``qimpl_slots<K>``, ``floor``, ``dbos``; metrics ``runs``, ``completed``,
``wall_s``, ``runs_per_s``, ``p50_s``, ``p95_s``, ``pg_server_peak``, ``pg_worker_peak``,
``pg_mem_mib`` (``pg_mem_kind`` ``pss`` or ``rss``), ``pg_rss_mib``, ``pg_cpu_s``,
``rss_mib.<process>``, ``cpu_s.<process>``; qimpl's also ``slots``,
``dispatch_unknown`` and where its runs' time went (``_qimpl_phases``).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import psycopg

from bench.env import BenchEnv, SectionFailed, Subprocess, deployment_context, python_m
from bench.stats import mb_prefix, summarize
from qimpl.settings.worker import WorkerSettings
from qualify.errors import HarnessError
from qualify.procs import wait_until

__all__ = ["DEFAULT_SLOTS", "Sampler", "measure_model_bound"]

#: The worker's activity slots at qimpl's defaults.
DEFAULT_SLOTS: int = int(WorkerSettings.model_fields["max_concurrent_activities"].default)

#: Seconds between samples of the sessions and the processes' RSS, and of PostgreSQL's memory.
SAMPLE_S = 0.1
PG_MEMORY_S = 0.5


def _cpu(p: psutil.Process, *, reaped: bool = False) -> float:
    """User + system seconds of ``p`` (with ``reaped``: and of its children it waited for)."""
    t = p.cpu_times()
    return t.user + t.system + ((t.children_user + t.children_system) if reaped else 0.0)


class _Proc:
    """One measured process: ``tree`` counts its descendants' RSS and CPU too (the bench
    itself is measured alone: its descendants are the systems under test)."""

    def __init__(self, pid: int, *, tree: bool) -> None:
        self.proc = psutil.Process(pid)
        self.tree = tree
        self.peak_rss = 0.0
        self.cpu0 = self.cpu()

    def members(self) -> list[psutil.Process]:
        if not self.tree:
            return [self.proc]
        try:
            return [self.proc, *self.proc.children(recursive=True)]
        except psutil.Error:
            return [self.proc]

    def cpu(self) -> float:
        total = 0.0
        for p in self.members():
            try:
                total += _cpu(p)
            except psutil.Error:
                continue
        return total

    def sample(self) -> None:
        rss = 0
        for p in self.members():
            try:
                rss += p.memory_info().rss
            except psutil.Error:
                continue
        self.peak_rss = max(self.peak_rss, rss / 2**20)


class _Postgres:
    """The PostgreSQL server's processes: the postmaster and every backend it forked."""

    def __init__(self, postmaster_pid: int) -> None:
        self.postmaster = psutil.Process(postmaster_pid)
        self.peak_mem = self.peak_rss = 0.0
        #: "pss" until one process's PSS cannot be read, then "rss" for the whole figure.
        self.kind = "pss"
        self.cpu0 = self.cpu()

    def _children(self) -> list[psutil.Process]:
        try:
            return self.postmaster.children()
        except psutil.Error:
            return []

    def cpu(self) -> float:
        """The postmaster's and its children's CPU seconds, those it reaped included: a
        delta of two readings counts the backends that lived in between exactly once."""
        total = _cpu(self.postmaster, reaped=True)
        for p in self._children():
            try:
                total += _cpu(p)
            except psutil.Error:
                continue
        return total

    def sample(self) -> None:
        rss = pss = 0
        for p in [self.postmaster, *self._children()]:
            try:
                rss += p.memory_info().rss
                if self.kind == "pss":
                    pss += p.memory_full_info().pss
            except psutil.AccessDenied:
                self.kind = "rss"
            except (psutil.Error, AttributeError):
                continue
        self.peak_rss = max(self.peak_rss, rss / 2**20)
        self.peak_mem = max(self.peak_mem, (pss if self.kind == "pss" else rss) / 2**20)


class Sampler:
    """Samples, in a thread, from ``start`` to ``stop``: the server's and the worker's
    PostgreSQL client sessions (``worker_sql``: a condition on ``pg_stat_activity``;
    ``None``: the worker has none), each of ``procs`` (name -> (pid, with descendants))
    and the PostgreSQL processes (see the module docstring). ``figures`` after ``stop``."""

    def __init__(self, *, pg_dsn: str, postmaster_pid: int, procs: Mapping[str, tuple[int, bool]],
                 worker_sql: str | None) -> None:
        self.pg_dsn, self.worker_sql = pg_dsn, worker_sql
        self.procs = {name: _Proc(pid, tree=tree) for name, (pid, tree) in procs.items()}
        self.postgres = _Postgres(postmaster_pid)
        self.server_peak = self.worker_peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mb-sampler", daemon=True)
        self._conn: psycopg.Connection[Any] | None = None
        self._error: BaseException | None = None
        self.cpu: dict[str, float] = {}

    def start(self) -> Sampler:
        self._conn = psycopg.connect(self.pg_dsn, autocommit=True, application_name="bench-sampler")
        try:
            for p in self.procs.values():
                p.cpu0 = p.cpu()
            self.postgres.cpu0 = self.postgres.cpu()
            self._tick(memory=True)
            self._thread.start()
        except BaseException:
            self._conn.close()
            self._conn = None
            raise
        return self

    def _tick(self, *, memory: bool) -> None:
        assert self._conn is not None
        worker = f"count(*) FILTER (WHERE {self.worker_sql})" if self.worker_sql else "0"
        row = self._conn.execute(
            f"SELECT count(*), {worker} FROM pg_stat_activity"
            " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()").fetchone()
        assert row is not None
        self.server_peak, self.worker_peak = max(self.server_peak, int(row[0])), max(self.worker_peak, int(row[1]))
        for p in self.procs.values():
            p.sample()
        if memory:
            self.postgres.sample()
        self.samples += 1

    def _run(self) -> None:
        last_memory = time.monotonic()
        try:
            while not self._stop.wait(SAMPLE_S):
                memory = time.monotonic() - last_memory >= PG_MEMORY_S
                self._tick(memory=memory)
                if memory:
                    last_memory = time.monotonic()
        except BaseException as exc:  # noqa: BLE001 - reported by stop, in the main thread
            self._error = exc

    def stop(self) -> None:
        """End the sampling (idempotent); the CPU seconds are read here, so call it while
        the processes are still up. Raises what the sampling thread raised."""
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
        if self._conn is not None:
            if not self.cpu:
                for name, p in self.procs.items():
                    try:
                        self.cpu[name] = p.cpu() - p.cpu0
                    except psutil.Error:
                        continue
                self.cpu["postgres"] = self.postgres.cpu() - self.postgres.cpu0
            self._conn.close()
            self._conn = None
        if self._error is not None:
            raise HarnessError(f"the model-bound sampler failed: {self._error!r}") from self._error

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def figures(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pg_server_peak": self.server_peak, "pg_worker_peak": self.worker_peak,
                               "pg_mem_mib": self.postgres.peak_mem, "pg_mem_kind": self.postgres.kind,
                               "pg_rss_mib": self.postgres.peak_rss, "samples": self.samples}
        if "postgres" in self.cpu:
            out["pg_cpu_s"] = self.cpu["postgres"]
        for name, p in self.procs.items():
            out[f"rss_mib.{name}"] = p.peak_rss
            if name in self.cpu:
                out[f"cpu_s.{name}"] = self.cpu[name]
        return out


def _dbname(dsn: str) -> str:
    return urlsplit(dsn).path.lstrip("/")


def _sampler(env: BenchEnv, procs: dict[str, tuple[int, bool]], worker_sql: str | None) -> Sampler:
    """A sampler of ``procs`` plus the Temporal server and the bench process itself."""
    stack = env.stack
    procs = {**procs, "temporal": (stack.temporal.proc.pid, True), "bench": (os.getpid(), False)}
    return Sampler(pg_dsn=env.pg_dsn, postmaster_pid=stack.postgres.proc.pid, procs=procs,
                   worker_sql=worker_sql)


def _result(runs: int, elapsed: float, latencies: list[float], completed: int) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": runs, "completed": completed, "wall_s": elapsed,
                           "runs_per_s": completed / elapsed if elapsed > 0 else None}
    if latencies:
        lat = summarize(latencies)
        out.update(p50_s=lat.p50, p95_s=lat.p95)
    return out


#: The Python SDK's activity slots per worker when none are given (the floor's worker).
SDK_DEFAULT_SLOTS = 100


def _timeout_s(runs: int, steps: int, delay_ms: int, slots: int) -> float:
    """How long the runs may take at most (a hang, not a slow machine): four times what
    ``slots`` activity slots need for all the steps, plus five minutes."""
    return 300 + 4 * runs * steps * delay_ms / 1000 / max(1, min(slots, runs))


def _qimpl_phases(dsn: str, run_ids: list[str]) -> dict[str, float]:
    """Where qimpl's runs spent their time, by the database's timestamps (seconds):
    ``accept_span_s`` first to last ``accepted_at`` (how long the API took to accept them
    all), ``to_claim_p50_s``/``p95`` ``accepted_at -> started_at`` (dispatch and the wait
    for a free activity slot), ``claim_to_done_p50_s`` ``started_at -> completed_at``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM accepted_at)::float8, extract(epoch FROM started_at - accepted_at)::float8,"
            " extract(epoch FROM completed_at - started_at)::float8 FROM runs"
            " WHERE run_id = ANY(%s) AND state = 'completed'", (run_ids,)).fetchall()
    if not rows:
        return {}
    accepted = [float(r[0]) for r in rows]
    to_claim, claimed = summarize([float(r[1]) for r in rows]), summarize([float(r[2]) for r in rows])
    return {"accept_span_s": max(accepted) - min(accepted), "to_claim_p50_s": to_claim.p50,
            "to_claim_p95_s": to_claim.p95, "claim_to_done_p50_s": claimed.p50}


def _qimpl(env: BenchEnv, runs: int, steps: int, delay_ms: int, slots: int | None) -> dict[str, Any]:
    from bench.qimpl_runs import _throughput
    from qualify.fakes.synthetic import make_prompt
    from qualify.stack._embedded import WORKER_ROLE

    name = "mb-qimpl" if slots is None else f"mb-qimpl-{slots}"
    with deployment_context(env, name) as ctx:
        dsn = ctx.deployment.dsn
        worker_env = {"DURABLE_AGENT_RECONCILE_TENANTS": '["t-dev"]'}
        if slots is not None:
            worker_env["QIMPL_MAX_CONCURRENT_ACTIVITIES"] = str(slots)
        api = ctx.processes.spawn_api("api-1")
        worker = ctx.processes.spawn_worker("worker-1", env=worker_env)
        api.wait_ready()
        worker.wait_ready()
        asyncio.run(_throughput(api, dsn, 2, 2, prompt=make_prompt(steps=steps, answer="warm")))
        prompt = make_prompt(steps=steps, delay_ms=delay_ms, answer="model-bound")
        latencies: list[float] = []
        effective = slots or DEFAULT_SLOTS
        sql = f"usename = '{WORKER_ROLE}' AND datname = '{_dbname(dsn)}'"
        with _sampler(env, {"api": (api.pid, True), "worker": (worker.pid, True)}, sql) as sampler:
            elapsed, ids, bad, unknown = asyncio.run(_throughput(
                api, dsn, runs, runs, prompt=prompt, latencies=latencies,
                timeout_s=_timeout_s(runs, steps, delay_ms, effective)))
        out = _result(runs, elapsed, latencies, runs - bad)
        out.update(sampler.figures(), slots=effective, dispatch_unknown=unknown)
        out.update(_qimpl_phases(dsn, ids))
        return out


def _floor(env: BenchEnv, runs: int, steps: int, delay_ms: int) -> dict[str, Any]:
    from temporalio.client import Client

    from bench.load import closed_loop

    task_queue = f"mb-floor-{uuid.uuid4().hex[:8]}"
    prefix = uuid.uuid4().hex[:8]

    async def once(tag: str, n: int, delay: int, sampler: Sampler | None = None) -> tuple[float, list[float]]:
        client = await Client.connect(env.temporal_address)

        async def run_one(i: int) -> None:
            await client.execute_workflow("SleepyWorkflow", args=[steps, delay], id=f"mb-{prefix}-{tag}-{i}",
                                          task_queue=task_queue)

        if sampler is not None:
            sampler.start()
        return await asyncio.wait_for(closed_loop(run_one, concurrency=n, total=n),
                                      _timeout_s(n, steps, delay, SDK_DEFAULT_SLOTS))

    with Subprocess(python_m("bench.floor_worker", "--address", env.temporal_address, "--task-queue", task_queue),
                    log_path=env.workdir / "logs" / f"mb-floor-worker-{runs}.log", ready_line="floor.ready") as w:
        assert w.proc is not None
        asyncio.run(once("warm", 2, 0))
        sampler = _sampler(env, {"worker": (w.proc.pid, True)}, None)
        try:
            elapsed, latencies = asyncio.run(once("run", runs, delay_ms, sampler))
        finally:
            sampler.stop()
    out = _result(runs, elapsed, latencies, len(latencies))
    out.update(sampler.figures())
    return out


def _dbos(env: BenchEnv, runs: int, steps: int, delay_ms: int) -> dict[str, Any]:
    import dbos  # noqa: F401 - fail early with the package's own error

    db = f"bench_mb_{uuid.uuid4().hex[:8]}"
    url = env.plain_database(db)
    control = env.workdir / db
    control.mkdir(parents=True, exist_ok=True)
    log = env.workdir / "logs" / f"{db}.log"
    argv = python_m("bench.dbos_app", "model", "--db-url", url, "--control", str(control), "--runs", str(runs),
                    "--steps", str(steps), "--delay-ms", str(delay_ms))
    with Subprocess(argv, log_path=log, ready_line="dbos.warm", ready_timeout_s=120) as app:
        assert app.proc is not None
        with _sampler(env, {"dbos": (app.proc.pid, True)}, f"datname = '{db}'") as sampler:
            Path(control, "go").touch()
            wait_until(lambda: b"dbos.model " in log.read_bytes(), timeout_s=_timeout_s(runs, steps, delay_ms, runs),
                       what="the DBOS model-bound runs", proc=app.proc)
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("dbos.model ")]
    doc = json.loads(lines[-1].removeprefix("dbos.model "))
    out = _result(runs, float(doc["elapsed_s"]), list(doc["latencies_s"]), len(doc["latencies_s"]))
    out.update(sampler.figures())
    return out


def measure_model_bound(env: BenchEnv) -> dict[str, Any]:
    """Every model-bound figure (see the module docstring) for each shape of
    ``env.model_bound``; every process is reaped. A system that fails (its runs not
    complete in time, a process that does not come up) is logged and the others are still
    measured; then SectionFailed carries the figures taken, from the first failure."""
    plan = env.model_bound
    out: dict[str, Any] = {}
    failed: list[tuple[str, Exception]] = []
    for runs in plan.runs:
        p = mb_prefix(runs, plan.steps, plan.delay_ms)
        shape = (runs, plan.steps, plan.delay_ms)
        systems = ["qimpl", *(f"qimpl_slots{k}" for k in plan.slots), "floor", "dbos"]
        for system, slots in zip(systems, [None, *plan.slots, None, None], strict=True):
            t0 = time.monotonic()
            try:
                if system == "floor":
                    figures = _floor(env, *shape)
                elif system == "dbos":
                    figures = _dbos(env, *shape)
                else:
                    figures = _qimpl(env, *shape, slots)
            except Exception as exc:  # noqa: BLE001 - one system must not hide the others
                env.log(f"  model-bound {runs}x{plan.steps}x{plan.delay_ms} {system} failed: "
                        f"{type(exc).__name__}: {exc}")
                failed.append((f"{p}.{system}", exc))
                continue
            out.update({f"{p}.{system}.{k}": v for k, v in figures.items()})
            env.log(f"  model-bound {runs}x{plan.steps}x{plan.delay_ms} {system}: {figures['completed']}/{runs} "
                    f"completed, {figures['runs_per_s'] or 0:.1f} runs/s, p50 {figures.get('p50_s', 0):.2f} s, "
                    f"worker's PG sessions peak {figures['pg_worker_peak']} ({time.monotonic() - t0:.0f} s)")
    if failed:
        raise SectionFailed(f"model-bound: {', '.join(name for name, _ in failed)} failed", out) from failed[0][1]
    return out
