"""``qualify run`` end to end on the embedded stack: both walking-skeleton scenarios pass,
the report has its schema, and nothing is left running (R-Q-1, R-Q-6)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import psutil
import pytest

from qualify.session import SessionOptions, run_session
from tests.conftest import assert_eventually

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.req("R-Q-1")
@pytest.mark.req("R-Q-6")
@pytest.mark.req("R-EXEC-4")
def test_qualify_run_passes_and_writes_the_report(tmp_path: Path) -> None:
    me = psutil.Process()
    before = set(me.children(recursive=True))  # e.g. the session's shared stack
    summary, report_dir, code = run_session(SessionOptions(
        scenario_ids=["happy-path", "worker-killed-mid-activity"], seed=1234, reports_root=tmp_path))
    assert code == 0, json.dumps(summary["scenarios"], indent=1)[:4000]
    assert summary["verdict"] == "pass" and summary["seed"] == 1234
    on_disk = json.loads((report_dir / "summary.json").read_text())
    assert on_disk["schema"] == "qualify.summary/1"
    assert {"kind", "postgres_version", "temporal_version", "boot_s"} <= set(on_disk["stack"])
    for name in ("junit.xml", "report.md", "report.html"):
        assert (report_dir / name).exists(), name
    killed = next(s for s in on_disk["scenarios"] if s["id"] == "worker-killed-mid-activity")
    assert killed["faults"] and killed["fault_evidence"][0]["pid_gone"] is True
    assert killed["repro"] == "qualify repro worker-killed-mid-activity --seed 1234"
    history = (report_dir / killed["history"]).read_text().splitlines()
    types = {json.loads(line)["type"] for line in history}
    assert {"client", "fault", "transition", "checkpoint", "provider_call"} <= types
    assert set(me.children(recursive=True)) - before == set()


@pytest.mark.req("R-Q-1")
def test_interrupted_run_leaves_no_process(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "qualify.cli", "run", "--seed", "7", "--reports-dir", str(tmp_path)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    me = psutil.Process(proc.pid)

    def workers_up() -> bool:
        for child in me.children(recursive=True):
            try:
                if "qimpl.workflows.worker" in " ".join(child.cmdline()):
                    return True
            except psutil.Error:
                continue
        return False

    try:
        assert_eventually(workers_up, timeout=timedelta(seconds=60), what="a worker process")
        descendants = me.children(recursive=True)
        pids = {str(p.pid) for p in [me, *descendants]}
        stacks = [d for d in Path("/dev/shm").glob("qualify-stack-*")
                  if (d / "owner.pid").exists() and (d / "owner.pid").read_text() in pids]
        assert stacks, "the run's stacks are on the tmpfs"
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
        assert proc.wait(timeout=60) == 130
        _gone, alive = psutil.wait_procs(descendants, timeout=10)
        assert alive == [], [p.pid for p in alive]
        # Every slice's stack directory is gone too (they were left on the tmpfs, tens of MB each).
        assert [d for d in stacks if d.exists()] == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.req("R-Q-7")
def test_parallel_run_uses_one_stack_per_xdist_worker(tmp_path: Path) -> None:
    summary, _, code = run_session(SessionOptions(
        scenario_ids=["happy-path", "legacy-paths"], seed=5, reports_root=tmp_path, parallel=2))
    assert code == 0, summary["scenarios"]
    assert [s["id"] for s in summary["scenarios"]] == ["happy-path", "legacy-paths"]
    assert summary["stack"]["parallel_stacks"] == 2


@pytest.mark.req("R-Q-10")
@pytest.mark.req("R-Q-2")
def test_random_schedules_fork_their_processes_and_reap_them(tmp_path: Path) -> None:
    """``--random N`` forks the schedules' API and worker processes from the slice's fork
    server (R-Q-10); the verdicts are those of exec'd processes, and the server and every
    child are gone when the session ends (R-Q-2)."""
    me = psutil.Process()
    before = set(me.children(recursive=True))
    summary, _report_dir, code = run_session(SessionOptions(random_n=3, seed=5, reports_root=tmp_path,
                                                            reruns=0))
    assert code == 0, json.dumps(summary["scenarios"], indent=1)[:4000]
    assert all(s["spawn"].startswith("fork") for s in summary["scenarios"]), summary["scenarios"]
    assert summary["scenarios_per_hour"] > 0
    assert set(me.children(recursive=True)) - before == set()
