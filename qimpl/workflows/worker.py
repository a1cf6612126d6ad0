"""Worker entry point: ``python -m qimpl.workflows.worker``.

Polls the task queue for the agent-run workflows and activities. Prints one JSON log
line with ``"event": "worker.ready"`` once polling has started. Exits 0 on SIGTERM or
SIGINT after a graceful shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from datetime import timedelta

from temporalio.client import Client
from temporalio.worker import Worker

from qimpl.logs import setup_logging
from qimpl.provider import load_provider
from qimpl.settings import Settings, get_settings
from qimpl.workflows.activities import AgentActivities
from qimpl.workflows.agent_run import AgentRunWorkflowV2
from qimpl.workflows.agent_run_v1 import AgentRunWorkflowV1

__all__ = ["WORKFLOWS", "build_worker", "main"]

log = logging.getLogger("qimpl.worker")

#: Every workflow type the worker serves; version 1 stays for replay (R-EXEC-10).
WORKFLOWS = (AgentRunWorkflowV2, AgentRunWorkflowV1)


def build_worker(client: Client, settings: Settings) -> Worker:
    """A worker for ``settings.task_queue`` with the real activities and the configured provider."""
    provider = load_provider(settings.provider, settings.provider_config)
    activities = AgentActivities(dsn=settings.database_url, provider=provider)
    return Worker(
        client,
        task_queue=settings.task_queue,
        workflows=list(WORKFLOWS),
        activities=[activities.run_agent, activities.fail_run, activities.run_agent_v1],
        # After a worker dies its sticky queue would hold the next workflow task for the
        # default 10 s; a short timeout hands it to a live worker quickly.
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
        # A paused worker's outstanding activity polls can each swallow one retry (the
        # server hands it the task; it never starts). Fewer polls, fewer lost attempts.
        max_concurrent_activity_task_polls=2,
        graceful_shutdown_timeout=timedelta(seconds=2),
    )


async def run(settings: Settings) -> None:
    client = await Client.connect(settings.temporal_address, namespace=settings.temporal_namespace)
    worker = build_worker(client, settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with worker:
        log.info("worker ready on %s", settings.task_queue,
                 extra={"event": "worker.ready", "pid": os.getpid()})
        await stop.wait()
    log.info("worker stopped", extra={"event": "worker.stopped"})


def main() -> None:
    setup_logging()
    asyncio.run(run(get_settings()))


if __name__ == "__main__":
    main()
