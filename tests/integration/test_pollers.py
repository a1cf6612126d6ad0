"""Worker availability against the real Temporal dev server (R-OPS-6): a live worker
keeps ``qimpl_task_queue_pollers`` at 1 or more even while idle (its last poll older than
the window: the next starts only when the long poll expires, about a minute), and the
count falls to 0 within LIVE_WINDOW_S (+ 5 s of slack) of the worker stopping, whether it
shut down, was killed or was frozen (SIGSTOP, and then stays 0 while it is)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from qimpl.metrics import LIVE_WINDOW_S, LONG_POLL_S, live_poller_counts
from qualify.processes import Deployment, Processes

SLACK_S = 5.0
#: How long a frozen worker must stay uncounted (seconds): past one long poll's expiry.
FROZEN_WATCH_S = LONG_POLL_S + 10


async def _until(check: Callable[[], Awaitable[bool]], *, timeout_s: float, what: str) -> float:
    """Poll ``check`` until true; the seconds it took. Fails after ``timeout_s``."""
    start = time.monotonic()
    while not await check():
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"{what} not reached within {timeout_s} s")
        await asyncio.sleep(0.2)
    return time.monotonic() - start


async def _oldest_poll_age_s(client: Client, queue: str) -> float:
    """Seconds since the most recent poll started, over both kinds (Temporal's view)."""
    ages = []
    for tq_type in (TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY):
        resp = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
            namespace="default", task_queue=TaskQueue(name=queue), task_queue_type=tq_type))
        ages += [time.time() - p.last_access_time.ToMicroseconds() / 1e6 for p in resp.pollers]
    return min(ages) if ages else 0.0


@pytest.mark.req("R-OPS-6")
@pytest.mark.parametrize("stop", ["sigterm", "sigkill", "sigstop"])
def test_pollers_metric_follows_the_worker(stack: Any, stop: str) -> None:
    work = Path(tempfile.mkdtemp(prefix="qualify-pollers-"))
    (work / "control").mkdir()
    queue = f"pollers-{uuid.uuid4().hex[:8]}"
    processes = Processes(Deployment(
        dsn=stack.create_database(), temporal_address=stack.info.temporal_address,
        task_queue=queue, control_dir=work / "control", logs_dir=work / "logs"))

    async def scenario() -> float:
        client = await Client.connect(stack.info.temporal_address, namespace="default")

        async def counts() -> dict[str, int]:
            return await live_poller_counts(client, "default", queue)

        async def live() -> bool:
            return min((await counts()).values()) >= 1

        async def gone() -> bool:
            return max((await counts()).values()) == 0

        assert await gone(), "a fresh task queue has no live pollers"
        worker = processes.worker()  # returns once it logged worker.ready
        await _until(live, timeout_s=30, what="pollers >= 1 for both kinds")

        async def idle_beyond_window() -> bool:
            # while the worker idles, the count must never drop: check every sample
            assert await live(), "a live idle worker was reported missing"
            return await _oldest_poll_age_s(client, queue) > LIVE_WINDOW_S + 1

        await _until(idle_beyond_window, timeout_s=LONG_POLL_S,
                     what="an idle worker whose last poll is older than the window")
        start = time.monotonic()
        if stop == "sigterm":
            worker.stop()  # graceful: SIGTERM, waits for the exit
        elif stop == "sigkill":
            worker.sigkill()  # no goodbye: its heartbeats just stop
        else:
            worker.sigstop()  # frozen: its heartbeats stop, its connection stays open
        stopped_s = time.monotonic() - start
        print(f"stop took {stopped_s:.2f} s")
        took = stopped_s + await _until(
            gone, timeout_s=LIVE_WINDOW_S + SLACK_S + 10, what="pollers == 0")
        if stop == "sigstop":
            # and it stays 0 while the worker stays frozen: Temporal refreshes a frozen
            # worker's poll time (a tester saw 'LastAccessTime 2 seconds ago' 15 s and
            # 48 s after the SIGSTOP, and the count back at 1), so it must not count
            frozen_until = time.monotonic() + FROZEN_WATCH_S
            while time.monotonic() < frozen_until:
                seen = await counts()
                assert max(seen.values()) == 0, f"a frozen worker counted again: {seen}"
                await asyncio.sleep(0.5)
            worker.sigcont()
        return took

    try:
        took = asyncio.run(scenario())
    finally:
        processes.stop_all()
        shutil.rmtree(work, ignore_errors=True)
    print(f"pollers fell to 0 {took:.1f} s after the {stop}")
    assert took <= LIVE_WINDOW_S + SLACK_S, f"pollers still counted {took:.1f} s after the {stop}"
