"""What every checker shares: ``Check``, the terminal states and history helpers."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from qualify.history import Event

__all__ = ["SETTLED", "TERMINAL", "Check", "accepted_runs"]


TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
#: Tool-journal statuses of a settled call, the ones a provider is fed
#: (``qimpl.tool_journal.rules.SETTLED``, restated: the checkers judge the implementation).
SETTLED = frozenset({"succeeded", "failed", "rejected", "denied", "not_executed", "compensated"})


@dataclass(frozen=True)
class Check:
    """One checked property: ``ok`` is True, False, or None when the checker raised.

    ``judged`` is how many items of its kind the check looked at (runs, writes, provider
    calls, stream clients, sink requests…): a check that judged none held vacuously and
    covers no requirement (R-Q-12). ``restates`` names the database guard a check only
    restates (``"QG003"``): it still fails a scenario when the history breaks it, but the
    guard is covered by the probes that watch the database refuse, not by this check.
    Which checks cover what is decided in one place, ``qualify.coverage.covers``."""

    name: str
    ok: bool | None
    detail: str = ""
    requirements: tuple[str, ...] = field(default=())
    judged: int = 0
    restates: str = ""

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"name": self.name, "ok": self.ok, "detail": self.detail,
                                  "requirements": list(self.requirements), "judged": self.judged}
        if self.restates:
            out["restates"] = self.restates
        return out


def _summary(problems: Sequence[str], most: int = 5) -> str:
    """The first few problems and how many more: details stay readable in reports."""
    more = f" (+{len(problems) - most} more)" if len(problems) > most else ""
    return "; ".join(problems[:most]) + more


def _of(history: Iterable[Event], type_: str) -> list[Event]:
    return [e for e in history if e.get("type") == type_]


def _by_run(events: Iterable[Event]) -> dict[str, list[Event]]:
    out: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        out[str(e["run_id"])].append(e)
    for evs in out.values():
        evs.sort(key=lambda e: (e.get("id", 0), e["t"]))
    return out


def accepted_runs(history: Sequence[Event]) -> set[str]:
    """Runs the client saw accepted (``ok``, or ``info``/``fail`` carrying a receipt)."""
    runs = {str(e["run_id"]) for e in _of(history, "client") if e.get("op") == "create"
            and e.get("phase") in ("ok", "info", "fail") and e.get("run_id")}
    runs |= {str(e["run_id"]) for e in _of(history, "transition") if e.get("old_state") is None}
    return runs
