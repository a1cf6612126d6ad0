"""Section 2, qimpl: durable runs of the synthetic provider (3 steps, zero provider
latency) through the real API and one real worker process, default settings.

Figures (seconds, per second, MiB, rows, bytes):

- ``qimpl.accept_p50_s``/``p95``: POST -> 202 as the client sees it, sequential;
- ``qimpl.e2e_p50_s``/``p95``: ``accepted_at -> completed_at`` as the database recorded
  them, sequential (one run at a time);
- ``qimpl.tput_c<C>``: runs completed per second, closed loop with C runs in flight
  (create over HTTP, completion seen in the database), and ``qimpl.lat_c<C>_p50_s`` the
  runs' ``accepted_at -> completed_at`` p50 under that load; ``qimpl.dispatch_unknown_c<C>``
  how many creates answered 503 ``durable_dispatch_unknown`` (accepted; the worker's
  reconciler dispatches them after its grace);
- ``qimpl.checkpoint_p50_s``: one checkpoint commit, timed around qimpl's own
  ``RunOwner.checkpoint`` on a run this process claimed (as the worker's role);
- ``res.rows_per_run``/``res.wal_bytes_per_run``: rows inserted into qimpl's tables and
  WAL bytes per run over the sequential runs;
- ``res.api_rss_mib``/``res.worker_rss_mib``: peak RSS (process tree) at the highest
  concurrency measured (500 in a full run).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import httpx
import psutil
import psycopg

from bench.env import BenchEnv, deployment_context
from bench.load import closed_loop
from bench.stats import summarize
from qimpl.api.event_hub import CHANNEL as EVENTS_CHANNEL
from qualify.errors import HarnessError
from qualify.fakes.synthetic import make_prompt
from qualify.processes import ManagedProcess
from qualify.scenarios.base import API_KEY

__all__ = ["measure_qimpl"]

PROMPT = make_prompt(steps=3, answer="bench")
TERMINAL = ("completed", "failed", "expired", "cancelled")
HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def _body(prompt: str = PROMPT) -> dict[str, Any]:
    return {"prompt": prompt, "durable_temporal": True}


def _table_rows(dsn: str) -> int:
    """Rows in every table of the public schema (exact counts)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()]
        total = 0
        for t in tables:
            row = conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()
            total += int(row[0]) if row is not None else 0
        return total


def _wal_lsn(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
        assert row is not None
        return int(row[0])


def _e2e(dsn: str, run_ids: list[str]) -> list[float]:
    """``completed_at - accepted_at`` (seconds) of the completed runs among ``run_ids``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM completed_at - accepted_at)::float8 FROM runs"
            " WHERE run_id = ANY(%s) AND state = 'completed'", (run_ids,)).fetchall()
    return [float(r[0]) for r in rows]


def _e2e_phases(dsn: str, run_ids: list[str]) -> dict[str, float]:
    """Where a run's end-to-end time goes, p50 seconds, by the database's timestamps:
    ``accepted_at -> started_at`` (dispatch, the workflow task, the activity's schedule,
    its lease session and the claim) and ``started_at -> completed_at`` (three provider
    steps, three checkpoints and the final commit)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM started_at - accepted_at)::float8,"
            " extract(epoch FROM completed_at - started_at)::float8 FROM runs"
            " WHERE run_id = ANY(%s) AND state = 'completed'", (run_ids,)).fetchall()
    if not rows:
        return {}
    return {"qimpl.e2e_to_claim_p50_s": summarize([float(r[0]) for r in rows]).p50,
            "qimpl.e2e_claim_to_done_p50_s": summarize([float(r[1]) for r in rows]).p50}


def _sequential(api: ManagedProcess, dsn: str, n: int
                ) -> tuple[list[float], list[str], list[tuple[float, float]]]:
    """``n`` runs one at a time: (POST -> 202 seconds each, run ids, (sent, answered)
    epoch seconds of each POST)."""
    accept, ids, wall = [], [], []
    with httpx.Client(base_url=api.base_url, headers=HEADERS, timeout=30) as client, \
            psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(n):
            sent, t0 = time.time(), time.perf_counter()
            resp = client.post("/v1/agents/bench/runs", json=_body(),
                               headers={"Idempotency-Key": str(uuid.uuid4())})
            accept.append(time.perf_counter() - t0)
            wall.append((sent, time.time()))
            if resp.status_code != 202:
                raise HarnessError(f"create answered {resp.status_code}: {resp.text[:200]}")
            run_id = resp.json()["run_id"]
            ids.append(run_id)
            deadline = time.monotonic() + 60
            while True:
                row = conn.execute("SELECT state FROM runs WHERE run_id = %s", (run_id,)).fetchone()
                if row is not None and row[0] in TERMINAL:
                    break
                if time.monotonic() > deadline:
                    raise HarnessError(f"run {run_id} not terminal after 60 s")
                time.sleep(0.002)
    return accept, ids, wall


def _acceptance_phases(dsn: str, ids: list[str], wall: list[tuple[float, float]]) -> dict[str, float]:
    """Where an acceptance's time goes, p50 seconds, from the database's own timestamps
    (same machine, same clock): POST sent -> run committed (``accepted_at``: auth,
    validation, lookups, the insert), -> dispatch confirmed (``dispatch_confirmed_at``:
    the Temporal start and the confirming commit), -> 202 received."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows: dict[str, list[float | None]] = dict(conn.execute(
            "SELECT run_id::text, ARRAY[extract(epoch FROM accepted_at)::float8,"
            " extract(epoch FROM dispatch_confirmed_at)::float8] FROM runs WHERE run_id = ANY(%s)",
            (ids,)).fetchall())
    before, dispatch, after = [], [], []
    for run_id, (sent, answered) in zip(ids, wall, strict=True):
        accepted_at, confirmed_at = rows[run_id]
        assert accepted_at is not None  # NOT NULL in the schema
        before.append(accepted_at - sent)
        if confirmed_at is not None:
            dispatch.append(confirmed_at - accepted_at)
            after.append(answered - confirmed_at)
    out = {"qimpl.accept_to_insert_p50_s": summarize(before).p50}
    if dispatch:
        out["qimpl.accept_dispatch_p50_s"] = summarize(dispatch).p50
        out["qimpl.accept_after_confirm_p50_s"] = summarize(after).p50
    return out


#: The client's HTTP connections at most (see ``_throughput``).
HTTP_CONNECTIONS = 20


class _Completions:
    """One watcher for all runs in flight: resolves each run's future when the database
    shows it terminal.

    Woken by the run-event journal's NOTIFY (``qimpl_run_events``, one per event, a run's
    terminal event included: R-EVENT-2), it reads the state of the runs it was told of,
    every 10 ms at most; every 0.5 s it reads every run in flight, for a notice it missed.
    Until 2026-12-05 it read every run in flight every 10 ms: at concurrency 500 that cost
    the client about 10 ms of CPU a run, and the database as much again, charged to
    qimpl's throughput on the same two cores (the floor's client waits on Temporal's long
    poll instead)."""

    #: Seconds between full reads of every run in flight.
    SWEEP_S = 0.5

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.waiting: dict[str, asyncio.Future[str]] = {}

    async def wait(self, run_id: str, timeout_s: float = 300) -> str:
        fut = self.waiting.setdefault(run_id, asyncio.get_running_loop().create_future())
        return await asyncio.wait_for(fut, timeout_s)

    async def poll(self, stop: asyncio.Event) -> None:
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as listen, \
                await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            await listen.execute(f"LISTEN {EVENTS_CHANNEL}")
            swept = 0.0
            while not stop.is_set():
                told = {n.payload.split(":", 1)[0] async for n in listen.notifies(timeout=0.01)}
                now = time.monotonic()
                if now - swept >= self.SWEEP_S:
                    ids, swept = list(self.waiting), now
                else:
                    ids = [i for i in told if i in self.waiting]
                if ids:
                    cur = await conn.execute("SELECT run_id::text, state FROM runs WHERE run_id = ANY(%s)"
                                             " AND state IN ('completed', 'failed', 'expired', 'cancelled')",
                                             (ids,))
                    for run_id, state in await cur.fetchall():
                        fut = self.waiting.pop(run_id, None)
                        if fut is not None and not fut.done():
                            fut.set_result(state)


async def _throughput(api: ManagedProcess, dsn: str, concurrency: int, total: int, *,
                      prompt: str = PROMPT, timeout_s: float = 300,
                      latencies: list[float] | None = None) -> tuple[float, list[str], int, int]:
    """(elapsed seconds, run ids, runs not completed, 503 ``durable_dispatch_unknown``
    answers) of ``total`` runs of ``prompt``, ``concurrency`` in flight, each awaited at
    most ``timeout_s``; each run's seconds (its POST asked -> its terminal state seen) are
    appended to ``latencies`` when given. A 503 with its receipt is an
    accepted run whose dispatch the reconciler confirms later (R-CREATE-5): the client
    keeps the receipt and waits for that run, as the spec tells clients to.

    The runs in flight are ``concurrency``; the POSTs in flight at once are at most
    ``HTTP_CONNECTIONS``, each on a connection of its own. httpcore's pool matches every
    queued request against every connection at each event: with 500 POSTs queued on 505
    connections that was about 10 ms of the client's CPU a run (py-spy: 59 % of its
    samples in ``_assign_requests_to_connections``), on the two cores qimpl runs on."""
    done = _Completions(dsn)
    stop = asyncio.Event()
    ids: list[str] = []
    not_completed = unknown = 0
    conns = min(concurrency, HTTP_CONNECTIONS)
    posting = asyncio.Semaphore(conns)
    limits = httpx.Limits(max_connections=conns, max_keepalive_connections=conns)
    async with httpx.AsyncClient(base_url=api.base_url, headers=HEADERS, timeout=120, limits=limits) as client:

        async def one(_: int) -> None:
            nonlocal not_completed, unknown
            async with posting:
                resp = await client.post("/v1/agents/bench/runs", json=_body(prompt),
                                         headers={"Idempotency-Key": str(uuid.uuid4())})
            doc = resp.json()
            if resp.status_code == 503 and doc.get("code") == "durable_dispatch_unknown":
                unknown += 1
                run_id = str(doc["receipt"]["run_id"])
            elif resp.status_code == 202:
                run_id = str(doc["run_id"])
            else:
                raise HarnessError(f"create answered {resp.status_code}: {resp.text[:200]}")
            ids.append(run_id)
            if await done.wait(run_id, timeout_s) != "completed":
                not_completed += 1

        poller = asyncio.create_task(done.poll(stop))
        try:
            elapsed, lat = await closed_loop(one, concurrency=concurrency, total=total)
        finally:
            stop.set()
            await poller
    if latencies is not None:
        latencies.extend(lat)
    return elapsed, ids, not_completed, unknown


class _PeakRss:
    """Samples the peak RSS (MiB) of each process tree every 0.1 s, in a thread."""

    def __init__(self, procs: dict[str, int]) -> None:
        self.pids = procs
        self.peak = dict.fromkeys(procs, 0.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, pid in self.pids.items():
                try:
                    p = psutil.Process(pid)
                    rss = sum(x.memory_info().rss for x in [p, *p.children(recursive=True)])
                except psutil.Error:
                    continue
                self.peak[name] = max(self.peak[name], rss / 2**20)
            self._stop.wait(0.1)

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def _checkpoints(dsn: str, n: int) -> list[float]:
    """Seconds of ``n`` checkpoint commits through ``RunOwner.checkpoint`` as the worker's role."""
    from qimpl.db.owner import RunOwner
    from qualify.stack._embedded import WORKER_ROLE, with_user

    run_id = str(uuid.uuid4())
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt, stream_key,"
            " deadline_at) VALUES (%s, 't-dev', 'p-dev', 'bench', 'queued', 'x', 'k',"
            " now() + interval '1 hour')", (run_id,))
    samples = []
    async with await psycopg.AsyncConnection.connect(with_user(dsn, WORKER_ROLE), autocommit=True) as conn:
        await conn.execute("SELECT set_config('qimpl.tenant', 't-dev', false)")
        claim = await RunOwner.claim(conn, run_id, generation=1, attempt=1)
        if claim.owner is None:
            raise HarnessError(f"could not claim the checkpoint run: {claim.row['state']}")
        for step in range(1, n + 1):
            t0 = time.perf_counter()
            await claim.owner.checkpoint(step, state={"trail": [step]}, usage={"provider_calls": step})
            samples.append(time.perf_counter() - t0)
    return samples


def measure_qimpl(env: BenchEnv) -> dict[str, Any]:
    """Every qimpl figure (see the module docstring); the processes are always reaped."""
    out: dict[str, Any] = {}
    plan = env.plan
    with deployment_context(env, "qimpl") as ctx:
        dsn = ctx.deployment.dsn
        api = ctx.processes.spawn_api("api-1")
        # As deployed: the worker runs the reconciler for the tenant, which confirms a
        # dispatch the API could not (R-CREATE-5, R-OPS-3); everything else at defaults.
        worker = ctx.processes.spawn_worker("worker-1", env={"DURABLE_AGENT_RECONCILE_TENANTS": '["t-dev"]'})
        api.wait_ready()
        worker.wait_ready()
        _sequential(api, dsn, 3)  # warm-up
        rows0, wal0 = _table_rows(dsn), _wal_lsn(dsn)
        accept, ids, wall = _sequential(api, dsn, plan.sequential)
        rows1, wal1 = _table_rows(dsn), _wal_lsn(dsn)
        out["res.rows_per_run"] = (rows1 - rows0) / plan.sequential
        out["res.wal_bytes_per_run"] = (wal1 - wal0) / plan.sequential
        e2e = _e2e(dsn, ids)
        if len(e2e) != len(ids):
            raise HarnessError(f"{len(ids) - len(e2e)} of {len(ids)} sequential runs did not complete")
        out.update(_acceptance_phases(dsn, ids, wall))
        out.update(_e2e_phases(dsn, ids))
        a, e = summarize(accept), summarize(e2e)
        out.update({"qimpl.accept_p50_s": a.p50, "qimpl.accept_p95_s": a.p95,
                    "qimpl.e2e_p50_s": e.p50, "qimpl.e2e_p95_s": e.p95})
        env.log(f"  qimpl: accept p50 {a.p50 * 1000:.1f} ms, e2e p50 {e.p50 * 1000:.1f} ms")
        top = max(plan.concurrency)
        for c in plan.concurrency:
            total = plan.total(c)
            if c == top:
                with _PeakRss({"api": api.pid, "worker": worker.pid}) as rss:
                    elapsed, run_ids, bad, unknown = asyncio.run(_throughput(api, dsn, c, total))
                out["res.api_rss_mib"], out["res.worker_rss_mib"] = rss.peak["api"], rss.peak["worker"]
                out["res.rss_at_concurrency"] = c
            else:
                elapsed, run_ids, bad, unknown = asyncio.run(_throughput(api, dsn, c, total))
            out[f"qimpl.tput_c{c}"] = (total - bad) / elapsed
            out[f"qimpl.not_completed_c{c}"] = bad
            out[f"qimpl.dispatch_unknown_c{c}"] = unknown
            lat = _e2e(dsn, run_ids)
            if lat:
                out[f"qimpl.lat_c{c}_p50_s"] = summarize(lat).p50
            env.log(f"  qimpl: concurrency {c}: {(total - bad) / elapsed:.1f} runs/s ({bad} not completed, "
                    f"{unknown} answered 503 durable_dispatch_unknown)")
        out["qimpl.checkpoint_p50_s"] = summarize(asyncio.run(_checkpoints(dsn, plan.commits // 5 or 10))).p50
    return out
