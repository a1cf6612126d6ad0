"""Nemeses: faults that strike the real processes, each recording evidence that it
landed (R-Q-2). A fault whose evidence says it hit nothing makes the scenario
``vacuous``, never ``pass``."""

from __future__ import annotations

from typing import Any

from qualify.history import HistoryRecorder
from qualify.processes import ManagedProcess

__all__ = ["Nemesis"]


class Nemesis:
    def __init__(self, history: HistoryRecorder) -> None:
        self.history = history
        self.recorded: list[dict[str, Any]] = []

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

    def sigstop(self, proc: ManagedProcess, **context: Any) -> dict[str, Any]:
        evidence = proc.sigstop()
        return self._record("sigstop", proc.name, evidence["status"] == "stopped", {**evidence, **context})

    def sigcont(self, proc: ManagedProcess, **context: Any) -> dict[str, Any]:
        evidence = proc.sigcont()
        return self._record("sigcont", proc.name, True, {**evidence, **context})
