"""Figures, not pass/fail: control-route latency with many open event streams (R-EVENT-2).

    python bench/streams.py [--streams 200] [--calls 60]

Boots the embedded stack (qualify's stack code), one API and one worker, parks ``calls``
runs awaiting input, then opens ``streams`` SSE streams on runs that keep committing
events (30 steps of 200 ms each, 20 at a time on the worker), and while they stream times
``calls`` creates, cancels and resumes on the same API instance. Prints p50/p99/max per
route and overall, the events the streams received, and whether the target (p99 < 1 s)
was met. Streams wait on the API's one LISTEN connection; none holds a pooled connection.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg

from qualify.fakes.synthetic import make_prompt
from qualify.processes import Deployment, Processes
from qualify.stack import EmbeddedStack

API_KEY = "dev-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
TARGET_P99_S = 1.0


def _create(base: str, prompt: str) -> tuple[float, dict[str, Any]]:
    t = time.perf_counter()
    resp = httpx.post(f"{base}/v1/agents/agent-1/runs", json={"prompt": prompt, "durable_temporal": True},
                      headers={**AUTH, "Idempotency-Key": str(uuid.uuid4())}, timeout=30)
    took = time.perf_counter() - t
    if resp.status_code != 202:
        raise RuntimeError(f"create answered {resp.status_code}: {resp.text[:200]}")
    doc: dict[str, Any] = resp.json()
    return took, doc


def _state(base: str, run_id: str) -> str:
    resp = httpx.get(f"{base}/v1/agents/agent-1/runs/{run_id}", headers=AUTH, timeout=30)
    return str(resp.json()["state"])


def _wait(what: str, check: Any, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout_s} s")
        time.sleep(0.2)


class Streams:
    """``n`` SSE streams in one asyncio loop (a thread), counting events per stream."""

    def __init__(self, base: str, runs: list[tuple[str, str]]) -> None:
        self.base, self.runs = base, runs
        self.events = [0] * len(runs)
        self.errors = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._all(),), daemon=True)
        self.thread.start()

    async def _one(self, client: httpx.AsyncClient, i: int, run_id: str, key: str) -> None:
        try:
            async with client.stream("GET", f"{self.base}/v1/agents/agent-1/runs/{run_id}/events",
                                     headers={"X-Stream-Key": key}) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("id:"):
                        self.events[i] += 1
                    elif line.startswith("event: terminal") or line.startswith("event:terminal"):
                        return
        except httpx.HTTPError:
            self.errors += 1

    async def _all(self) -> None:
        limits = httpx.Limits(max_connections=len(self.runs) + 10, max_keepalive_connections=0)
        async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(30.0, read=120.0)) as client:
            await asyncio.gather(*(self._one(client, i, r, k) for i, (r, k) in enumerate(self.runs)))

    @property
    def open_with_events(self) -> int:
        return sum(1 for n in self.events if n)


def _p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(0.99 * (len(xs) - 1)))]


def _figures(name: str, xs: list[float]) -> str:
    xs = sorted(xs)
    p99 = _p99(xs)
    return (f"{name}: n {len(xs)} p50 {statistics.median(xs) * 1000:.0f} ms  p99 {p99 * 1000:.0f} ms"
            f"  max {xs[-1] * 1000:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--calls", type=int, default=60)
    args = parser.parse_args()
    stack = EmbeddedStack()
    info = stack.start()
    work = Path(tempfile.mkdtemp(prefix="bench-streams-"))
    processes: Processes | None = None
    try:
        dsn = stack.create_database(f"bench_{uuid.uuid4().hex[:8]}")
        deployment = Deployment(dsn=dsn, temporal_address=info.temporal_address,
                                task_queue=f"bench-{uuid.uuid4().hex[:8]}", control_dir=work / "control",
                                logs_dir=work / "logs", heartbeat_timeout_s=5.0)
        deployment.control_dir.mkdir(parents=True)
        deployment.logs_dir.mkdir(parents=True)
        processes = Processes(deployment)
        api = processes.api("api-1")
        processes.worker("worker-1")
        base = api.base_url
        parked = [_create(base, make_prompt(steps=2, park={"step": 1, "kind": "input"}))[1]["run_id"]
                  for _ in range(args.calls)]
        _wait("runs parked", lambda: all(_state(base, r) == "awaiting_input" for r in parked))
        busy = [_create(base, make_prompt(steps=30, delay_ms=200))[1] for _ in range(args.streams)]
        streams = Streams(base, [(d["run_id"], d["stream_key"]) for d in busy])
        _wait(f"{args.streams} streams open", lambda: streams.open_with_events == args.streams, 60)
        with psycopg.connect(dsn, autocommit=True) as admin:
            sessions = admin.execute(
                "SELECT application_name, count(*) FROM pg_stat_activity"
                " WHERE application_name LIKE 'qimpl-api%%' GROUP BY 1 ORDER BY 1").fetchall()
        print(f"API database sessions with {args.streams} streams open: "
              + ", ".join(f"{name} {n}" for name, n in sessions) + " (pool max 10, plus one LISTEN)")
        timings: dict[str, list[float]] = {"create": [], "cancel": [], "resume": []}
        created = []
        for _ in range(args.calls):
            took, doc = _create(base, make_prompt(steps=3, delay_ms=100))
            timings["create"].append(took)
            created.append(doc["run_id"])
        for run_id in created:
            t = time.perf_counter()
            httpx.post(f"{base}/v1/agents/agent-1/runs/{run_id}/cancel", headers=AUTH, timeout=30)
            timings["cancel"].append(time.perf_counter() - t)
        for run_id in parked:
            t = time.perf_counter()
            resp = httpx.post(f"{base}/v1/agents/agent-1/runs/{run_id}/resume",
                              json={"additional_prompt": "go on"},
                              headers={**AUTH, "Idempotency-Key": str(uuid.uuid4())}, timeout=30)
            timings["resume"].append(time.perf_counter() - t)
            if resp.status_code != 202:
                raise RuntimeError(f"resume answered {resp.status_code}: {resp.text[:200]}")
        still_open = sum(1 for n in streams.events if n) - streams.errors
        print(f"open streams while timing: {args.streams} (stream errors {streams.errors}), "
              f"events received so far {sum(streams.events)}")
        for name, xs in timings.items():
            print(_figures(name, xs))
        everything = [x for xs in timings.values() for x in xs]
        print(_figures("all control routes", everything))
        p99 = _p99(everything)
        print(f"target p99 < {TARGET_P99_S:.0f} s: {'met' if p99 < TARGET_P99_S else 'MISSED'}"
              f" ({still_open} streams had events)")
    finally:
        if processes is not None:
            processes.stop_all()
        stack.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
