"""Figures, not pass/fail: the API's answers after its pooled connections die (issue 22,
item 7; the scenario ``api-pool-connections-killed`` holds the bound, this measures it).

    python bench/pool_loss.py [--rounds 5] [--burst 40]

Boots the embedded stack (qualify's stack code), one API and one worker, opens every
pooled connection of the API (``QIMPL_API_POOL_SIZE``) with a burst of reads, then, each
round, terminates every one of them (``pg_terminate_backend`` of ``qimpl-api``) and at
once sends ``burst`` concurrent requests (reads and creates). Prints, over all rounds,
the answer times (p50/p99/max, seconds) and the answers by status and code: a request
after any number of dead pooled connections must be answered 200/202, or a coded 503,
never hang (before the fix some answered after more than 10 s, or never).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg

from qualify.fakes.synthetic import make_prompt
from qualify.processes import Deployment, Processes
from qualify.stack import EmbeddedStack

AUTH = {"Authorization": "Bearer dev-key"}
POOL_SIZE = 10


def _request(base: str, i: int, run_id: str) -> tuple[str, float]:
    t = time.perf_counter()
    try:
        if i % 2:
            resp = httpx.get(f"{base}/v1/agents/agent-1/runs/{run_id}", headers=AUTH, timeout=60)
        else:
            resp = httpx.post(f"{base}/v1/agents/agent-1/runs", timeout=60,
                              json={"prompt": make_prompt(steps=1), "durable_temporal": True},
                              headers={**AUTH, "Idempotency-Key": str(uuid.uuid4())})
    except httpx.HTTPError as exc:
        return f"transport {type(exc).__name__}", time.perf_counter() - t
    code = resp.json().get("code", "") if resp.status_code >= 400 else ""
    return f"{resp.status_code} {code}".strip(), time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--burst", type=int, default=40)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-pool-"))
    with EmbeddedStack() as stack:
        assert stack.info is not None
        dsn = stack.create_database()
        (tmp / "control").mkdir()
        procs = Processes(Deployment(dsn=dsn, temporal_address=stack.info.temporal_address,
                                     task_queue="bench-pool", control_dir=tmp / "control",
                                     logs_dir=tmp / "logs"))
        try:
            api = procs.api(QIMPL_API_POOL_SIZE=str(POOL_SIZE))
            procs.worker()
            first = httpx.post(f"{api.base_url}/v1/agents/agent-1/runs", timeout=30,
                               json={"prompt": make_prompt(steps=1), "durable_temporal": True},
                               headers={**AUTH, "Idempotency-Key": str(uuid.uuid4())}).json()["run_id"]
            answers: Counter[str] = Counter()
            times: list[float] = []
            with ThreadPoolExecutor(max_workers=args.burst) as pool:
                for _ in range(args.rounds):
                    list(pool.map(lambda i: _request(api.base_url, 1, first), range(POOL_SIZE * 2)))
                    with psycopg.connect(dsn, autocommit=True) as conn:
                        killed = conn.execute("SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity"
                                              " WHERE application_name = 'qimpl-api'").fetchone()
                    for answer, took in pool.map(lambda i: _request(api.base_url, i, first), range(args.burst)):
                        answers[answer] += 1
                        times.append(took)
                    print(f"round: {killed[0] if killed else 0} pooled connections terminated")
        finally:
            procs.stop_all()
    shutil.rmtree(tmp, ignore_errors=True)
    times.sort()
    p99 = times[max(int(len(times) * 0.99) - 1, 0)]
    print(f"{len(times)} requests after pool loss: p50 {statistics.median(times):.3f} s, "
          f"p99 {p99:.3f} s, max {times[-1]:.3f} s")
    print("answers: " + ", ".join(f"{a} x{n}" for a, n in answers.most_common()))


if __name__ == "__main__":
    main()
