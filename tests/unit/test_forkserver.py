"""The soak's fork server (R-Q-10, R-Q-2): forked children run their module as
``__main__`` with their own environment, argv, log and session; exit codes and signals
come back like ``Popen``'s; stopping the server reaps every child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from qualify.forkserver import ForkServer, forkable
from qualify.procs import poll

pytestmark = pytest.mark.req("R-Q-10")

CHILD = textwrap.dedent("""
    import os, sys, time
    print("argv", sys.argv[1:], "env", os.environ.get("FS_TEST"), "name", __name__, flush=True)
    print("pgid", os.getpgid(0) == os.getpid(), flush=True)
    if sys.argv[1:] == ["sleep"]:
        time.sleep(60)
    if sys.argv[1:] == ["fork-away"]:  # a plain fork that leaves the session, no exec
        if os.fork() == 0:
            os.setsid()
            print("grandchild", os.getpid(), flush=True)
            time.sleep(60)
            os._exit(0)
    sys.exit(int(os.environ.get("FS_CODE", "0")))
""")


@pytest.fixture()
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ForkServer]:
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "fs_child.py").write_text(CHILD)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "mods"), *sys.path]))
    fs = ForkServer(tmp_path / "fs", preload=("json",)).start()
    try:
        yield fs
    finally:
        fs.stop()


def test_child_runs_its_module_with_its_env_argv_and_log(server: ForkServer, tmp_path: Path) -> None:
    env = {**server.env, "FS_TEST": "hello", "FS_CODE": "3"}
    child = server.spawn("fs_child", ["a", "b"], env=env, log_path=tmp_path / "logs" / "c.log")
    assert child.wait(timeout=20) == 3
    log = (tmp_path / "logs" / "c.log").read_text()
    assert "argv ['a', 'b'] env hello name __main__" in log
    assert "pgid True" in log
    assert not psutil.pid_exists(child.pid)  # reaped by the server


def test_signals_come_back_as_negative_codes_and_stop_reaps_all(server: ForkServer, tmp_path: Path) -> None:
    env = dict(server.env)
    killed = server.spawn("fs_child", ["sleep"], env=env, log_path=tmp_path / "k.log")
    kept = server.spawn("fs_child", ["sleep"], env=env, log_path=tmp_path / "s.log")
    assert killed.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        killed.wait(timeout=0.2)
    os.killpg(killed.pid, signal.SIGKILL)
    assert killed.wait(timeout=10) == -signal.SIGKILL
    assert psutil.pid_exists(kept.pid)
    server.stop()
    assert not server.alive
    assert not psutil.pid_exists(kept.pid) or psutil.Process(kept.pid).status() == psutil.STATUS_ZOMBIE


def test_a_process_that_changes_interpreter_start_up_is_not_forked() -> None:
    base = {"PATH": "/bin", "PYTHONPATH": "/x", "PYTHONUNBUFFERED": "1"}
    assert forkable({**base, "QIMPL_X": "1"}, base)
    assert forkable({"PATH": "/bin", "PYTHONPATH": "/x"}, base)
    assert not forkable({**base, "LD_PRELOAD": "/lib/libfaketime.so.1"}, base)
    assert not forkable({**base, "PYTHONPATH": "/y"}, base)


def test_a_parallel_session_reports_each_scenario_once_as_its_document_lands(tmp_path: Path) -> None:
    """``qualify run -n N`` (the soak runs an hour) prints each scenario as its slice writes
    it: a document is reported once, a half-written one not until it is whole."""
    import json

    from qualify.session import _report_new_docs

    docs = tmp_path / ".docs"
    docs.mkdir()
    seen: list[str] = []
    shown: set[str] = set()

    def on_event(kind: str, data: object) -> None:
        assert kind == "scenario_end" and isinstance(data, dict) and data["prefix"] is True
        seen.append(data["id"])

    _report_new_docs(tmp_path, shown, on_event)
    (docs / "random-1.json").write_text(json.dumps({"id": "random-1"}))
    (docs / "random-0.json").write_text('{"id": "rand')  # being written
    _report_new_docs(tmp_path, shown, on_event)
    assert seen == ["random-1"]
    (docs / "random-0.json").write_text(json.dumps({"id": "random-0"}))
    _report_new_docs(tmp_path, shown, on_event)
    _report_new_docs(tmp_path, shown, on_event)
    assert seen == ["random-1", "random-0"]


def test_an_exit_status_belongs_to_its_fork_not_to_a_reused_pid(tmp_path: Path) -> None:
    """Over a long soak pids are reused: the status of an earlier fork with the same pid
    must not make a later one look exited."""
    from qualify.forkserver import ForkedProcess

    (tmp_path / "1.exit").write_text("-9")
    earlier = ForkedProcess(4242, tmp_path, ["x"], fork_id=1)
    later = ForkedProcess(4242, tmp_path, ["x"], fork_id=2)
    assert earlier.poll() == -9
    assert later.poll() is None


def test_kill_tree_leaves_alone_a_group_whose_leader_pid_was_reused() -> None:
    """A reaped process's pid, now another live process's (and its group's), is not ours
    to signal (R-Q-2 without collateral damage across slices)."""
    from qualify.procs import kill_tree

    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        class Reaped:  # what a handle of an exited, reaped process looks like
            pid = other.pid
            returncode = 0

            def poll(self) -> int | None:
                return 0

            def wait(self, timeout: float | None = None) -> int:
                return 0

        kill_tree(Reaped())
        assert other.poll() is None  # still running: not killed by mistake
    finally:
        other.kill()
        other.wait()


@pytest.mark.req("R-Q-2")
def test_a_plain_fork_of_a_forked_child_is_found_as_a_stray(server: ForkServer, tmp_path: Path) -> None:
    """A forked child's ``/proc/<pid>/environ`` is the server's, so a descendant it forks
    without an exec carried no ``QIMPL_CONTROL_DIR`` the stray check could see (stop 54's
    note); it inherits the child's ``STRAY_MARKER`` descriptor instead, and is found and
    killed by it."""
    from qualify.runner import stray_processes

    control = tmp_path / "control"
    control.mkdir()
    log = tmp_path / "f.log"
    child = server.spawn("fs_child", ["fork-away"], env={**server.env, "QIMPL_CONTROL_DIR": str(control)},
                         log_path=log)
    assert child.wait(timeout=20) == 0

    def grandchild_pid() -> int | None:
        lines = [ln for ln in log.read_text().splitlines() if ln.startswith("grandchild ")]
        return int(lines[0].split()[1]) if lines else None

    grandchild = poll(grandchild_pid, timeout_s=20)
    assert grandchild is not None and psutil.pid_exists(grandchild), log.read_text()
    assert psutil.Process(grandchild).environ().get("QIMPL_CONTROL_DIR") != str(control)  # the hole
    strays = stray_processes(str(control))
    assert [s for s in strays if s.endswith(f"(pid {grandchild})")] == strays and strays, strays
    gone = poll(lambda: not psutil.pid_exists(grandchild)
                or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE, timeout_s=10)
    assert gone
    assert stray_processes(str(control)) == []
