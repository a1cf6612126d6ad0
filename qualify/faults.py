"""Nemeses: faults that strike the real processes, each recording evidence that it
landed (R-Q-2). A fault whose evidence says it hit nothing makes the scenario
``vacuous``, never ``pass``.

Why one module of about 450 lines: it is the nemesis, Jepsen's one place for every fault
the harness can strike (processes, database sessions, servers, Temporal workflows), each
method recording the same kind of evidence; a new fault is one method beside its peers."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import psutil

from qualify.history import HistoryRecorder
from qualify.owner_sessions import CARRIED_RUNS_SQL, LEASE_PIDS_SQL
from qualify.processes import ManagedProcess

__all__ = ["Nemesis"]


class Nemesis:
    def __init__(self, history: HistoryRecorder) -> None:
        self.history = history
        self.recorded: list[dict[str, Any]] = []
        #: Open partitions: proxy name -> (direction, epoch s, stats before, context).
        self._partitions: dict[str, tuple[str, float, dict[str, Any], dict[str, Any]]] = {}

    def _record(self, fault: str, target: str, landed: bool, evidence: dict[str, Any]) -> dict[str, Any]:
        event = self.history.record("fault", fault=fault, target=target, landed=landed, evidence=evidence)
        self.recorded.append(event)
        return event

    def sigkill(self, proc: ManagedProcess, **context: Any) -> dict[str, Any]:
        """SIGKILL ``proc``'s process group; landed when the pid is gone."""
        if not proc.alive:
            return self._record("sigkill", proc.name, False, {"reason": "not running", **context})
        evidence = proc.sigkill()
        return self._record("sigkill", proc.name, bool(evidence["pid_gone"]), {**evidence, **context})

    def crash_point(self, proc: ManagedProcess, evidence: dict[str, Any], **extra: Any) -> dict[str, Any]:
        """Record a crash point that ``proc`` struck on itself (its evidence line; landed
        when the pid is gone for ``kill``, when the kernel reports it stopped for ``stop``,
        when it is alive and not stopped for ``hold`` and ``freeze``).
        The line is written just before the process strikes, so wait for the effect."""
        import subprocess

        import psutil

        if evidence["action"] == "kill" and proc.proc is not None:
            try:
                proc.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if evidence["action"] == "stop":
            landed = _stopped(evidence["pid"])
        elif evidence["action"] in ("hold", "freeze"):
            landed = proc.alive and _running(evidence["pid"])  # stalled by itself, no signal
        else:
            landed = not psutil.pid_exists(evidence["pid"]) or not proc.alive
        return self._record(f"crash_point:{evidence['action']}", proc.name, landed,
                            {"point": evidence["point"], "pid": evidence["pid"],
                             **evidence.get("context", {}), **extra})

    def terminate_backend(self, dsn: str, application_name: str) -> dict[str, Any]:
        """``pg_terminate_backend`` every session named ``application_name``; landed when at
        least one was terminated and none is left."""
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid, pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
                " WHERE application_name = %s", (application_name,)).fetchall()
            left = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND pid = ANY(%s)",
                (application_name, [r[0] for r in rows])).fetchone()
        terminated = [r[0] for r in rows if r[1]]
        return self._record("pg_terminate_backend", application_name,
                            bool(terminated) and left is not None and left[0] == 0,
                            {"backend_pids": terminated})

    def terminate_lease_session(self, dsn: str, run_id: str) -> dict[str, Any]:
        """``pg_terminate_backend`` the session that holds the run's advisory lock (its lease
        session, which may carry other runs' locks too: ``qimpl.db.lease_carriers``); landed
        when one was terminated and is gone. Evidence: ``backend_pids`` and
        ``carried_runs``, every run whose lock it held (each of them loses its owner)."""
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            pids = [int(r[0]) for r in conn.execute(f"SELECT pid FROM {LEASE_PIDS_SQL} p", (run_id,))]
            carried = sorted(str(r[0]) for r in conn.execute(CARRIED_RUNS_SQL, (pids, pids)))
            rows = conn.execute("SELECT pid, pg_terminate_backend(pid, 5000) FROM unnest(%s::int[]) pid",
                                (pids,)).fetchall()
            left = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)",
                                ([r[0] for r in rows],)).fetchone()
        terminated = [r[0] for r in rows if r[1]]
        return self._record("pg_terminate_backend", f"qimpl-owner:{run_id}",
                            bool(terminated) and left is not None and left[0] == 0,
                            {"backend_pids": terminated, "carried_runs": carried})

    def restart_postgres(self, stack: Any, **context: Any) -> dict[str, Any]:
        """Immediate-mode restart of PostgreSQL (SIGQUIT, then start on the same port):
        landed when the old postmaster is gone and a new one accepts connections.
        ``context`` (where it struck) is kept with the evidence."""
        import psutil

        old, new = stack.postgres.restart()
        return self._record("postgres_restart", "postgres", not psutil.pid_exists(old) and new != old,
                            {"old_pid": old, "new_pid": new, "mode": "immediate", **context})

    def stop_postgres(self, stack: Any, **context: Any) -> dict[str, Any]:
        """Immediate-mode stop of PostgreSQL (SIGQUIT): an outage until ``start_postgres``;
        landed when the postmaster is gone."""
        import psutil

        assert stack.postgres.proc is not None
        old = stack.postgres.proc.pid
        stack.postgres.stop()
        return self._record("postgres_down", "postgres", not psutil.pid_exists(old),
                            {"old_pid": old, "port": stack.postgres.port, **context})

    def start_postgres(self, stack: Any, **context: Any) -> dict[str, Any]:
        """Start PostgreSQL again after ``stop_postgres``, on the same port: landed when it
        accepts connections there."""
        port = stack.postgres.port
        stack.postgres.start()
        assert stack.postgres.proc is not None
        return self._record("postgres_up", "postgres", stack.postgres.port == port,
                            {"new_pid": stack.postgres.proc.pid, "port": stack.postgres.port, **context})

    def restart_temporal(self, stack: Any, **context: Any) -> dict[str, Any]:
        """Restart the Temporal dev server on the same ports and database file
        (``context``: where it struck, kept with the evidence)."""
        import psutil

        old, new = stack.temporal.restart()
        return self._record("temporal_restart", "temporal", not psutil.pid_exists(old) and new != old,
                            {"old_pid": old, "new_pid": new, "address": stack.temporal.address, **context})

    def stop_temporal(self, stack: Any) -> dict[str, Any]:
        """Make dispatch fail: Temporal unreachable until ``start_temporal``."""
        import psutil

        assert stack.temporal.proc is not None
        old = stack.temporal.proc.pid
        stack.temporal.stop()
        return self._record("temporal_down", "temporal", not psutil.pid_exists(old),
                            {"old_pid": old, "address": stack.temporal.address})

    def pause_temporal(self, stack: Any) -> dict[str, Any]:
        """SIGSTOP the Temporal server: every worker is cut off from it (no poll, no
        heartbeat answered) while their database sessions live; landed when the kernel
        reports it stopped. Always ``resume_temporal`` after."""
        import os
        import signal

        assert stack.temporal.proc is not None
        pid = stack.temporal.proc.pid
        os.kill(pid, signal.SIGSTOP)
        return self._record("temporal_paused", "temporal", _stopped(pid), {"pid": pid})

    def resume_temporal(self, stack: Any) -> dict[str, Any]:
        """SIGCONT the Temporal server; landed when it runs again."""
        import os
        import signal

        assert stack.temporal.proc is not None
        pid = stack.temporal.proc.pid
        os.kill(pid, signal.SIGCONT)
        landed = _resumed(pid)
        return self._record("temporal_resumed", "temporal", landed, {"pid": pid, "resumed": landed})

    def start_temporal(self, stack: Any) -> dict[str, Any]:
        address = stack.temporal.address
        stack.temporal.start()
        return self._record("temporal_up", "temporal", stack.temporal.address == address,
                            {"new_pid": stack.temporal.proc.pid, "address": stack.temporal.address})

    def restart(self, proc: ManagedProcess, *, owner_dsn: str | None = None,
                then: Callable[[], None] | None = None, **context: Any) -> dict[str, Any]:
        """Graceful restart (SIGTERM, wait, start again): landed when the pid changed and the
        new process is ready. With ``owner_dsn`` (a worker), also only when the process owned
        a run at that moment: the database showed a session holding a run's lock
        on one of its sockets just before the SIGTERM (evidence ``owned``). ``then`` runs
        between that look and the SIGTERM (a barrier released, so the shutdown has work)."""
        old = proc.pid
        owned = owned_runs(proc, owner_dsn) if owner_dsn else None
        if then is not None:
            then()
        proc.stop()
        proc.start()
        landed = proc.pid != old and proc.alive and (owned is None or bool(owned))
        evidence = {"old_pid": old, "new_pid": proc.pid, **context}
        if owned is not None:
            evidence["owned"] = owned
        return self._record("restart", proc.name, landed, evidence)

    def sigstop(self, proc: ManagedProcess, **context: Any) -> dict[str, Any]:
        evidence = proc.sigstop()
        return self._record("sigstop", proc.name, evidence["status"] == "stopped", {**evidence, **context})

    def sigcont(self, proc: ManagedProcess, **context: Any) -> dict[str, Any]:
        """SIGCONT ``proc``; landed when the kernel no longer reports it stopped."""
        evidence = proc.sigcont()
        landed = _resumed(proc.pid)
        return self._record("sigcont", proc.name, landed, {**evidence, "resumed": landed, **context})

    def terminate_workflow(self, address: str, workflow_id: str, *, namespace: str = "default",
                           reason: str = "qualify: terminated by an operator") -> dict[str, Any]:
        """Terminate ``workflow_id`` with Temporal's own client, as an operator would
        (``temporal workflow terminate``); landed when ``describe()`` then reports the
        execution TERMINATED."""
        import asyncio

        from temporalio.client import Client, WorkflowExecutionStatus

        async def strike() -> tuple[bool, dict[str, Any]]:
            client = await Client.connect(address, namespace=namespace)
            handle = client.get_workflow_handle(workflow_id)
            before = (await handle.describe()).status
            await handle.terminate(reason=reason)
            desc = await handle.describe()
            return desc.status == WorkflowExecutionStatus.TERMINATED, {
                "workflow_id": workflow_id, "execution_run_id": desc.run_id, "reason": reason,
                "status_before": before.name if before else None,
                "status_after": desc.status.name if desc.status else None}

        try:
            landed, evidence = asyncio.run(strike())
        except Exception as exc:  # noqa: BLE001 - a fault that could not strike did not land
            landed, evidence = False, {"workflow_id": workflow_id, "error": f"{type(exc).__name__}: {exc}"}
        return self._record("terminate_workflow", workflow_id, landed, evidence)

    def reset_activity(self, address: str, workflow_id: str, activity_id: str = "1", *,
                       namespace: str = "default") -> dict[str, Any]:
        """``temporal activity reset`` of a running activity, as an operator would, with the
        CLI of the stack's own Temporal: the attempt count returns to 1 and the running
        attempt is cancelled at its next heartbeat. Landed when the CLI succeeded and the
        pending activity's attempt then reads 1 (or the activity is no longer pending)."""
        import asyncio
        import subprocess

        from temporalio.client import Client

        from qualify.stack.temporal import temporal_binary

        async def attempt_now() -> int | None:
            client = await Client.connect(address, namespace=namespace)
            desc = await client.get_workflow_handle(workflow_id).describe()
            acts = [a for a in desc.raw_description.pending_activities if a.activity_id == activity_id]
            return int(acts[0].attempt) if acts else None

        try:
            before = asyncio.run(attempt_now())
            done = subprocess.run(
                [str(temporal_binary()), "activity", "reset", "--workflow-id", workflow_id,
                 "--activity-id", activity_id, "--address", address, "--namespace", namespace],
                capture_output=True, text=True, timeout=30)
            after = asyncio.run(attempt_now())
            landed = done.returncode == 0 and after in (None, 1)
            evidence: dict[str, Any] = {"workflow_id": workflow_id, "activity_id": activity_id,
                                        "attempt_before": before, "attempt_after": after,
                                        "cli_exit": done.returncode, "cli_stderr": done.stderr[-300:]}
        except Exception as exc:  # noqa: BLE001 - a fault that could not strike did not land
            landed, evidence = False, {"workflow_id": workflow_id, "error": f"{type(exc).__name__}: {exc}"}
        return self._record("reset_activity", workflow_id, landed, evidence)

    def delete_workflow(self, address: str, workflow_id: str, *, namespace: str = "default",
                        timeout_s: float = 15.0) -> dict[str, Any]:
        """Delete ``workflow_id``'s execution and history (``temporal workflow delete``), as a
        Temporal store that lost it would; landed when ``describe()`` answers NOT_FOUND."""
        import asyncio
        import time

        from temporalio.api.common.v1 import WorkflowExecution
        from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest
        from temporalio.client import Client
        from temporalio.service import RPCError, RPCStatusCode

        async def strike() -> tuple[bool, dict[str, Any]]:
            client = await Client.connect(address, namespace=namespace)
            await client.workflow_service.delete_workflow_execution(DeleteWorkflowExecutionRequest(
                namespace=namespace, workflow_execution=WorkflowExecution(workflow_id=workflow_id)))
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                try:
                    await client.get_workflow_handle(workflow_id).describe()
                except RPCError as exc:
                    if exc.status == RPCStatusCode.NOT_FOUND:
                        return True, {"workflow_id": workflow_id, "describe": "NOT_FOUND"}
                    raise
                await asyncio.sleep(0.1)
            return False, {"workflow_id": workflow_id, "describe": "still found"}

        try:
            landed, evidence = asyncio.run(strike())
        except Exception as exc:  # noqa: BLE001 - a fault that could not strike did not land
            landed, evidence = False, {"workflow_id": workflow_id, "error": f"{type(exc).__name__}: {exc}"}
        return self._record("delete_workflow", workflow_id, landed, evidence)


    def paused_in_transaction(self, proc: ManagedProcess, evidence: dict[str, Any], dsn: str,
                              run_id: str, **context: Any) -> dict[str, Any]:
        """Record ``proc`` stopped by itself at a crash point inside a transaction (R-EXEC-11,
        R-Q-10): landed when the kernel reports it stopped *and* the run's lease session
        (the one holding its lock) is idle inside a transaction that wrote (``backend_xid``
        set: the fenced UPDATE ran, the row lock is held, nothing committed)."""
        stopped = _stopped(evidence["pid"])
        sessions, in_txn = _idle_in_a_written_transaction(dsn, run_id)
        return self._record("crash_point:stop", proc.name, stopped and in_txn, {
            "point": evidence["point"], "pid": evidence["pid"], **evidence.get("context", {}),
            "stopped": stopped, "owner_sessions": [[p, s, w] for p, s, w in sessions], **context})

    def stalled_in_transaction(self, proc: ManagedProcess, evidence: dict[str, Any], dsn: str,
                               run_id: str, **context: Any) -> dict[str, Any]:
        """Record ``proc`` stalled by itself at a crash point inside a transaction, without
        a signal (issue 23, item 3): ``freeze`` blocks its event loop (the process and its
        threads run, no coroutine does, the lease keeper neither), ``hold`` suspends only
        the owner's coroutine (the keeper runs). Landed when the process is alive and *not*
        stopped, and its run's lease session is idle inside a transaction that wrote."""
        try:
            status = psutil.Process(evidence["pid"]).status()
        except psutil.Error:
            status = "gone"
        running = status not in ("gone", psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE)
        sessions, in_txn = _idle_in_a_written_transaction(dsn, run_id)
        return self._record(f"crash_point:{evidence['action']}", proc.name, running and in_txn, {
            "point": evidence["point"], "pid": evidence["pid"], **evidence.get("context", {}),
            "process_status": status, "owner_sessions": [[p, s, w] for p, s, w in sessions], **context})

    def held_without_lease(self, proc: ManagedProcess, evidence: dict[str, Any], *, orphaned: bool,
                           held_s: float, **context: Any) -> dict[str, Any]:
        """Record ``proc`` held at a crash point after its attempt closed the run's lease (a
        report to Temporal delayed ``held_s`` seconds). Landed when the process is alive
        and the run was an orphan (``running``, its lock free) during the hold."""
        alive = psutil.pid_exists(evidence["pid"]) and proc.alive
        return self._record(f"crash_point:{evidence['action']}", proc.name, alive and orphaned, {
            "point": evidence["point"], "pid": evidence["pid"], **evidence.get("context", {}),
            "held_s": held_s, "orphaned": orphaned, **context})

    # -- the network (R-Q-11): proxies between one process and PostgreSQL or Temporal ------
    def provider_outage(self, *, started_t: float, ended_t: float, failed_calls: int,
                        **context: Any) -> dict[str, Any]:
        """Record a model-server outage the synthetic provider played (every call failed
        ``provider_unreachable`` while its control file existed), from ``started_t`` to
        ``ended_t`` (epoch s, the database's clock): landed when calls failed during it."""
        return self._record("provider_outage", "provider", failed_calls > 0, {
            "started_t": started_t, "ended_t": ended_t, "down_s": round(ended_t - started_t, 3),
            "failed_calls": failed_calls, **context})

    def partition(self, proxy: Any, direction: str = "both", **context: Any) -> dict[str, Any]:
        """Black-hole ``proxy`` (a ``qualify.proxy.TcpProxy``) ``direction`` ways; the fault
        is recorded by ``heal``, which knows whether anything was held (landed)."""
        proxy.blackhole(direction)
        self._partitions[proxy.name] = (direction, time.time(), dict(vars(proxy.stats)), context)
        return {"proxy": proxy.name, "direction": direction}

    def heal(self, proxy: Any, **context: Any) -> dict[str, Any]:
        """Heal ``proxy``'s partition and record it: landed when bytes of the process (or
        of its server) were held back while it lasted, the evidence that it struck."""
        direction, t0, before, started = self._partitions.pop(proxy.name)
        after = dict(vars(proxy.stats))
        proxy.heal()
        held = {d: after[f"held_{d}"] - before[f"held_{d}"] for d in ("up", "down")}
        waiting = after["opened"] - before["opened"]
        return self._record(f"partition:{direction}", proxy.name, sum(held.values()) > 0 or (
            direction == "both" and waiting > 0), {
            "held_bytes": held, "connections_opened_meanwhile": waiting,
            "lasted_s": round(time.time() - t0, 3), "upstream": f"{proxy.upstream[0]}:{proxy.upstream[1]}",
            **started, **context})

    def slow(self, proxies: list[Any], ms: float) -> None:
        """Add ``ms`` milliseconds to every chunk through each of ``proxies``; ``slowed``
        records the fault."""
        for proxy in proxies:
            proxy.delay(ms)

    def slowed(self, proxies: list[Any], ms: float, **context: Any) -> dict[str, Any]:
        """Record (and end) the latency: landed when chunks of the process were delayed."""
        delayed = {p.name: p.stats.delayed_chunks for p in proxies}
        for proxy in proxies:
            proxy.delay(0)
        return self._record("latency", ",".join(delayed), sum(delayed.values()) > 0,
                            {"delay_ms": ms, "delayed_chunks": delayed, **context})

    def reset_connections(self, proxy: Any, **context: Any) -> dict[str, Any]:
        """RST every connection open through ``proxy``; landed when there was one."""
        n = proxy.reset()
        return self._record("connection_reset", proxy.name, n > 0, {"connections": n, **context})

    def rpc_error_once(self, proxy: Any, method: str, contains: str, code: str = "NOT_FOUND") -> Any:
        """Arm ``proxy`` (a ``qualify.proxy.GrpcProxy``) to answer the next ``method`` call
        naming ``contains`` with ``code``; ``rpc_error_struck`` records whether it did."""
        return proxy.fail_once(method, contains, code)

    def rpc_error_struck(self, proxy: Any, rule: Any, **context: Any) -> dict[str, Any]:
        """Record the armed error: landed when a real call of the process was answered with it."""
        return self._record(f"rpc_error:{rule.code.name}", proxy.name, rule.struck is not None,
                            {"method": rule.method, "matching": rule.needle.decode(),
                             "struck": rule.struck, **context})

    def kill_sink(self, sink: Any, *, call: dict[str, Any], hold_s: float, **context: Any) -> dict[str, Any]:
        """SIGKILL the side-effect sink while ``call`` is out (R-TOOL-3): it executed the
        call at ``call["t"]`` (epoch s, its executions line) and holds the reply ``hold_s``
        seconds, so a kill before ``t + hold_s`` lands while the caller waits for the reply.
        Then start it again on the same port and directory. Landed when the old pid is
        gone, the kill came inside that window and the new sink is ready."""
        old = sink.proc.pid
        os.killpg(old, signal.SIGKILL)
        t_kill = time.time()
        code = sink.proc.wait(timeout=10)
        gone = not psutil.pid_exists(old)
        in_flight = t_kill - float(call["t"]) < hold_s
        sink.start()
        new = sink.proc.pid
        return self._record("sink_killed", "sink", gone and in_flight and new != old, {
            "old_pid": old, "new_pid": new, "exit_code": code, "call_id": call["call_id"],
            "executed_at": call["t"], "killed_after_s": round(t_kill - float(call["t"]), 3),
            "reply_held_s": hold_s, "in_flight": in_flight, "port": sink.port, **context})

    def clock_skew(self, proc: ManagedProcess, *, expected_s: float, worker_t: float, seen_t: float,
                   dsn: str, run_id: str, **context: Any) -> dict[str, Any]:
        """Record that ``proc``, whose wall clock was skewed by ``expected_s`` seconds
        (libfaketime: ``FAKETIME`` in its environment), owns ``run_id`` (R-Q-10). Evidence:
        ``worker_t``, the time the worker itself wrote (its barrier file, ``time.time()`` in
        the process), against ``seen_t``, the harness's clock when it read it; landed when
        the observed offset is within 10 s of ``expected_s`` (nonzero) and the database
        shows the run's lease session on one of ``proc``'s sockets."""
        observed = round(worker_t - seen_t, 3)
        try:
            faketime = psutil.Process(proc.pid).environ().get("FAKETIME")
        except psutil.Error:
            faketime = None
        owned = owned_runs(proc, dsn)
        landed = expected_s != 0 and abs(observed - expected_s) <= 10 and run_id in owned
        return self._record("clock_skew", proc.name, landed, {
            "pid": proc.pid, "expected_offset_s": expected_s, "observed_offset_s": observed,
            "FAKETIME": faketime, "owned": owned, "run_id": run_id, **context})


def _idle_in_a_written_transaction(dsn: str, run_id: str, timeout_s: float = 5.0
                                   ) -> tuple[list[tuple[Any, ...]], bool]:
    """The run's lease sessions ``(pid, state, wrote)`` and whether one is idle inside a
    transaction that wrote, polled up to ``timeout_s``."""
    import psycopg

    sessions: list[tuple[Any, ...]] = []
    deadline = time.monotonic() + timeout_s
    while True:
        with psycopg.connect(dsn, autocommit=True) as conn:
            sessions = conn.execute(
                "SELECT pid, state, backend_xid IS NOT NULL FROM pg_stat_activity"
                f" WHERE pid IN {LEASE_PIDS_SQL}", (run_id,)).fetchall()
        found = any(state == "idle in transaction" and wrote for _, state, wrote in sessions)
        if found or time.monotonic() >= deadline:
            return sessions, found
        time.sleep(0.02)


def owned_runs(proc: ManagedProcess, dsn: str) -> list[str]:
    """The runs whose lease session (the one holding the run's lock: ``qualify.owner_sessions``)
    is connected from a socket of ``proc`` or its children, as ``pg_stat_activity`` reports
    the session's client port (TCP to the harness's PostgreSQL)."""
    import psycopg

    try:
        root = psutil.Process(proc.pid)
        procs = [root, *root.children(recursive=True)]
        ports = {c.laddr.port for p in procs for c in p.net_connections(kind="tcp") if c.laddr}
    except psutil.Error:
        return []
    with psycopg.connect(dsn, autocommit=True) as conn:
        held: dict[str, int] = dict(conn.execute(CARRIED_RUNS_SQL, (None, None)).fetchall())
        rows = conn.execute("SELECT pid, client_port FROM pg_stat_activity WHERE pid = ANY(%s)",
                            (list(set(held.values())),)).fetchall()
    by_pid = {int(pid): port for pid, port in rows}
    return sorted(str(run) for run, pid in held.items() if by_pid.get(int(pid)) in ports)


def _running(pid: int) -> bool:
    """True when ``pid`` exists and is neither stopped nor a zombie."""
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _stopped(pid: int, timeout_s: float = 5.0) -> bool:
    """True once the kernel reports ``pid`` stopped (SIGSTOP landed), within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_STOPPED:
                return True
        except psutil.NoSuchProcess:
            return False
        time.sleep(0.01)
    return False


def _resumed(pid: int, timeout_s: float = 5.0) -> bool:
    """True once the kernel reports ``pid`` running or sleeping again (SIGCONT landed)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_STOPPED:
                return True
        except psutil.NoSuchProcess:
            return False
        time.sleep(0.01)
    return False
