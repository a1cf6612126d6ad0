"""Child-process plumbing shared by the stack and the process controller.

Every child runs in its own session (process group), dies with the harness
(``PR_SET_PDEATHSIG``) and is stopped leaf-first: a polite signal, a grace period,
then SIGKILL to the whole group and every descendant psutil can still see.
"""

from __future__ import annotations

import ctypes
import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar

import psutil

from qualify.errors import HarnessError

__all__ = ["Child", "Restartable", "free_port", "kill_tree", "poll", "quiet_port", "spawn", "wait_until"]

T = TypeVar("T")


class Child(Protocol):
    """What the harness needs of a child process: ``subprocess.Popen`` or a process of
    the fork server (``qualify.forkserver.ForkedProcess``)."""

    pid: int
    returncode: int | Any

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

_PR_SET_PDEATHSIG = 1


def _die_with_parent(sig: int) -> Callable[[], None]:
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)

    return preexec


def spawn(
    argv: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    user: str | None = None,
    death_signal: int = signal.SIGKILL,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session with stdout+stderr appended to ``log_path``.

    Must be called from the main thread: the death signal fires when the *thread* that
    forked the child exits (a process a scenario restarted from a pool's thread was
    SIGKILLed as that pool shut down, milliseconds after it was ready). HarnessError from
    any other thread.
    """
    if threading.current_thread() is not threading.main_thread():
        raise HarnessError(f"{argv[0]} spawned from thread {threading.current_thread().name}: the child "
                           "would die with that thread (PR_SET_PDEATHSIG); spawn from the main thread")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log: IO[Any] = open(log_path, "ab")
    kwargs: dict[str, Any] = {}
    if user is not None:
        kwargs.update(user=user, group=user, extra_groups=[])
    try:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_die_with_parent(death_signal),
            **kwargs,
        )
    finally:
        log.close()


def kill_tree(proc: Child, *, first: int = signal.SIGTERM, grace_s: float = 5.0) -> None:
    """Stop ``proc`` and all its descendants; always reaps ``proc``. Idempotent.

    Once ``proc`` has exited and been reaped, its process group is signalled only while
    it lives on without its leader (descendants it left behind): a group id is never a
    new pid while the group lives, so a live process with ``proc``'s pid means the pid
    was reused and the group is somebody else's."""
    if proc.poll() is not None and (not _group_alive(proc.pid) or psutil.pid_exists(proc.pid)):
        return
    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    if proc.poll() is None:
        _signal_group(proc.pid, first)
        _signal_group(proc.pid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(proc.pid, signal.SIGKILL)
    for child in descendants:
        try:
            child.kill()
        except psutil.Error:
            pass
    proc.wait()
    psutil.wait_procs(descendants, timeout=5)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (callers retry on collision)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def quiet_port(rng: random.Random | None = None) -> int:
    """A TCP port on 127.0.0.1, free a moment ago, *below* the kernel's ephemeral range
    (``ip_local_port_range``): no other socket's ``bind(0)`` or ``connect()`` is handed
    it in the meantime, as ``free_port``'s can be. For a port that is handed out before
    its server binds it (the sink's URL is in every process's environment), where a
    retry on collision is not possible. Raises HarnessError when none is found."""
    low, _ = _ephemeral_range()
    pick = rng or random.SystemRandom()
    for _ in range(100):
        port = pick.randrange(max(1024, low - 12000), low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise HarnessError("no free port below the ephemeral range")


def poll(what: Callable[[], T], timeout_s: float, interval_s: float = 0.05) -> T:
    """``what()``'s first truthy value within ``timeout_s`` seconds, polled every
    ``interval_s``; else its last value (falsy). Never raises on the timeout: the caller
    judges the value. ``what``'s own exceptions propagate."""
    deadline = time.monotonic() + timeout_s
    value = what()
    while not value and time.monotonic() < deadline:
        time.sleep(interval_s)
        value = what()
    return value


def wait_until(
    check: Callable[[], bool],
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 0.02,
    proc: Child | None = None,
    kind: str = "wait_condition",
) -> float:
    """Poll ``check`` until true; returns seconds waited, counted as ``kind`` in the
    scenario's time (``qualify.timing``). Raises HarnessError on timeout or when
    ``proc`` exits first."""
    from qualify.timing import spent

    with spent(kind):
        return _wait_until(check, timeout_s=timeout_s, what=what, interval_s=interval_s, proc=proc)


def _wait_until(check: Callable[[], bool], *, timeout_s: float, what: str, interval_s: float,
                proc: Child | None) -> float:
    from qualify import interrupt

    start = time.monotonic()
    deadline = start + timeout_s
    while True:
        interrupt.check()
        try:
            if check():
                return time.monotonic() - start
        except Exception:  # noqa: BLE001 - a failing probe means "not ready yet"
            pass
        if proc is not None and proc.poll() is not None:
            raise HarnessError(f"{what}: process exited with {proc.returncode} before ready")
        if time.monotonic() > deadline:
            raise HarnessError(f"{what}: not ready after {timeout_s:.1f} s")
        time.sleep(interval_s)


class Restartable:
    """A server with ``start``, ``stop`` and ``proc``: ``restart`` stops and starts it on the
    same ports and data, and returns (old pid, new pid)."""

    proc: subprocess.Popen[bytes] | None
    restarts: int

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def restart(self) -> tuple[int, int]:
        if self.proc is None:
            raise HarnessError("restart of a server that is not running")
        old = self.proc.pid
        self.stop()
        self.start()
        self.restarts += 1
        assert self.proc is not None
        return old, self.proc.pid
