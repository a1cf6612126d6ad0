"""What eager workflow start would save a dispatch: ``python -m bench.eager_probe``
(about 15 s; boots its own dev servers).

Issue 21's end-to-end target is out of reach for a dispatch that starts a Temporal
workflow from the API (bench/RESULTS.md, "The floor"). Eager workflow start
(``start_workflow(request_eager_start=True)``) hands the first workflow task back in the
start call's answer, to a worker *in the calling process*, instead of through the history
shard's transfer queue and matching. This probe measures what that would buy before any
design is built on it. A bare workflow with one no-op activity; the figure is the time
from the start call to the activity's first line, p50 / p90 of ``--runs`` runs per case
after a warm-up, the cases alternated run by run:

- ``plain``: a start call from a client whose process also runs the worker (workflows and
  activities on one worker), not eager: what qimpl's worker sees today;
- ``eager``: the same, eager. This is the design where the *worker* starts the workflows
  it will run, for example woken by the acceptance commit;
- ``eager, split``: eager, but the calling process's worker runs workflows only and the
  activity runs on another worker (an API that hosts a workflow-only worker). The activity
  task then takes the transfer queue itself.

Each case is run on the dev server as started by default and on the sharded one
(``qualify.stack.temporal.SHARD_RATE_DYNAMIC_CONFIG``). Measured figures and what they
mean for the design: bench/RESULTS.md, "Eager workflow start, measured".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
import uuid
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

__all__ = ["ProbeWorkflow", "main"]

#: Workflow id -> ``time.perf_counter()`` at its activity's first line.
_BEGAN: dict[str, float] = {}


@activity.defn
async def began() -> None:
    _BEGAN[str(activity.info().workflow_id)] = time.perf_counter()


@workflow.defn(name="EagerProbeWorkflow")
class ProbeWorkflow:
    @workflow.run
    async def run(self) -> None:
        await workflow.execute_activity(began, start_to_close_timeout=timedelta(seconds=30))


CASES: dict[str, tuple[bool, bool]] = {"plain": (False, False), "eager": (True, False),
                                       "eager, split": (True, True)}


async def _one(client: Client, queue: str, eager: bool) -> float:
    """Seconds from the start call to the activity's first line."""
    wf_id = f"eager-probe-{uuid.uuid4()}"
    sent = time.perf_counter()
    handle = await client.start_workflow(ProbeWorkflow.run, id=wf_id, task_queue=queue,
                                         request_eager_start=eager)
    await handle.result()
    return _BEGAN.pop(wf_id) - sent


async def _probe(address: str, runs: int, warm_up: int) -> dict[str, list[float]]:
    """Seconds per case (``CASES``), ``runs`` each, alternated run by run."""
    client = await Client.connect(address)
    runner = UnsandboxedWorkflowRunner()
    together, split = f"together-{uuid.uuid4().hex[:8]}", f"split-{uuid.uuid4().hex[:8]}"
    async with contextlib.AsyncExitStack() as workers:
        for worker in (Worker(client, task_queue=together, workflows=[ProbeWorkflow], activities=[began],
                              workflow_runner=runner),
                       Worker(client, task_queue=split, workflows=[ProbeWorkflow], workflow_runner=runner),
                       Worker(client, task_queue=split, activities=[began])):
            await workers.enter_async_context(worker)
        for _ in range(warm_up):  # past the shard reader's burst (RESULTS.md, "The floor")
            await _one(client, together, False)
        out: dict[str, list[float]] = {case: [] for case in CASES}
        for _ in range(runs):
            for case, (eager, apart) in CASES.items():
                out[case].append(await _one(client, split if apart else together, eager))
    return out


def _line(server: str, case: str, xs: list[float]) -> str:
    xs = sorted(xs)
    return (f"{server:8s} {case:13s} start -> activity p50 {statistics.median(xs) * 1000:6.1f} ms"
            f"  p90 {xs[int(0.9 * (len(xs) - 1))] * 1000:6.1f} ms")


def main() -> None:
    """Entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m bench.eager_probe")
    parser.add_argument("--runs", type=int, default=30, help="runs per case and server")
    parser.add_argument("--warm-up", type=int, default=15, help="unmeasured runs first")
    args = parser.parse_args()
    from qualify.stack import EmbeddedStack
    from qualify.stack.temporal import SHARD_RATE_DYNAMIC_CONFIG

    for server, config in (("default", None), ("sharded", SHARD_RATE_DYNAMIC_CONFIG)):
        stack = EmbeddedStack(temporal_config=config)
        try:
            stack.start()
            assert stack.info is not None
            got = asyncio.run(_probe(stack.info.temporal_address, args.runs, args.warm_up))
        finally:
            stack.stop()
        for case, xs in got.items():
            print(_line(server, case, xs), flush=True)


if __name__ == "__main__":
    main()
