"""A preloading fork server: API and worker processes for the soak in a few milliseconds
of CPU instead of a second of imports each (R-Q-10).

A random schedule boots an API and two workers, and one more worker after each fault
that kills one; importing FastAPI, temporalio and pydantic costs about 1 s of CPU per
process, which alone caps a 2-core machine near 1,000 schedules an hour. The fork server
imports those modules once and forks a child per process asked for, the pattern of
gunicorn's ``--preload`` and CPython's ``multiprocessing`` forkserver. The child is a
real process of its own: its own session (``pgid == pid``, so signals to the group
strike it alone), its environment, argv and log file replaced, and the same entry point
``python -m <module>`` runs (``runpy``), so SIGKILL, SIGSTOP and the crash points act on
it exactly as on an exec'd one. What a fork does not re-run is the interpreter's own
start-up: a process whose environment changes how Python starts (``PYTHONPATH``,
``LD_PRELOAD``, any other ``PYTHON*`` variable) is refused, and the caller execs it.

Process tree and reaping (R-Q-2): the server is a child of the harness that dies with it
(``PR_SET_PDEATHSIG``); each forked child dies with the server the same way; the server
reaps its children the moment they exit (``SIGCHLD``) and writes each exit status to
``<status_dir>/<n>.exit`` (``n``: the fork's sequence number; pids are reused over a
long soak), which ``ForkedProcess.poll`` reads. ``kill_tree`` of the
server's handle stops it and every descendant.

Protocol: one JSON line per connection on a Unix socket, ``{"module", "argv", "env",
"log", "cwd"}``; the answer is ``{"pid": N, "id": n}`` or ``{"error": text}``.
"""

from __future__ import annotations

import ctypes
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["ENTRY_POINTS", "FORK_PRELOAD", "SPAWN_MODES", "ForkServer", "ForkedProcess", "SpawnPolicy", "forkable"]

#: What the server imports before it forks anything: the API, the worker, uvicorn's
#: command line and the harness's synthetic provider and tools.
FORK_PRELOAD = ("qimpl.api.app", "qimpl.workflows.worker", "uvicorn.main", "qualify.fakes.synthetic",
                "qualify.fakes.tools")
READY_TIMEOUT_S = 60.0
_PR_SET_PDEATHSIG = 1


def _interpreter_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables that shape how a Python interpreter starts."""
    return {k: v for k, v in env.items() if k.startswith("PYTHON") or k in ("LD_PRELOAD", "LD_LIBRARY_PATH")}


def forkable(env: Mapping[str, str], server_env: Mapping[str, str]) -> bool:
    """Whether a process with ``env`` may be forked from a server started with
    ``server_env``: both agree on every variable that shapes interpreter start-up
    (``PYTHONUNBUFFERED`` aside, which the server itself runs with)."""
    mine = _interpreter_env(env)
    theirs = _interpreter_env(server_env)
    for d in (mine, theirs):
        d.pop("PYTHONUNBUFFERED", None)
    return mine == theirs


class ForkedProcess:
    """A child of the fork server, with the part of ``subprocess.Popen``'s interface the
    harness uses: ``pid``, ``returncode``, ``poll()`` and ``wait(timeout)`` (seconds;
    raises ``subprocess.TimeoutExpired``). ``returncode`` is negative for a signal, as
    with ``Popen``."""

    def __init__(self, pid: int, status_dir: Path, argv: Sequence[str], *, fork_id: int) -> None:
        self.pid = pid
        self.args = list(argv)
        self.returncode: int | None = None
        # Named by the fork's sequence number, not its pid: over a long soak pids are
        # reused, and a pid's old status would make its new process look exited.
        self._status = status_dir / f"{fork_id}.exit"

    def poll(self) -> int | None:
        if self.returncode is None and self._status.exists():
            text = self._status.read_text().strip()
            if text:
                self.returncode = int(text)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.005)
        return code


class ForkServer:
    """The harness's handle on one fork server (one per stack slice). ``start`` returns
    once the preloads are imported; ``spawn`` forks a child; ``stop`` reaps the server
    and every process it forked. Must be started from the main thread (the death signal
    follows the thread that forked the server)."""

    def __init__(self, directory: Path | None = None, *, preload: Sequence[str] = FORK_PRELOAD) -> None:
        # A short private directory by default: a Unix socket's path is limited to 107 bytes.
        self._own_dir = directory is None
        self.dir = directory if directory is not None else Path(tempfile.mkdtemp(prefix="qfs-"))
        self.preload = tuple(preload)
        self.socket_path = self.dir / "fork.sock"
        self.status_dir = self.dir / "status"
        self.proc: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}
        self.forks = 0

    def start(self) -> ForkServer:
        from qualify.procs import spawn, wait_until

        self.dir.mkdir(parents=True, exist_ok=True)
        self.status_dir.mkdir(exist_ok=True)
        ready = self.dir / "fork.ready"
        ready.unlink(missing_ok=True)
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = spawn([sys.executable, "-m", "qualify.forkserver", str(self.dir), *self.preload],
                          log_path=self.dir / "forkserver.log", env=self.env)
        wait_until(ready.exists, timeout_s=READY_TIMEOUT_S, what="fork server", proc=self.proc,
                   interval_s=0.01)
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def accepts(self, env: Mapping[str, str]) -> bool:
        """Whether a process with ``env`` can be forked here (see ``forkable``)."""
        return self.alive and forkable(env, self.env)

    def spawn(self, module: str, argv: Sequence[str], *, env: Mapping[str, str], log_path: Path,
              cwd: Path | None = None) -> ForkedProcess:
        """Fork ``python -m module *argv`` with ``env``, stdout and stderr appended to
        ``log_path``. HarnessError if the server refuses or is gone."""
        from qualify.errors import HarnessError

        log_path.parent.mkdir(parents=True, exist_ok=True)
        request = {"module": module, "argv": [module, *argv], "env": dict(env), "log": str(log_path),
                   "cwd": str(cwd or Path.cwd())}
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(10)
                conn.connect(str(self.socket_path))
                conn.sendall(json.dumps(request).encode() + b"\n")
                answer = json.loads(_read_line(conn))
        except (OSError, ValueError) as exc:
            raise HarnessError(f"fork server did not answer: {exc}") from exc
        if "pid" not in answer:
            raise HarnessError(f"fork server refused {module}: {answer.get('error')}")
        self.forks += 1
        return ForkedProcess(int(answer["pid"]), self.status_dir, [sys.executable, "-m", module, *argv],
                             fork_id=int(answer["id"]))

    def stop(self) -> None:
        from qualify.procs import kill_tree

        if self.proc is not None:
            kill_tree(self.proc, first=signal.SIGTERM, grace_s=3)
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


#: ``--spawn``: ``auto`` execs the processes of the named set of catalog scenarios that
#: qualify the entry points themselves (``Scenario.exec_because``) and forks every other
#: scenario's, random schedules included; ``fork`` and ``exec`` apply to all.
SPAWN_MODES = ("auto", "fork", "exec")
#: The product's entry points the harness starts, by process kind (``qualify.processes``).
ENTRY_POINTS: tuple[str, ...] = ("api", "worker")


class SpawnPolicy:
    """Which scenarios fork their API and worker processes (one fork server per stack
    slice, started on first need, restarted if it died)."""

    def __init__(self, mode: str = "auto") -> None:
        if mode not in SPAWN_MODES:
            raise ValueError(f"spawn mode {mode!r} not in {SPAWN_MODES}")
        self.mode = mode
        self.server: ForkServer | None = None

    def fork_server(self) -> ForkServer:
        """The slice's fork server, started on first need and again if it died."""
        if self.server is None or not self.server.alive:
            self.stop()
            self.server = ForkServer().start()
        return self.server

    def spawn_for(self, exec_only: frozenset[str]) -> tuple[ForkServer | None, frozenset[str]]:
        """The fork server and the entry points to exec for a scenario whose exec-set
        entry points are ``exec_only`` (``Scenario.exec_only``; empty: not in the set).
        ``exec``: no fork server, everything exec'd; ``fork``: everything forked; ``auto``:
        ``exec_only`` exec'd, the rest forked, and the fork server there even when
        ``exec_only`` is every entry point, for the further instances a scenario asks
        forked (``Processes.spawn_api(..., forked=True)``)."""
        if self.mode == "exec":
            return None, frozenset()
        return self.fork_server(), (exec_only if self.mode == "auto" else frozenset())

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


def _read_line(conn: socket.socket) -> bytes:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf


# -- the server (runs in its own process) -------------------------------------------------

def _child(request: dict[str, Any], close: Sequence[int]) -> None:
    """In the forked child: become the asked-for process, run it, exit. Never returns."""
    code = 1
    try:
        os.setsid()
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        for fd in close:
            try:
                os.close(fd)
            except OSError:
                pass
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _hold_marker(request["env"].get("QIMPL_CONTROL_DIR"))
        sys.argv = list(request["argv"])
        _forget_process_state()
        import runpy

        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported in the child's log, exit 1
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


#: A file in the scenario's control directory that every forked child holds open for its
#: whole life. Its descendants forked without an exec inherit the descriptor but not an
#: environment ``/proc/<pid>/environ`` shows (a fork's is the server's, whatever
#: ``os.environ`` says), so ``qualify.runner.stray_processes`` finds them by it.
STRAY_MARKER = "processes.marker"


def _hold_marker(control_dir: str | None) -> None:
    """Open ``STRAY_MARKER`` in ``control_dir`` and never close it (no control dir: none)."""
    if control_dir:
        try:
            os.open(os.path.join(control_dir, STRAY_MARKER), os.O_RDONLY | os.O_CREAT, 0o644)
        except OSError:
            pass  # a scenario without its directory: its exec'd descendants still carry the env


def _forget_process_state() -> None:
    """Drop what the preloaded modules may have cached from the server's environment."""
    import qimpl.crashpoints
    import qimpl.settings

    qimpl.crashpoints._directives = None  # type: ignore[attr-defined]
    for name in dir(qimpl.settings):
        cached = getattr(getattr(qimpl.settings, name), "cache_clear", None)
        if callable(cached):
            cached()


def _memoize_build_id() -> None:
    """Compute temporalio's default worker build id once, in the server, so that every
    forked worker inherits it. Each ``Worker`` without an explicit build id hashes the
    bytecode of every loaded module (``temporalio.worker.load_default_build_id``,
    memoized per process). Measured with cProfile on a worker's start: 0.22 s of the
    0.26 s of CPU it spends until ready, and a full ``qualify run`` forks about 190
    workers. The id is still the hash of the code the child runs: the preloads are that
    code, and the child only adds its ``__main__``."""
    if "temporalio.worker" not in sys.modules:
        return
    try:  # not re-exported by temporalio.worker; where it lives in temporalio 1.x
        from temporalio.worker._worker import load_default_build_id
    except ImportError:  # moved: each child computes it, as an exec'd worker does
        return
    load_default_build_id()


def _write_status(status_dir: Path, fork_id: int, status: int) -> None:
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    tmp = status_dir / f"{fork_id}.tmp"
    tmp.write_text(str(code))
    tmp.rename(status_dir / f"{fork_id}.exit")


def serve(directory: Path, preload: Sequence[str]) -> None:
    """Import ``preload``, then fork on request until SIGTERM or the harness dies."""
    import gc
    import importlib

    for name in preload:
        importlib.import_module(name)
    _memoize_build_id()
    gc.collect()
    gc.freeze()  # the preloaded objects stay shared: no copy-on-write from the collector
    status_dir = directory / "status"
    status_dir.mkdir(parents=True, exist_ok=True)
    path = directory / "fork.sock"
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    signal.set_wakeup_fd(wake_w.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)
    stopping = False

    def stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    (directory / "fork.ready").touch()
    children: dict[int, int] = {}  # pid -> the fork's sequence number
    forks = 0
    while not stopping:
        for key, _ in sel.select(timeout=1.0):
            if key.data == "wake":
                try:
                    wake_r.recv(4096)
                except BlockingIOError:
                    pass
            elif key.data == "accept":
                conn, _addr = listener.accept()
                with conn:
                    conn.settimeout(10)
                    try:
                        request = json.loads(_read_line(conn))
                        sys.stdout.flush()
                        sys.stderr.flush()
                        pid = os.fork()
                        if pid == 0:
                            _child(request, [listener.fileno(), wake_r.fileno(), wake_w.fileno(),
                                             conn.fileno(), sel.fileno() if hasattr(sel, "fileno") else -1])
                        forks += 1
                        children[pid] = forks
                        conn.sendall(json.dumps({"pid": pid, "id": forks}).encode() + b"\n")
                    except (OSError, ValueError, KeyError) as exc:
                        try:
                            conn.sendall(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode() + b"\n")
                        except OSError:
                            pass
        _reap(children, status_dir)
    for pid in list(children):  # SIGTERM: the children go with the server
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + 5
    while children and time.monotonic() < deadline:
        _reap(children, status_dir)
        time.sleep(0.01)


def _reap(children: dict[int, int], status_dir: Path) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        fork_id = children.pop(pid, None)
        if fork_id is not None:
            _write_status(status_dir, fork_id, status)


if __name__ == "__main__":
    serve(Path(sys.argv[1]), sys.argv[2:])
