"""A dev server whose first boot failed (one of the random ports it binds of its own was
taken meanwhile) is started again on fresh ports, by the embedded stack and by
``qualify up`` alike (``TemporalServer.finish_start``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from qualify.errors import HarnessError
from qualify.stack import temporal
from qualify.stack.temporal import TemporalServer


@pytest.mark.req("R-Q-1")
def test_a_failed_boot_starts_again_on_fresh_ports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ports = iter(range(40001, 40100))
    spawned: list[list[str]] = []
    killed: list[Any] = []
    monkeypatch.setattr(temporal, "free_port", lambda: next(ports))
    monkeypatch.setattr(temporal, "spawn", lambda argv, **_: spawned.append(argv) or object())
    monkeypatch.setattr(temporal, "kill_tree", lambda proc, **_: killed.append(proc))
    server = TemporalServer(workdir=tmp_path / "t", logs_dir=tmp_path / "logs")
    answers = iter([False, True])

    def wait_ready() -> None:
        if not next(answers):
            raise HarnessError("temporal: process exited with 2 before ready")

    monkeypatch.setattr(server, "wait_ready", wait_ready)
    server.spawn()
    first = server.address
    server.finish_start()
    assert len(spawned) == 2 and len(killed) == 1, (spawned, killed)
    assert server.address != first, "started again on the same ports"
    assert f"--port {server.port}" in " ".join(spawned[1])
