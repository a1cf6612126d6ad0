"""Run scenarios against a stack and judge them.

For each scenario: a fresh database cloned from the migrated template, its own task
queue, control directory and logs; a side-effect sink for the harness tools
(``qualify.fakes.sink``); real API and worker processes; the scenario body; then —
always — every process and the sink stopped, the history collected and merged, the
checkers run and a verdict given.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import re
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qualify import interrupt
from qualify.checkers import GENERIC_CHECKERS, Check, accepted_runs, run_checks
from qualify.collect import (
    database_events,
    file_events,
    stream_keys,
    workflow_events,
    workspace_grants,
)
from qualify.errors import HarnessError, InvariantViolation
from qualify.faults import Nemesis
from qualify.forkserver import STRAY_MARKER, ForkServer
from qualify.history import Event, HistoryRecorder, merge
from qualify.processes import Deployment, Processes, SinkProcess
from qualify.scenarios import Scenario, ScenarioContext
from qualify.stack import EmbeddedStack
from qualify.timing import Ledger, bind, spent
from qualify.verdict import Verdict

__all__ = ["ScenarioResult", "judge", "run_scenario", "sub_seed"]


def sub_seed(seed: int, *parts: str) -> int:
    """A sub-seed derived from the root seed and names (stable across Python runs)."""
    digest = hashlib.sha256(":".join([str(seed), *parts]).encode()).digest()
    return int.from_bytes(digest[:8], "big")


@dataclass
class ScenarioResult:
    scenario: Scenario
    seed: int
    verdict: Verdict
    duration_s: float
    checks: list[Check]
    faults: list[dict[str, Any]]
    crash_points: list[str]
    figures: dict[str, float]
    out_dir: Path
    error: str = ""
    events: int = 0
    logs: list[str] = field(default_factory=list)
    #: "k/n" when a failure was re-run: how often it reproduced.
    reproduction: str = ""
    crash_point_evidence: list[dict[str, Any]] = field(default_factory=list)
    #: How the scenario's API and worker processes started: ``exec``, ``fork`` (from the
    #: preloaded fork server, ``qualify.forkserver``) or ``fork+exec``.
    spawn: str = "exec"
    #: The kinds of process (``api``, ``worker``) the scenario exec'd at least once: the
    #: real entry points, not forks of the preloaded server.
    execd: list[str] = field(default_factory=list)
    #: How each process last started, by name (``api-1``: ``exec`` or ``fork``).
    spawned: dict[str, str] = field(default_factory=dict)
    #: The Temporal server's timers the scenario ran on: ``tuned`` (``TUNED_DYNAMIC_CONFIG``)
    #: or ``default`` (the server's own, as users run it).
    temporal_timers: str = "default"
    #: Seconds by kind (``qualify.timing.KINDS``): where the scenario's wall time went.
    time_by_kind: dict[str, float] = field(default_factory=dict)
    #: The bound each bounded figure was checked against (``ScenarioContext.figure``).
    figure_bounds: dict[str, str] = field(default_factory=dict)
    #: Tables the scenario attached for the report (``ScenarioContext.table``).
    tables: dict[str, dict[str, list[Any]]] = field(default_factory=dict)


#: What a qimpl process must never print: a trace (R-EXEC-6) or a crash on exit.
LOG_RED_FLAGS = ("Traceback (most recent call last)", "Fatal Python error", "Stack (most recent call last)")
#: A Python stack frame, also without its ``Traceback`` header (``format_exception(...)[1:]``,
#: ``format_tb``, ``format_stack``) and inside a JSON string (its quotes escaped).
LOG_STACK_FRAME = re.compile(r'File \\?"[^"\n]+?\\?", line \d+, in ')


def read_logs(logs_dir: Path) -> dict[str, str]:
    """Every process log of a scenario, by file name, read once for the log checks."""
    return {path.name: path.read_text(errors="replace") for path in sorted(logs_dir.glob("*.log"))}


def clean_logs(logs: Mapping[str, str]) -> Check:
    """No process log (``read_logs``) carries a stack trace or a fatal interpreter error."""
    bad = [f"{name}: {flag}" for name, text in logs.items() for flag in LOG_RED_FLAGS if flag in text]
    bad += [f"{name}: a stack frame ({found.group(0).strip()})" for name, text in logs.items()
            if (found := LOG_STACK_FRAME.search(text)) and not any(flag in text for flag in LOG_RED_FLAGS)]
    return Check("no stack trace or fatal error in any process log", not bad,
                 "; ".join(bad) or f"{len(logs)} logs", ("R-EXEC-6",), judged=len(logs))


#: A secret this long or longer is also found by most of it: all but its first or last
#: ``SECRET_CUT`` characters (a log of that all but gives the secret away; the standard
#: stream-bounds holds the token's log to).
SECRET_MIN_CUT_LEN = 16
SECRET_CUT = 2


def _most_of(secret: str) -> tuple[str, ...]:
    """``secret`` and, when long enough, its two cut-short forms (``SECRET_CUT``)."""
    if len(secret) < SECRET_MIN_CUT_LEN:
        return (secret,)
    return secret, secret[:-SECRET_CUT], secret[SECRET_CUT:]


def _secrets_in_logs(logs: Mapping[str, str], secrets: Sequence[str], what: str) -> list[str]:
    """``"<log>: <n> <what>"`` for each log holding any of ``secrets``, or most of one
    (``_most_of``), never the secret."""
    bad = []
    for name, text in logs.items():
        found = sum(1 for secret in secrets if secret and any(part in text for part in _most_of(secret)))
        if found:
            bad.append(f"{name}: {found} {what}")
    return bad


def no_grant_in_logs(logs: Mapping[str, str], grants: Sequence[str]) -> Check:
    """No process log (``read_logs``) carries any workspace grant token of the scenario's
    database (R-READ-3): the worker reads its run's grant at every attempt, so every
    scenario that runs one is a chance to leak it. Judged over the logs when the database
    holds a grant (``judged`` 0, covering nothing, when it holds none). The tokens
    themselves are not written into the detail: a leak is named by log and grant count."""
    bad = _secrets_in_logs(logs, grants, "grant(s)")
    return Check("no workspace grant in any process log", not bad,
                 "; ".join(bad) or f"{len(logs)} logs, {len(grants)} grants", ("R-READ-3",),
                 judged=len(logs) if grants else 0)


def no_stream_key_in_logs(logs: Mapping[str, str], keys: Sequence[str]) -> Check:
    """No process log (``read_logs``) carries any run's stream key (R-AUTH-3): a key in a
    log reads that run's events. Judged over the logs when the database holds a run; the
    keys are not written into the detail."""
    bad = _secrets_in_logs(logs, keys, "stream key(s)")
    return Check("no stream key in any process log", not bad,
                 "; ".join(bad) or f"{len(logs)} logs, {len(keys)} stream keys", ("R-AUTH-3",),
                 judged=len(logs) if keys else 0)


def stray_processes(control_dir: str) -> list[str]:
    """Processes still alive after the teardown that were started with the scenario's own
    ``QIMPL_CONTROL_DIR`` in their environment (``Deployment.env``, inherited by anything a
    qimpl process execs), or that hold the scenario's ``STRAY_MARKER`` open (inherited by
    anything a forked qimpl process forks without an exec, ``qualify.forkserver``): a
    descendant that left its process group and its parent (a double fork, ``setsid``)
    escapes ``kill_tree`` and ``poll()``. Each is SIGKILLed here, so none outlives its
    scenario; ``"<name> (pid <pid>)"`` for each."""
    import psutil

    marker = os.path.join(control_dir, STRAY_MARKER)
    found = []
    for proc in psutil.process_iter(["name"]):
        if proc.pid == os.getpid():
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if (proc.environ().get("QIMPL_CONTROL_DIR") != control_dir
                    and not any(f.path == marker for f in proc.open_files())):
                continue
            found.append(f"{proc.info['name']} (pid {proc.pid})")
            proc.kill()
        except psutil.Error:
            continue
    return found


def all_reaped(procs: Sequence[Any], strays: Sequence[str] = ()) -> Check:
    """Every process the scenario started (API, workers, the sink) has exited and been
    reaped by the harness (R-Q-2): ``proc.poll()`` returns its exit code; and none of
    their descendants lives on (``strays``, from ``stray_processes``)."""
    alive = [getattr(p, "name", "sink") for p in procs
             if p.proc is not None and p.proc.poll() is None]
    alive += [f"{stray}, a descendant left running" for stray in strays]
    return Check("every process the scenario started was stopped and reaped", not alive,
                 ", ".join(alive) or f"{len(procs)} processes", ("R-Q-1", "R-Q-2"), judged=len(procs))


def default_timers(scenario: Scenario, address: str, config: dict[str, str] | None) -> Check:
    """A scenario marked ``default_timers_because`` ran on a Temporal server of the stack
    whose dynamic config is empty: the timers users' servers have (a harness promise,
    so it covers no requirement)."""
    return Check("ran on a Temporal server with the server's default timers", config == {},
                 f"{address}: {'not a server of this stack' if config is None else config or 'defaults'}"
                 f" ({scenario.default_timers_because})", (), judged=1)


def crash_points_struck(declared: Sequence[str], events: Sequence[Event]) -> Check:
    """Each crash point the scenario declares was struck, with the striking process's own
    evidence line in the history (R-Q-4)."""
    struck = {e["point"] for e in events if e["type"] == "crash_point"}
    missing = [p for p in declared if p not in struck]
    return Check("every declared crash point struck, with the process's evidence", not missing,
                 ", ".join(missing) or ", ".join(declared), ("R-Q-4",), judged=len(declared))


def judge(checks: list[Check], faults: list[dict[str, Any]], *, expected_faults: int,
          error: Verdict | None = None, exercised: bool = True) -> Verdict:
    """Pure verdict of one scenario (see ``qualify.verdict`` for the order): a failed
    check is ``fail`` even if the scenario also broke off (``error``)."""
    if any(c.ok is False for c in checks):
        return Verdict.FAIL
    if error is not None:
        return error
    if any(c.ok is None for c in checks):
        return Verdict.UNKNOWN
    if expected_faults and (len(faults) < expected_faults or not all(f["landed"] for f in faults)):
        return Verdict.VACUOUS
    if not exercised:  # no run accepted, and the scenario does not say why
        return Verdict.VACUOUS
    return Verdict.PASS


def run_scenario(stack: EmbeddedStack, scenario: Scenario, *, seed: int, out_dir: Path,
                 heartbeat_timeout_s: float = 1.0, launcher: ForkServer | None = None,
                 paused_lease_s: float | None = None, lease_s: float | None = None,
                 exec_kinds: frozenset[str] = frozenset()) -> ScenarioResult:
    """Run one scenario on ``stack``; never raises for a product or harness failure.
    With ``launcher``, its API and worker processes are forked from that fork server,
    except those of ``exec_kinds`` (exec'd);
    ``paused_lease_s`` (seconds) replaces ``Deployment.paused_lease_s``' default, and
    ``lease_s`` (seconds; None: the heartbeat timeout) ``Deployment.lease_s``."""
    with bind(Ledger()) as ledger:
        result = _run_scenario(stack, scenario, seed=seed, out_dir=out_dir,
                               heartbeat_timeout_s=heartbeat_timeout_s, launcher=launcher,
                               paused_lease_s=paused_lease_s, lease_s=lease_s, exec_kinds=exec_kinds)
    result.time_by_kind = ledger.close()
    result.duration_s = round(ledger.total_s, 3)
    return result


def _run_scenario(stack: EmbeddedStack, scenario: Scenario, *, seed: int, out_dir: Path,
                  heartbeat_timeout_s: float, launcher: ForkServer | None,
                  paused_lease_s: float | None, lease_s: float | None,
                  exec_kinds: frozenset[str]) -> ScenarioResult:
    out_dir.mkdir(parents=True, exist_ok=True)
    assert stack.info is not None
    control = out_dir / "control"
    control.mkdir(exist_ok=True)
    db_name = "s_" + hashlib.sha256(f"{scenario.id}:{seed}:{time.time_ns()}".encode()).hexdigest()[:12]
    with spent("database"):
        dsn = stack.create_database(db_name)
    # Its port is fixed now (the processes' tools need the URL); it starts inside the try.
    sink = SinkProcess(control / "sink", log_path=out_dir / "logs" / "sink.log")
    with spent("stack"):
        temporal_address = (stack.default_timers_address() if scenario.default_timers_because
                            else stack.info.temporal_address)
    config = stack.dynamic_config_at(temporal_address)
    timers = "tuned" if config else "default"
    pre_checks = [default_timers(scenario, temporal_address, config)] if scenario.default_timers_because else []
    deployment = Deployment(dsn=dsn, temporal_address=temporal_address,
                            task_queue=f"q-{db_name}", control_dir=control,
                            logs_dir=out_dir / "logs", heartbeat_timeout_s=heartbeat_timeout_s,
                            lease_s=lease_s, sink_url=sink.url)
    if paused_lease_s is not None:
        deployment = dataclasses.replace(deployment, paused_lease_s=paused_lease_s)
    history = HistoryRecorder(out_dir / "history.jsonl")
    history.record("scenario", phase="start", id=scenario.id, seed=seed)
    processes = Processes(deployment, launcher=launcher, history=history, exec_kinds=exec_kinds)
    nemesis = Nemesis(history)
    ctx = ScenarioContext(deployment=deployment, processes=processes, history=history,
                          nemesis=nemesis, rng=random.Random(sub_seed(seed, scenario.id)),
                          stack=stack, sink=sink)
    started_at = time.time()
    error_verdict: Verdict | None = None
    error = ""
    try:
        sink.start()
        scenario.body(ctx)
    except InvariantViolation as exc:
        ctx.checks.append(Check("scenario invariant", False, str(exc)))
    except HarnessError as exc:
        error_verdict, error = Verdict.CRASHED, f"HarnessError: {exc}"
    except Exception as exc:  # noqa: BLE001 - the harness broke: crashed, with the traceback
        error_verdict = Verdict.CRASHED
        error = "".join(traceback.format_exception(exc))[-4000:]
    finally:
        with interrupt.deferred(), spent("teardown"):
            ctx.close()
            try:
                processes.stop_all()
            except HarnessError as exc:
                error_verdict, error = Verdict.CRASHED, str(exc)
            finally:
                try:
                    sink.stop()  # after the workers: none of them can call it any more
                except Exception as exc:  # noqa: BLE001 - a sink that will not die: crashed
                    error_verdict, error = Verdict.CRASHED, f"could not stop the sink: {exc}"
                for proxy in ctx.proxies:
                    try:
                        proxy.stop()
                    except Exception as exc:  # noqa: BLE001 - a proxy that will not stop: crashed
                        error_verdict, error = Verdict.CRASHED, f"could not stop proxy {proxy.name}: {exc}"
    history.record("scenario", phase="end", id=scenario.id)
    with spent("collect"):
        try:
            grants: list[str] = workspace_grants(dsn)
            keys: list[str] = stream_keys(dsn)
            collected = (database_events(dsn) + file_events(control)
                         + workflow_events(deployment.temporal_address, deployment.namespace,
                                           deployment.task_queue, since=started_at - 1.0))
        except Exception as exc:  # noqa: BLE001 - no history means no verdict but crashed
            collected = []
            error_verdict, error = Verdict.CRASHED, f"could not collect the history: {exc}"
        events = merge(history.events, collected)
        history.rewrite(events)
        history.close()
    # The checkers run even when the scenario broke off: a violation in what was recorded
    # is a ``fail`` (which outranks ``crashed``), whatever stopped the scenario.
    with spent("checks"):
        checks = pre_checks + ctx.checks + (run_checks(events, GENERIC_CHECKERS) if collected else [])
        logs = read_logs(out_dir / "logs")
        checks.append(clean_logs(logs))
        if collected:
            checks.append(no_grant_in_logs(logs, grants))
            checks.append(no_stream_key_in_logs(logs, keys))
        checks.append(all_reaped([*processes.all.values(), sink], stray_processes(str(control))))
    struck = sorted({e["point"] for e in events if e["type"] == "crash_point"})
    if scenario.crash_points:
        checks.append(crash_points_struck(scenario.crash_points, events))
    verdict = judge(checks, nemesis.recorded, expected_faults=len(scenario.faults), error=error_verdict,
                    exercised=bool(accepted_runs(events)) or bool(scenario.no_runs_because))
    return ScenarioResult(
        scenario=scenario, seed=seed, verdict=verdict, duration_s=0.0, checks=checks,
        faults=nemesis.recorded, crash_points=struck, figures=ctx.figures,
        figure_bounds=ctx.figure_bounds, tables=ctx.tables, out_dir=out_dir,
        error=error, events=len(events),
        crash_point_evidence=[{"point": e["point"], "action": e["action"], "pid": e["pid"]}
                              for e in events if e["type"] == "crash_point"],
        logs=sorted(str(p.relative_to(out_dir)) for p in (out_dir / "logs").glob("*.log")),
        spawn="+".join(sorted({p.spawned_by for p in processes.all.values() if p.spawned_by},
                              reverse=True)) or "exec",
        execd=sorted({p.kind for p in processes.all.values() if p.spawned_by == "exec"}),
        spawned={name: p.spawned_by for name, p in sorted(processes.all.items()) if p.spawned_by},
        temporal_timers=timers,
    )
