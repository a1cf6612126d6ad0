"""Checkers of the tool journal (R-TOOL-1..5): no side effect repeated, none without an
intent, none unapproved, the journal against the run record."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from qualify.checkers._base import Check, _of, _summary
from qualify.history import Event

__all__ = [
    "SINK_CLOCK_SLACK_S",
    "no_execution_without_intent",
    "no_side_effect_repeated",
    "no_unapproved_effect",
]


def _calls(events: Iterable[Event]) -> dict[str, list[Event]]:
    """Events by ``call_id``, each list in time order."""
    out: dict[str, list[Event]] = defaultdict(list)
    for e in sorted(events, key=lambda e: e["t"]):
        out[str(e["call_id"])].append(e)
    return out


def no_side_effect_repeated(history: Sequence[Event]) -> Check:
    """No instrumented call is asked of the owning system (the side-effect sink) more than
    once — requests are counted, not executions, since the sink's own idempotency would
    hide a repeat — and no uninstrumented action executes more than once per call id
    (R-Q-5, R-TOOL-2). Vacuous without a sink."""
    name = "no instrumented side effect repeated"
    requests = _calls(e for e in _of(history, "sink_request") if e.get("kind") == "instrumented")
    actions = _calls(e for e in _of(history, "sink_execution") if e.get("kind") == "uninstrumented")
    bad = [f"{call} ({evs[0].get('tool')}, run {evs[0].get('run_id')}): requested {len(evs)} times"
           f" (attempts {[e.get('attempt') for e in evs]})"
           for call, evs in requests.items() if len(evs) > 1]
    bad += [f"{call} ({evs[0].get('tool')}, run {evs[0].get('run_id')}): uninstrumented action"
            f" executed {len(evs)} times" for call, evs in actions.items() if len(evs) > 1]
    return Check(name, not bad, _summary(bad) or f"{len(requests)} calls, {len(actions)} actions",
                 ("R-Q-5", "R-TOOL-2"), judged=len(requests) + len(actions))


#: Sink requests are stamped by the sink process, intents by the database's clock (the
#: insert's ``clock_timestamp()``, which precedes the commit that precedes the call).
SINK_CLOCK_SLACK_S = 0.05


#: Journal rows that may never reach the owning system.
_NEVER_RUN = frozenset({"requested", "rejected", "denied"})


def no_execution_without_intent(history: Sequence[Event]) -> Check:
    """Every call the side-effect sink saw was journaled first (R-TOOL-1): the journal has
    its call id, for the same run and tool, of a kind the worker runs (instrumented or
    uninstrumented) and not settled as never run (rejected, denied), with the intent
    committed before the first request. Vacuous without a sink."""
    name = "no tool execution without a committed intent"
    journal = {str(e["call_id"]): e for e in _of(history, "tool_invocation")}
    calls = _calls(_of(history, "sink_request"))
    bad = []
    for call, evs in calls.items():
        first, row = evs[0], journal.get(call)
        if row is None:
            bad.append(f"{call} ({first.get('tool')}, run {first.get('run_id')}): no intent in the journal")
        elif row.get("tool") != first.get("tool"):
            bad.append(f"{call}: the sink ran {first.get('tool')}, the intent is for {row.get('tool')}")
        elif first.get("run_id") is not None and str(row.get("run_id")) != str(first.get("run_id")):
            bad.append(f"{call}: asked for run {first.get('run_id')}, journaled for run {row.get('run_id')}")
        elif row.get("kind") not in ("instrumented", "uninstrumented") or row.get("status") in _NEVER_RUN:
            bad.append(f"{call} ({row.get('tool')}): reached the sink though journaled"
                       f" {row.get('kind')}/{row.get('status')}")
        elif first["t"] + SINK_CLOCK_SLACK_S < float(row["t"]):
            bad.append(f"{call} ({row.get('tool')}): requested {float(row['t']) - first['t']:.3f} s"
                       " before its intent")
    return Check(name, not bad, _summary(bad) or f"{len(calls)} calls, {len(journal)} journaled",
                 ("R-TOOL-1", "R-Q-5"), judged=len(calls))


def _approval_tools() -> frozenset[str]:
    """The harness's tools that need an approval, read from their own flags (finalising or
    requires_approval), never from the implementation's rule under test."""
    from qualify.fakes.tools import sink_tools

    return frozenset(s.name for s in sink_tools({"sink_url": "http://127.0.0.1:9"})
                     if s.finalising or s.requires_approval)


def no_unapproved_effect(history: Sequence[Event]) -> Check:
    """Every call of a tool that needs an approval (a finalising tool, R-TOOL-5) that reached
    the side-effect sink was journaled with an approval that was decided ``approved`` for
    that run, and no approval was used by two calls. Vacuous without such calls."""
    name = "no finalising side effect without its own approval"
    needs = _approval_tools()
    journal = {str(e["call_id"]): e for e in _of(history, "tool_invocation")}
    approved = {(str(e["run_id"]), str(e["approval_id"])) for e in _of(history, "approval_decision")
                if e.get("approved")}
    bad, used = [], Counter(str(e["approval_id"]) for e in journal.values() if e.get("approval_id"))
    seen = 0
    for call, evs in _calls(_of(history, "sink_request")).items():
        if evs[0].get("tool") not in needs:
            continue
        seen += 1
        row = journal.get(call) or {}
        key = (str(row.get("run_id")), str(row.get("approval_id")))
        if not row.get("approval_id") or key not in approved:
            bad.append(f"{call} ({evs[0].get('tool')}, run {evs[0].get('run_id')}): no approved decision"
                       f" (approval {row.get('approval_id')})")
    bad += [f"approval {a} used by {n} calls" for a, n in used.items() if n > 1]
    return Check(name, not bad, _summary(bad) or f"{seen} calls needing an approval", ("R-TOOL-5", "R-Q-5"),
                 judged=seen + len(used))
