"""Checkers of the tool journal (R-TOOL-1..5): no side effect repeated, none without an
intent, none unapproved, the journal against the run record."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from qualify.checkers._base import SETTLED, Check, _of, _summary
from qualify.digests import canonical_sha256
from qualify.history import Event

__all__ = [
    "SINK_CLOCK_SLACK_S",
    "no_execution_without_intent",
    "no_side_effect_repeated",
    "no_unapproved_effect",
    "provider_fed_the_journal",
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
#: Used only for a history without the intent's commit time or the database clock's
#: reading (``db_clock``); with both, the commit itself is compared, on one clock.
SINK_CLOCK_SLACK_S = 0.05


def _digest(tool: str, arguments: object) -> str:
    """R-TOOL-1's arguments digest, computed here from its definition (SHA-256 of the
    canonical JSON of the tool and its arguments), not by the implementation's function."""
    return canonical_sha256({"tool": tool, "arguments": arguments})


def _before_intent(request_t: float, row: Event, clock: Event | None) -> float | None:
    """How many seconds the first request came before its intent was committed (or, for
    a history without commit times, was inserted), None when it did not. With the
    intent's commit time and a ``db_clock`` reading, the commit is moved onto the sink's
    clock (the host's) and only the reading's uncertainty is allowed; R-TOOL-1 orders
    the commit before the call, so a correct owner leaves a request round trip of margin."""
    if row.get("intent_commit_t") is not None and clock is not None:
        committed = float(row["intent_commit_t"]) - float(clock["offset_s"])
        early = committed - request_t
        return early if early > float(clock["uncertainty_s"]) else None
    early = float(row["t"]) - request_t
    return early if early > SINK_CLOCK_SLACK_S else None


#: Journal rows that may never reach the owning system.
_NEVER_RUN = frozenset({"requested", "rejected", "denied"})


def no_execution_without_intent(history: Sequence[Event]) -> Check:
    """Every call the side-effect sink saw was journaled first (R-TOOL-1): the journal has
    its call id, for the same run and tool, of a kind the worker runs (instrumented or
    uninstrumented) and not settled as never run (rejected, denied), the sink given the
    journaled arguments and the intent their digest, with the intent committed before
    the first request (its commit time against the sink's clock through
    the ``db_clock`` reading, where the history has both). Vacuous without a sink."""
    name = "no tool execution without a committed intent"
    journal = {str(e["call_id"]): e for e in _of(history, "tool_invocation")}
    calls = _calls(_of(history, "sink_request"))
    clock = next(iter(_of(history, "db_clock")), None)
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
        elif "arguments" in first and first["arguments"] != row.get("arguments"):
            bad.append(f"{call} ({row.get('tool')}): the sink ran arguments {first['arguments']!r},"
                       f" the intent journaled {row.get('arguments')!r}")
        elif row.get("arguments_digest") is not None and row["arguments_digest"] != _digest(
                str(row.get("tool")), row.get("arguments")):
            bad.append(f"{call} ({row.get('tool')}): the intent's arguments digest is not its arguments'")
        elif (early := _before_intent(float(first["t"]), row, clock)) is not None:
            bad.append(f"{call} ({row.get('tool')}): requested {early * 1000:.1f} ms before its intent"
                       + (" committed" if row.get("intent_commit_t") is not None and clock else ""))
    return Check(name, not bad, _summary(bad) or f"{len(calls)} calls, {len(journal)} journaled",
                 ("R-TOOL-1", "R-Q-5"), judged=len(calls))


def provider_fed_the_journal(history: Sequence[Event]) -> Check:
    """Every tool result a provider call was fed is the journal's, as it ended: a settled
    call of the same run, with the journal's status and result (R-TOOL-2: a retry feeds
    the journaled result; R-TOOL-3: an operator's resolution is what the provider sees).
    Judged on the synthetic provider's record of each result it was fed (its digest);
    vacuous for a call fed none."""
    name = "each provider call was fed the journal's settled outcomes, result included"
    journal = {str(e["call_id"]): e for e in _of(history, "tool_invocation")}
    bad, judged = [], 0
    for call in _of(history, "provider_call"):
        for fed in call.get("fed") or ():
            judged += 1
            row = journal.get(str(fed.get("call_id")))
            where = f"run {call.get('run_id')} step {call.get('step')} attempt {call.get('attempt')}"
            if row is None or str(row.get("run_id")) != str(call.get("run_id")):
                bad.append(f"{where}: fed {fed.get('call_id')}, not in the run's journal")
            elif row.get("status") not in SETTLED or fed.get("status") != row.get("status"):
                bad.append(f"{where}: fed {fed.get('call_id')} as {fed.get('status')}, journaled"
                           f" {row.get('status')}")
            elif fed.get("result_sha256") != canonical_sha256(row.get("result")):
                bad.append(f"{where}: fed {fed.get('call_id')} ({row.get('tool')}) another result than"
                           " the journal's")
    return Check(name, not bad, _summary(bad) or f"{judged} results fed", ("R-TOOL-2", "R-TOOL-3"),
                 judged=judged)


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
