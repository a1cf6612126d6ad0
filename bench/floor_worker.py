"""The floor's worker process: a bare temporalio workflow with one no-op activity
(``BareWorkflow``), and the model-bound floor (``SleepyWorkflow``: ``steps`` activities in
a row, each ``asyncio.sleep(delay_ms)``, as a model call waits on its provider).

    python -m bench.floor_worker --address HOST:PORT --task-queue Q

Temporal's defaults throughout (no qimpl code, the SDK's worker defaults: its activity
and workflow-task slots included): the floor is what Temporal alone costs.
Prints ``floor.ready`` once polling; exits on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

__all__ = ["BareWorkflow", "SleepyWorkflow", "noop", "sleep_ms"]


@activity.defn
async def noop() -> None:
    return None


@activity.defn
async def sleep_ms(delay_ms: int) -> None:
    await asyncio.sleep(delay_ms / 1000)


@workflow.defn(name="BareWorkflow")
class BareWorkflow:
    @workflow.run
    async def run(self) -> None:
        await workflow.execute_activity(noop, start_to_close_timeout=timedelta(seconds=30))


@workflow.defn(name="SleepyWorkflow")
class SleepyWorkflow:
    @workflow.run
    async def run(self, steps: int, delay_ms: int) -> None:
        for _ in range(steps):
            await workflow.execute_activity(sleep_ms, delay_ms, start_to_close_timeout=timedelta(seconds=600))


async def _main(address: str, task_queue: str) -> None:
    client = await Client.connect(address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with Worker(client, task_queue=task_queue, workflows=[BareWorkflow, SleepyWorkflow],
                      activities=[noop, sleep_ms]):
        print("floor.ready", flush=True)
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--task-queue", required=True)
    args = parser.parse_args()
    asyncio.run(_main(args.address, args.task_queue))


if __name__ == "__main__":
    main()
