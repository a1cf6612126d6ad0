"""The real ``qimpl`` processes a scenario runs: API (uvicorn) and worker subprocesses,
and the side-effect sink their tools call.

Each process is started in its own session with a log file of its own, is ready when a
probe says so (``/healthz`` for the API, the ``worker.ready`` log line for a worker,
``sink.ready`` for the sink), and is always stopped and reaped by ``Processes.stop_all``
or ``SinkProcess.stop`` (R-Q-2).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from qualify import http
from qualify.errors import HarnessError
from qualify.procs import Child, free_port, kill_tree, quiet_port, spawn, wait_until
from qualify.timing import spent

if TYPE_CHECKING:
    from qualify.forkserver import ForkServer

__all__ = ["Deployment", "ManagedProcess", "Processes", "SinkProcess", "faketime_env"]

READY_TIMEOUT_S = 60.0
SINK_READY_TIMEOUT_S = 10.0


@dataclass(frozen=True, kw_only=True)
class Deployment:
    """What one scenario's processes share: database, Temporal, queue and control dir."""

    dsn: str
    temporal_address: str
    task_queue: str
    control_dir: Path
    logs_dir: Path
    namespace: str = "default"
    heartbeat_timeout_s: float = 1.0
    #: The ownership lease, seconds; None: the heartbeat timeout, the lease the catalog
    #: was written for (its waits are multiples of it, docs/scenario-timings.md).
    #: ``bench`` and ``qualify up`` set the product's defaults (a lease below the timeout).
    lease_s: float | None = None
    #: The ownership lease of the scenarios that pause an owner inside a transaction
    #: (``qualify.scenarios.lease``), seconds. 3 s in ``qualify run``: long enough that the
    #: harness sees the paused session idle in transaction before PostgreSQL ends it, even
    #: on a loaded machine (at 1 s it sometimes did not). ``bench`` sets the product's
    #: default lease, so that its figure is judged against the lease it ran with.
    paused_lease_s: float = 3.0
    extra_env: dict[str, str] = field(default_factory=dict)
    #: The side-effect sink the harness tools call (``qualify.fakes.sink``); empty: no tools.
    sink_url: str = ""
    #: The API's access log (uvicorn's, one line per request, in its log file): off in the
    #: harness (its scenarios make thousands of requests), on for ``qualify up``.
    access_log: bool = False

    @property
    def lease(self) -> float:
        """The ownership lease the processes are given, seconds (``lease_s``)."""
        return self.lease_s if self.lease_s is not None else self.heartbeat_timeout_s

    @property
    def sink_dir(self) -> Path:
        """Where the sink records requests and executions (``requests.jsonl``, ``executions.jsonl``)."""
        return self.control_dir / "sink"

    def app_dsn(self, role: str) -> str:
        """The DSN of a restricted application role (R-AUTH-4)."""
        from qualify.stack._embedded import with_user

        return with_user(self.dsn, role)

    def env(self, role: str = "qimpl_worker", **overrides: str) -> dict[str, str]:
        """The environment of a qimpl process connecting as ``role``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("QIMPL_", "AGENT_", "DURABLE_"))}
        env.update(
            QIMPL_DATABASE_URL=self.app_dsn(role),
            QIMPL_TEMPORAL_ADDRESS=self.temporal_address,
            QIMPL_TEMPORAL_NAMESPACE=self.namespace,
            QIMPL_TASK_QUEUE=self.task_queue,
            QIMPL_PROVIDER="qualify.fakes.synthetic:SyntheticProvider",
            QIMPL_PROVIDER_CONFIG=json.dumps({"control_dir": str(self.control_dir)}),
            QIMPL_CONTROL_DIR=str(self.control_dir),
            QIMPL_HEARTBEAT_TIMEOUT_S=str(self.heartbeat_timeout_s),
            QIMPL_LEASE_S=str(self.lease),
            # Counted failures spaced 0.2 s doubling to 1 s, as Temporal's own retry was before
            # the backoff: the scenarios that count failures stay fast. provider-outage-survived
            # sets the product's defaults (qimpl.backoff) back.
            QIMPL_PROVIDER_BACKOFF_S="0.2",
            QIMPL_PROVIDER_BACKOFF_MAX_S="1",
            PYTHONUNBUFFERED="1",
        )
        if self.sink_url:
            env.update(QIMPL_TOOLS="qualify.fakes.tools:sink_tools",
                       QIMPL_TOOLS_CONFIG=json.dumps({"sink_url": self.sink_url}))
        env.update(self.extra_env)
        env.update(overrides)
        return env


class ManagedProcess:
    """One API or worker process. ``start`` returns once it is ready."""

    def __init__(self, *, name: str, kind: str, argv: list[str], env: dict[str, str],
                 log_path: Path, port: int | None = None, launcher: ForkServer | None = None) -> None:
        self.name = name
        self.kind = kind
        self.argv = argv
        self.env = env
        self.log_path = log_path
        self.port = port
        self.proc: Child | None = None
        self.started_at = 0.0
        self._offset = 0
        #: Forks ``python -m`` processes from preloaded modules (the soak, R-Q-10); None: exec.
        self.launcher = launcher
        #: How the last spawn started the process: ``exec`` or ``fork``.
        self.spawned_by = ""
        #: Every pid this process had (a restart spawns it again).
        self.pids: list[int] = []

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise HarnessError(f"{self.name} is not running")
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ManagedProcess:
        """Spawn the process and wait until it is ready (``spawn`` + ``wait_ready``)."""
        with spent("process_start"):
            return self.spawn().wait_ready()

    def spawn(self) -> ManagedProcess:
        """Start the process without waiting: several can then boot at once."""
        self._offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        if self.launcher is not None and self.argv[1:2] == ["-m"] and self.launcher.accepts(self.env):
            self.proc = self.launcher.spawn(self.argv[2], self.argv[3:], env=self.env, log_path=self.log_path)
            self.spawned_by = "fork"
        else:
            self.proc = spawn(self.argv, log_path=self.log_path, env=self.env)
            self.spawned_by = "exec"
        self.pids.append(self.proc.pid)
        self.started_at = time.time()
        return self

    def wait_ready(self) -> ManagedProcess:
        """Return once the spawned process is ready; HarnessError if it exits first or
        is not ready within READY_TIMEOUT_S."""
        if self.proc is None:
            raise HarnessError(f"{self.name} was never spawned")
        try:
            if self.kind == "api":
                wait_until(self._healthy, timeout_s=READY_TIMEOUT_S, what=self.name, proc=self.proc,
                           interval_s=0.05, kind="process_start")
            else:
                wait_until(lambda: self._logged("worker.ready", self._offset), timeout_s=READY_TIMEOUT_S,
                           what=self.name, proc=self.proc, interval_s=0.05, kind="process_start")
        except HarnessError as exc:
            said = self.last_words()
            raise HarnessError(f"{exc}{f': {said}' if said else ''}") from None
        return self

    def last_words(self) -> str:
        """The ``msg`` of the last line this start of the process logged (its own one-line
        reason when it refused to start, such as a bad setting), or ''."""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self._offset)
                lines = [ln for ln in fh.read().decode(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        if not lines:
            return ""
        try:
            doc = json.loads(lines[-1])
        except ValueError:
            return lines[-1][:300]
        return str(doc.get("msg", lines[-1]))[:300] if isinstance(doc, dict) else lines[-1][:300]

    def _healthy(self) -> bool:
        return http.get(f"{self.base_url}/healthz", timeout=1.0).status_code == 200

    def _logged(self, event: str, offset: int) -> bool:
        with open(self.log_path, "rb") as fh:
            fh.seek(offset)
            return f'"event": "{event}"'.encode() in fh.read()

    def sigkill(self) -> dict[str, object]:
        """SIGKILL the process group; returns evidence that it landed (pid gone)."""
        pid = self.pid
        assert self.proc is not None
        os.killpg(pid, signal.SIGKILL)
        code = self.proc.wait(timeout=10)
        return {"pid": pid, "signal": "SIGKILL", "exit_code": code, "pid_gone": not psutil.pid_exists(pid)}

    def sigstop(self) -> dict[str, object]:
        """SIGSTOP the process group; evidence: the kernel reports the process stopped."""
        pid = self.pid
        os.killpg(pid, signal.SIGSTOP)
        proc = psutil.Process(pid)
        try:
            wait_until(lambda: proc.status() == psutil.STATUS_STOPPED, timeout_s=2, what="SIGSTOP")
        except HarnessError:
            pass  # recorded as not landed below
        return {"pid": pid, "signal": "SIGSTOP", "status": proc.status()}

    def sigcont(self) -> dict[str, object]:
        pid = self.pid
        os.killpg(pid, signal.SIGCONT)
        return {"pid": pid, "signal": "SIGCONT", "status": psutil.Process(pid).status()}

    def stop(self) -> None:
        if self.proc is not None:
            kill_tree(self.proc, first=signal.SIGTERM, grace_s=3)
        if "FAKETIME" in self.env:
            _remove_faketime_shm(self.pids)


def _remove_faketime_shm(pids: list[int]) -> None:
    """Remove what libfaketime left in ``/dev/shm`` for ``pids`` (its ``faketime_shm_<pid>``
    and semaphore, removed at a clean exit only: a SIGKILLed or stopped process leaves them)."""
    for pid in pids:
        for name in (f"faketime_shm_{pid}", f"sem.faketime_sem_{pid}"):
            Path("/dev/shm", name).unlink(missing_ok=True)


#: Settings of a started process that the checkers judge against, recorded in the
#: history as a ``process`` event (``qualify.checkers.no_crash_loop``,
#: ``qualify.checkers.one_workflow_per_generation``).
RECORDED_SETTINGS = ("QIMPL_PROVIDER_MAX_FAILURES", "QIMPL_TASK_QUEUE")


class Processes:
    """Registry of a scenario's processes; ``stop_all`` reaps every one of them. With a
    ``history`` (a ``HistoryRecorder``), each start is recorded as a ``process`` event
    with the ``RECORDED_SETTINGS`` it was given."""

    def __init__(self, deployment: Deployment, *, launcher: ForkServer | None = None,
                 history: Any = None, exec_kinds: frozenset[str] = frozenset()) -> None:
        self.deployment = deployment
        self.all: dict[str, ManagedProcess] = {}
        #: When set, API and worker processes are forked from it (``qualify.forkserver``),
        #: except those of ``exec_kinds`` (``qualify.forkserver.ENTRY_POINTS``), always exec'd.
        self.launcher = launcher
        self.exec_kinds = exec_kinds
        self.history = history

    def _launcher(self, kind: str, forked: bool = False) -> ForkServer | None:
        return self.launcher if forked or kind not in self.exec_kinds else None

    def _started(self, proc: ManagedProcess) -> ManagedProcess:
        self.all[proc.name] = proc
        if self.history is not None:
            self.history.record("process", name=proc.name, kind=proc.kind, settings={
                k: proc.env[k] for k in RECORDED_SETTINGS if k in proc.env})
        return proc.spawn()

    def _log(self, name: str) -> Path:
        return self.deployment.logs_dir / f"{name}.log"

    def api(self, name: str = "api-1", **env: str) -> ManagedProcess:
        """An API process on a free port, started and ready."""
        return self.spawn_api(name, env=env).wait_ready()

    def worker(self, name: str = "worker-1", **env: str) -> ManagedProcess:
        """A worker process, started and ready."""
        return self.spawn_worker(name, env=env).wait_ready()

    def spawn_api(self, name: str = "api-1", *, port: int = 0, env: Mapping[str, str] | None = None,
                  access_log: bool | None = None, forked: bool = False) -> ManagedProcess:
        """An API process on ``port`` (0: a free port) with ``env`` over the deployment's,
        spawned, not yet ready (``wait_ready``): several processes can then boot at once.
        ``forked``: forked from the fork server when there is one, even in a scenario that
        execs its API (a further instance of an entry point the scenario already execs);
        exec'd when every process is (``--spawn exec``)."""
        port = port or free_port()
        proc = ManagedProcess(
            name=name, kind="api", port=port, log_path=self._log(name),
            env=self.deployment.env("qimpl_api", **(env or {})),
            launcher=self._launcher("api", forked),
            argv=[sys.executable, "-m", "uvicorn", "--factory", "qimpl.api.app:create_app",
                  "--host", "127.0.0.1", "--port", str(port),
                  *(["--log-level", "info"] if (self.deployment.access_log if access_log is None else access_log)
                    else ["--log-level", "warning", "--no-access-log"])],
        )
        return self._started(proc)

    def spawn_worker(self, name: str = "worker-1", *, env: Mapping[str, str] | None = None,
                     forked: bool = False) -> ManagedProcess:
        """A worker process, spawned, not yet ready (``wait_ready``); ``forked`` as in
        ``spawn_api``."""
        proc = ManagedProcess(
            name=name, kind="worker", log_path=self._log(name),
            env=self.deployment.env("qimpl_worker", **(env or {})),
            argv=[sys.executable, "-m", "qimpl.workflows.worker"], launcher=self._launcher("worker", forked),
        )
        return self._started(proc)

    def stop_all(self) -> None:
        errors = []
        for proc in self.all.values():
            try:
                proc.stop()
            except Exception as exc:  # noqa: BLE001 - keep reaping the others
                errors.append(f"{proc.name}: {exc}")
        if errors:
            raise HarnessError("could not stop: " + "; ".join(errors))


def faketime_env(offset_s: int) -> dict[str, str]:
    """The environment that skews a child's wall clock by ``offset_s`` seconds (R-Q-10,
    ``skew-worker-clock``): libfaketime, from the ``libfaketime`` wheel (a dependency of qualify),
    preloaded, monotonic clocks left alone (``time.monotonic`` and Rust's ``Instant`` stay
    true: only what the process believes the date is moves). Located without importing the
    package (its import pulls in pytz and dateutil). HarnessError when it is not installed."""
    import importlib.util

    spec = importlib.util.find_spec("libfaketime")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    lib = next((Path(d) / "vendor" / "libfaketime" / "src" / "libfaketime.so.1" for d in locations), None)
    if lib is None or not lib.exists():
        raise HarnessError("skew-worker-clock needs libfaketime: pip install -e .")
    preload = ":".join(filter(None, [str(lib), os.environ.get("LD_PRELOAD", "")]))
    return {"LD_PRELOAD": preload, "FAKETIME": f"{offset_s:+d}s", "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "DONT_FAKE_MONOTONIC": "1", "FAKETIME_NO_CACHE": "1"}


class SinkProcess:
    """The side-effect sink of one scenario (``python -m qualify.fakes.sink``). Its port is
    chosen at construction, so ``url`` is known before ``start``; ``stop`` is idempotent
    and always reaps it."""

    def __init__(self, directory: Path, *, log_path: Path, port: int | None = None) -> None:
        self.dir = directory
        self.log_path = log_path
        # Below the ephemeral range: the URL is handed out (every process's environment)
        # before the sink binds it, and a Temporal server booted in between binds random
        # ephemeral ports (seen at 5 slices: "Address already in use", the scenario crashed).
        self.port = port or quiet_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> SinkProcess:
        self.dir.mkdir(parents=True, exist_ok=True)
        ready = self.dir / "sink.ready"
        ready.unlink(missing_ok=True)
        self.proc = spawn([sys.executable, "-m", "qualify.fakes.sink", "--port", str(self.port),
                           "--dir", str(self.dir)], log_path=self.log_path,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
        wait_until(ready.exists, timeout_s=SINK_READY_TIMEOUT_S, what="sink", proc=self.proc,
                   interval_s=0.005, kind="process_start")
        return self

    def stop(self) -> None:
        if self.proc is not None:
            kill_tree(self.proc, first=signal.SIGTERM, grace_s=3)
