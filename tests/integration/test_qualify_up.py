"""``qualify up`` (issue 15, item 1): one command to a running service. Run as a user
would — a subprocess — it prints a ready line and a curl whose request returns a receipt
and whose run completes; Ctrl-C (SIGINT) stops every process it started; ``--data-dir``
keeps the key and the runs for the next ``qualify up``."""

from __future__ import annotations

import json
import os
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
import pytest

from qualify.stack.temporal import temporal_binary
from tests.conftest import assert_eventually

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0


class Up:
    """A running ``qualify up`` subprocess whose stdout is read line by line."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "qualify.cli", "up", *args], cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, prefix: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"no line starting {prefix!r} within {timeout_s} s: {self.seen}")
            try:
                line = self.lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    pytest.fail(f"qualify up exited with {self.proc.returncode}: {self.seen}")
                continue
            self.seen.append(line)
            if line.strip().startswith(prefix):
                return line.strip()

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)

    def kill(self) -> None:
        """Backstop: the whole session, whatever state the test left it in."""
        if self.proc.poll() is None:
            for child in self.descendants():
                child.kill()
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


@contextmanager
def qualify_up(*args: str) -> Iterator[Up]:
    up = Up(*args)
    try:
        yield up
    finally:
        up.kill()


def _request_of(curl: str) -> dict[str, Any]:
    """The request a pasted ``curl`` line makes (the shell's ``$(...)`` done by hand)."""
    words = shlex.split(curl.replace("$(cat /proc/sys/kernel/random/uuid)", str(uuid.uuid4())))
    assert words[:2] == ["curl", "-sS"]
    req: dict[str, Any] = {"headers": {}}
    it = iter(words[2:])
    for word in it:
        if word == "-X":
            req["method"] = next(it)
        elif word == "-H":
            name, _, value = next(it).partition(": ")
            req["headers"][name] = value
        elif word == "-d":
            req["content"] = next(it)
        else:
            req["url"] = word
    return req


def _stop(up: Up) -> list[psutil.Process]:
    """SIGINT, as Ctrl-C does; returns the children that were running."""
    children = up.descendants()
    assert children, "qualify up started no process?"
    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(timeout=60) == 0
    return children


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """On the tmpfs, where PostgreSQL's unprivileged user may reach it when run as root."""
    path = Path(tempfile.mkdtemp(dir="/dev/shm" if Path("/dev/shm").is_dir() else None,
                                 prefix="qualify-up-test-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.req("R-CREATE-1")
def test_qualify_up_serves_the_printed_curl_and_stops_everything(data_dir: Path) -> None:
    with qualify_up("--data-dir", str(data_dir)) as up:
        t0 = time.monotonic()
        ready = json.loads(up.wait_for("ready ", READY_TIMEOUT_S).removeprefix("ready "))
        print(f"qualify up ready after {time.monotonic() - t0:.1f} s (boot {ready['boot_s']} s)")
        req = _request_of(up.wait_for("curl ", 10))
        assert req["headers"]["Authorization"] == f"Bearer {ready['api_key']}"
        created = httpx.request(req["method"], req["url"], headers=req["headers"],
                                content=req["content"], timeout=10)
        assert created.status_code == 202, created.text
        receipt = created.json()
        assert receipt["state"] in ("queued", "accepted") and receipt["durability"] == "temporal"
        # A fresh database holds this service's key and grant only, and its key audit
        # only their creation: none of the template's test keys, nor their deletion.
        with psycopg.connect(ready["owner_dsn"], autocommit=True) as conn:
            keys = conn.execute("SELECT tenant_id, principal_id FROM api_keys").fetchall()
            audit = conn.execute("SELECT action, tenant_id FROM api_key_audit ORDER BY id").fetchall()
            grants = conn.execute("SELECT count(*) FROM workspace_grants").fetchone()
        assert len(keys) == 1 and grants == (1,), (keys, grants)
        assert audit == [("created", keys[0][0])], audit
        run_url = f"{ready['base_url']}/v1/agents/{ready['agent']}/runs/{receipt['run_id']}"
        auth = {"Authorization": f"Bearer {ready['api_key']}"}
        assert_eventually(lambda: httpx.get(run_url, headers=auth, timeout=5).json()["state"] == "completed",
                          timeout=timedelta(seconds=60), what="the run completed")
        # The printed Temporal query (search attributes registered by qualify up, issue 25
        # item 14), asked about completed runs instead of failed ones, finds this run.
        printed = up.wait_for(shlex.quote(str(temporal_binary())), 10)
        listing = [*shlex.split(printed.replace("'failed'", "'completed'")), "--output", "json"]

        def listed() -> bool:
            out = subprocess.run(listing, capture_output=True, text=True, timeout=30)
            return f"agent-run-{receipt['run_id']}-g1" in out.stdout
        assert_eventually(listed, timeout=timedelta(seconds=20),
                          what="the printed temporal workflow list finds the run")
        children = _stop(up)
    _gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left running: {[p.pid for p in alive]}"
    assert not (data_dir / "up.pid").exists()

    # --data-dir: the same key reads the same run after a restart.
    with qualify_up("--data-dir", str(data_dir)) as again:
        ready2 = json.loads(again.wait_for("ready ", READY_TIMEOUT_S).removeprefix("ready "))
        assert ready2["api_key"] == ready["api_key"]
        run_url = f"{ready2['base_url']}/v1/agents/{ready['agent']}/runs/{receipt['run_id']}"
        read = httpx.get(run_url, headers=auth, timeout=10)
        assert read.status_code == 200 and read.json()["state"] == "completed"
        children = _stop(again)
    assert not psutil.wait_procs(children, timeout=10)[1]


def test_qualify_up_refuses_a_bad_provider_with_a_usage_error() -> None:
    done = subprocess.run([sys.executable, "-m", "qualify.cli", "up", "--provider", "not a path"],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 64 and "--provider" in done.stdout + done.stderr


@pytest.mark.req("R-TOOL-1", "R-TOOL-2")
def test_qualify_up_with_tools_runs_a_tool_call_and_logs_each_request() -> None:
    """Issue 25, item 12: ``--tools`` starts the side-effect sink and gives the worker its
    tools, so the tool journal can be tried by hand; the API's log has an access line per
    request."""
    from qualify.fakes.synthetic import make_prompt

    origin = "http://127.0.0.1:8765"
    with qualify_up("--tools", "--set", f'QIMPL_CORS_ORIGINS=["{origin}"]') as up:
        ready = json.loads(up.wait_for("ready ", READY_TIMEOUT_S).removeprefix("ready "))
        assert ready["sink_url"].startswith("http://127.0.0.1:")
        auth = {"Authorization": f"Bearer {ready['api_key']}"}
        # --set reaches the API: a browser's preflight from the allowed origin is answered.
        preflight = httpx.options(f"{ready['base_url']}/v1/agents/{ready['agent']}/runs/x/events", timeout=10,
                                  headers={"Origin": origin, "Access-Control-Request-Method": "GET"})
        assert preflight.status_code == 200, preflight.text
        assert preflight.headers["access-control-allow-origin"] == origin
        prompt = make_prompt(steps=2, answer="charged", tools={"1": [{"tool": "charge", "arguments": {"amount": 5}}]})
        created = httpx.post(f"{ready['base_url']}/v1/agents/{ready['agent']}/runs", timeout=10,
                             json={"prompt": prompt, "durable_temporal": True},
                             headers={**auth, "Idempotency-Key": str(uuid.uuid4())})
        assert created.status_code == 202, created.text
        run_url = f"{ready['base_url']}/v1/agents/{ready['agent']}/runs/{created.json()['run_id']}"
        assert_eventually(lambda: httpx.get(run_url, headers=auth, timeout=5).json()["state"] in
                          ("completed", "failed"), timeout=timedelta(seconds=60), what="the run ended")
        run = httpx.get(run_url, headers=auth, timeout=5).json()
        assert run["state"] == "completed" and "charge:succeeded" in run["result_json"]["answer"], run
        executions = Path(ready["data_dir"]) / "control" / "sink" / "executions.jsonl"
        assert executions.exists() and executions.read_text().count(created.json()["run_id"]) == 1
        api_log = (Path(ready["logs_dir"]) / "api-1.log").read_text()
        assert "POST /v1/agents/" in api_log and "202" in api_log, api_log[-2000:]
        children = _stop(up)
    assert not psutil.wait_procs(children, timeout=10)[1]


def test_qualify_up_starts_a_killed_worker_again_and_its_runs_complete() -> None:
    """A worker killed by hand (what a user of ``qualify up`` tries first) is started again,
    as a supervisor would; the service goes on (a tester saw everything stop instead)."""
    with qualify_up() as up:
        ready = json.loads(up.wait_for("ready ", READY_TIMEOUT_S).removeprefix("ready "))
        req = _request_of(up.wait_for("curl ", 10))
        workers = [p for p in up.descendants() if "qimpl.workflows.worker" in " ".join(p.cmdline())]
        assert len(workers) == 1, [p.cmdline() for p in up.descendants()]
        workers[0].kill()
        up.wait_for("worker-1 exited with -9; starting it again", 30)
        up.wait_for("worker-1 ready again", 60)
        created = httpx.request(req["method"], req["url"], headers=req["headers"],
                                content=req["content"], timeout=10)
        assert created.status_code == 202, created.text
        run_url = f"{ready['base_url']}/v1/agents/{ready['agent']}/runs/{created.json()['run_id']}"
        auth = {"Authorization": f"Bearer {ready['api_key']}"}
        assert_eventually(lambda: httpx.get(run_url, headers=auth, timeout=5).json()["state"] == "completed",
                          timeout=timedelta(seconds=60), what="a run after the restart completed")
        children = _stop(up)
    assert not psutil.wait_procs(children, timeout=10)[1]
