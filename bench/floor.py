"""Section 1, the floor: what Temporal and PostgreSQL cost alone on this stack.

Figures (seconds, per second): ``floor.wf_p50_s``/``wf_p95_s`` end-to-end latency of a
bare workflow with one no-op activity over ``plan.sequential`` sequential runs, as the
client sees it (``execute_workflow``: start, then the result's long poll);
``floor.wf_server_p50_s`` the same runs on the server's clock, first history event to the
close event — the span qimpl's end-to-end figure measures (two commit times), so the
one the e2e budget is built from;
``floor.start_p50_s`` a raw ``start_workflow`` (the client's call until the server
acknowledged the start); ``floor.tput_c<C>`` workflows completed per second with one
worker process at each concurrency; ``floor.commit_p50_s`` a bare one-row UPDATE commit
(autocommit, ``synchronous_commit`` as the stack runs it).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import psycopg
from temporalio.client import Client

from bench.env import BenchEnv, Subprocess, python_m
from bench.load import closed_loop, timed
from bench.stats import summarize

__all__ = ["measure_commit", "measure_floor"]


def measure_commit(dsn: str, n: int) -> list[float]:
    """Seconds of ``n`` one-row UPDATE commits (autocommit) on a table of one row."""
    samples = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_floor (id int PRIMARY KEY, n bigint NOT NULL)")
        conn.execute("INSERT INTO bench_floor VALUES (1, 0) ON CONFLICT DO NOTHING")
        for _ in range(n):
            t0 = time.perf_counter()
            conn.execute("UPDATE bench_floor SET n = n + 1 WHERE id = 1")
            samples.append(time.perf_counter() - t0)
    return samples


async def _workflows(env: BenchEnv, task_queue: str) -> dict[str, float]:
    client = await Client.connect(env.temporal_address)
    prefix = uuid.uuid4().hex[:8]

    async def run_one(i: int, tag: str) -> None:
        await client.execute_workflow("BareWorkflow", id=f"floor-{prefix}-{tag}-{i}",
                                      task_queue=task_queue)

    for i in range(3):  # warm-up: worker caches, connections
        await run_one(i, "warm")
    e2e = [await timed(lambda i=i: run_one(i, "seq")) for i in range(env.plan.sequential)]  # type: ignore[misc]
    # The same runs on the server's clock, start event to close event: the span qimpl's
    # end-to-end figure measures (accepted_at -> completed_at, both commit times), without
    # the client's own result long poll.
    server = []
    for i in range(env.plan.sequential):
        times = [e.event_time.ToDatetime().timestamp() async for e in
                 client.get_workflow_handle(f"floor-{prefix}-seq-{i}").fetch_history_events()]
        server.append(times[-1] - times[0])
    starts = []
    for i in range(env.plan.sequential):
        t0 = time.perf_counter()
        handle = await client.start_workflow("BareWorkflow", id=f"floor-{prefix}-start-{i}",
                                             task_queue=task_queue)
        starts.append(time.perf_counter() - t0)
        await handle.result()
    out = {"floor.wf_p50_s": summarize(e2e).p50, "floor.wf_p95_s": summarize(e2e).p95,
           "floor.wf_server_p50_s": summarize(server).p50,
           "floor.start_p50_s": summarize(starts).p50}
    for c in env.plan.concurrency:
        total = env.plan.total(c)
        elapsed, lat = await closed_loop(lambda i, c=c: run_one(i, f"c{c}"), concurrency=c,  # type: ignore[misc]
                                         total=total)
        out[f"floor.tput_c{c}"] = total / elapsed
        out[f"floor.lat_c{c}_p50_s"] = summarize(lat).p50
        env.log(f"  floor: concurrency {c}: {total / elapsed:.1f} workflows/s")
    return out


def measure_floor(env: BenchEnv) -> dict[str, Any]:
    """Every floor figure (see the module docstring). The worker is a subprocess, always
    reaped; raises HarnessError if it does not come up."""
    out: dict[str, Any] = {}
    commits = measure_commit(env.plain_database("bench_floor"), env.plan.commits)
    out["floor.commit_p50_s"] = summarize(commits).p50
    task_queue = f"floor-{uuid.uuid4().hex[:8]}"
    with Subprocess(python_m("bench.floor_worker", "--address", env.temporal_address,
                             "--task-queue", task_queue),
                    log_path=env.workdir / "logs" / "floor-worker.log", ready_line="floor.ready"):
        out.update(asyncio.run(_workflows(env, task_queue)))
    return out
