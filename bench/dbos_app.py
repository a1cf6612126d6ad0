"""The peer's process: a 3-step DBOS Transact workflow on the stack's PostgreSQL.

    python -m bench.dbos_app measure --db-url URL --sequential N --levels 1:10,10:20
    python -m bench.dbos_app hold    --db-url URL --control DIR --workflow-id W
    python -m bench.dbos_app recover --db-url URL --control DIR --workflow-id W
    python -m bench.dbos_app model   --db-url URL --control DIR --runs N --steps S --delay-ms D

``measure`` prints one line ``dbos.result <json>``: end-to-end seconds of ``N``
sequential workflows and, per ``concurrency:total`` level, the wall time of a closed
loop (as ``bench.load.closed_loop`` runs qimpl's and the floor's). ``hold`` starts
workflow ``W``, whose step 2 then waits for ever (``dbos.held`` once step 1 is done):
the benchmark SIGKILLs it there. ``recover`` is the restart: DBOS recovers ``W`` at
launch and its step 2 writes ``<DIR>/step2.done`` (epoch seconds) when it runs.
``model`` is the model-bound load (``bench.model_bound``): after a warm-up it prints
``dbos.warm`` and waits for ``<DIR>/go``, then starts ``N`` workflows of ``S`` async steps
each sleeping ``D`` ms, all at once, prints ``dbos.model <json>`` (wall time and each
workflow's seconds) and stays up until SIGTERM, so that its CPU time can be read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from pathlib import Path

from dbos import DBOS, DBOSConfig, SetWorkflowID, WorkflowHandleAsync

from bench.load import closed_loop

_HOLD = "BENCH_DBOS_HOLD"


@DBOS.step()
async def step_one(n: int) -> int:
    return n + 1


@DBOS.step()
async def step_two(n: int, control: str) -> int:
    if os.environ.get(_HOLD) == "1":
        print("dbos.held", flush=True)
        while True:  # the benchmark SIGKILLs the process here
            await asyncio.sleep(0.05)
    if control:
        Path(control, "step2.done").write_text(str(time.time()))
    return n + 1


@DBOS.step()
async def step_three(n: int) -> int:
    return n + 1


@DBOS.workflow()
async def three_steps(n: int, control: str = "") -> int:
    n = await step_one(n)
    n = await step_two(n, control)
    return await step_three(n)


@DBOS.step()
async def model_call(delay_ms: int) -> None:
    await asyncio.sleep(delay_ms / 1000)


@DBOS.workflow()
async def model_bound(steps: int, delay_ms: int) -> int:
    for _ in range(steps):
        await model_call(delay_ms)
    return steps


def _launch(db_url: str) -> None:
    config: DBOSConfig = {"name": "bench-dbos", "system_database_url": db_url, "log_level": "WARNING"}
    DBOS(config=config)
    DBOS.launch()


async def _measure(sequential: int, levels: list[tuple[int, int]]) -> dict[str, object]:
    for i in range(3):  # warm-up
        await three_steps(i)
    e2e = []
    for i in range(sequential):
        t0 = time.perf_counter()
        await three_steps(i)
        e2e.append(time.perf_counter() - t0)
    out: dict[str, object] = {"e2e_s": e2e}
    for concurrency, total in levels:
        elapsed, lat = await closed_loop(three_steps, concurrency=concurrency, total=total)
        out[f"c{concurrency}"] = {"total": total, "elapsed_s": elapsed, "latencies_s": lat}
    return out


async def _model(control: str, runs: int, steps: int, delay_ms: int) -> None:
    for _ in range(2):  # warm-up
        await model_bound(steps, 0)
    print("dbos.warm", flush=True)
    go = Path(control, "go")
    while not go.exists():
        await asyncio.sleep(0.01)
    elapsed, lat = await closed_loop(lambda _: model_bound(steps, delay_ms), concurrency=runs, total=runs)
    print("dbos.model " + json.dumps({"elapsed_s": elapsed, "latencies_s": lat}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def _hold(control: str, workflow_id: str) -> None:
    with SetWorkflowID(workflow_id):
        await DBOS.start_workflow_async(three_steps, 0, control)
    await asyncio.sleep(3600)


async def _recover(workflow_id: str) -> None:
    handle: WorkflowHandleAsync[int] = await DBOS.retrieve_workflow_async(workflow_id)
    result = await handle.get_result()
    print(f"dbos.recovered {result}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("measure", "hold", "recover", "model"))
    parser.add_argument("--db-url", required=True)
    parser.add_argument("--sequential", type=int, default=10)
    parser.add_argument("--levels", default="")
    parser.add_argument("--control", default="")
    parser.add_argument("--workflow-id", default="")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--delay-ms", type=int, default=1000)
    args = parser.parse_args()
    _launch(args.db_url)
    print("dbos.ready", flush=True)
    try:
        if args.mode == "measure":
            levels = [(int(c), int(t)) for c, t in (lv.split(":") for lv in args.levels.split(",") if lv)]
            result = asyncio.run(_measure(args.sequential, levels))
            print("dbos.result " + json.dumps(result), flush=True)
        elif args.mode == "model":
            asyncio.run(_model(args.control, args.runs, args.steps, args.delay_ms))
        elif args.mode == "hold":
            asyncio.run(_hold(args.control, args.workflow_id))
        else:
            asyncio.run(_recover(args.workflow_id))
    finally:
        DBOS.destroy()


if __name__ == "__main__":
    main()
