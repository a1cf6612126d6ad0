"""The named exec set: which scenarios exec the real entry points under ``--spawn auto``,
and the full-run gate that each entry point was exec'd by a passing scenario (issue 24)."""

from __future__ import annotations

from typing import Any

import pytest

from qualify.forkserver import SpawnPolicy
from qualify.scenarios import REGISTRY
from qualify.session import ENTRY_POINT_KINDS, entry_points_execd, full_run_gates


def test_exec_mode_has_no_fork_server_and_execs_everything() -> None:
    assert SpawnPolicy("exec").spawn_for(frozenset()) == (None, frozenset())
    assert SpawnPolicy("exec").spawn_for(frozenset({"api"})) == (None, frozenset())


def test_auto_execs_only_the_entry_points_a_scenario_names(monkeypatch: pytest.MonkeyPatch) -> None:
    server = object()
    for mode in ("auto", "fork"):
        policy = SpawnPolicy(mode)
        monkeypatch.setattr(policy, "fork_server", lambda: server)
        launcher, kinds = policy.spawn_for(frozenset({"worker"}))
        assert launcher is server
        assert kinds == (frozenset({"worker"}) if mode == "auto" else frozenset())
        # Both entry points exec'd by kind, and the fork server still there for a further
        # instance asked forked (rolling-restarts' second API and worker).
        both = frozenset({"api", "worker"})
        assert policy.spawn_for(both) == (server, both if mode == "auto" else frozenset())


def test_each_exec_set_scenario_execs_the_entry_points_its_reason_names() -> None:
    for sid, sc in REGISTRY.items():
        if not sc.execs:
            assert sc.exec_only == frozenset(), sid
            continue
        reason = sc.exec_because.lower()
        if "api" in reason:
            assert "api" in sc.exec_only, sid
        if "worker" in reason or "reconciler" in reason or "watcher" in reason:
            assert "worker" in sc.exec_only, sid
        assert sc.exec_only <= {"api", "worker"}, sid


@pytest.mark.req("R-Q-2")
def test_the_exec_set_strikes_each_entry_point_with_the_faults_that_matter() -> None:
    """The API exec'd under a SIGKILL at a crash point, the worker under a SIGKILL at its
    commit boundaries and under SIGSTOP, both under SIGTERM (drain) and a platform
    restart: each of those is a scenario of the set."""
    execs = {sid: sc for sid, sc in REGISTRY.items() if sc.execs}
    assert 5 <= len(execs) < len(REGISTRY) // 3, sorted(execs)
    assert any(p.startswith("api.") for sc in execs.values() for p in sc.crash_points)
    assert any(p.startswith("activity.") for sc in execs.values() for p in sc.crash_points)
    assert any("SIGSTOP" in sc.exec_because for sc in execs.values())
    assert any("SIGTERM" in sc.exec_because for sc in execs.values())
    assert any(sc.needs_platform for sc in execs.values())


def _doc(sid: str, execd: list[str], status: str = "pass") -> dict[str, Any]:
    return {"id": sid, "status": status, "execd": execd, "checks": [], "requirements": [],
            "crash_points": []}


def test_entry_points_execd_counts_passing_scenarios_only() -> None:
    docs = [_doc("a", ["api", "worker"], status="fail"), _doc("b", ["worker"])]
    assert entry_points_execd(docs) == {"api": [], "worker": ["b"]}
    assert set(ENTRY_POINT_KINDS) == {"api", "worker"}


@pytest.mark.parametrize(("spawn", "gated"), [("auto", True), ("exec", True), ("fork", False)])
def test_a_full_run_that_never_execd_the_api_fails_unless_it_forked_everything(spawn: str, gated: bool) -> None:
    summary: dict[str, Any] = {"verdict": "pass", "crash_points": {}, "spawn": spawn}
    full_run_gates(summary, [_doc("b", ["worker"])])
    assert summary["entry_points_execd"] == {"api": [], "worker": ["b"]}
    assert ("entry point never exec'd by a passing scenario: api" in summary.get("error", "")) is gated


@pytest.mark.req("R-EXEC-13")
def test_the_takeover_scenarios_run_on_a_servers_default_timers() -> None:
    """``--temporal-timers tuned`` shortens the dev server's timers; the takeover
    scenarios (and a paused owner's) must still run on the defaults users have, and none
    of them may strike the stack's own server (theirs is another one)."""
    default = {sid for sid, sc in REGISTRY.items() if sc.default_timers_because}
    takeover = {sid for sid, sc in REGISTRY.items() if sc.body.__module__.endswith(".takeover")}
    assert takeover and takeover <= default, sorted(takeover - default)
    assert "paused-owner" in default
    assert not [sid for sid in default if REGISTRY[sid].needs_platform]


def test_a_process_asked_forked_is_forked_in_an_exec_set_scenario_and_execd_in_exec_mode() -> None:
    """``rolling-restarts`` execs one instance of each entry point and forks the other
    (``forked=True``); with no fork server (``--spawn exec``) every process is exec'd."""
    from qualify.processes import Processes

    server: Any = object()
    auto = Processes(deployment=None, launcher=server, exec_kinds=frozenset({"api", "worker"}))  # type: ignore[arg-type]
    assert auto._launcher("api") is None and auto._launcher("worker") is None
    assert auto._launcher("api", forked=True) is server and auto._launcher("worker", True) is server
    fork_all = Processes(deployment=None, launcher=server)  # type: ignore[arg-type]
    assert fork_all._launcher("api") is server
    exec_all = Processes(deployment=None, launcher=None, exec_kinds=frozenset())  # type: ignore[arg-type]
    assert exec_all._launcher("api", forked=True) is None
