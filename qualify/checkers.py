"""Checkers: pure functions of a history (R-Q-5). No I/O; each returns a ``Check``.

Every checker here has a unit test with a bad history it must catch
(``tests/unit/test_checkers.py``).
"""

from __future__ import annotations

import itertools
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from qualify.history import Event

__all__ = [
    "GENERIC_CHECKERS",
    "TERMINAL",
    "Check",
    "accepted_runs",
    "checkpoints_one_per_step",
    "deadline_from_acceptance",
    "deadline_respected",
    "event_journal_matches_run_record",
    "event_prunes_bounded",
    "journal_matches_run_record",
    "no_crash_loop",
    "no_execution_without_intent",
    "no_side_effect_repeated",
    "no_step_repeated_after_checkpoint",
    "no_unapproved_effect",
    "no_write_after_terminal",
    "no_write_by_a_superseded_attempt",
    "one_terminal_state",
    "one_workflow_per_generation",
    "provider_calls_recorded",
    "row_version_strictly_increasing",
    "run_checks",
    "slot_holders",
    "slot_limit_respected",
    "state_restored_at_every_step",
    "stream_events_consistent",
    "workflow_input_matches_its_run",
    "writes_committed_whole",
]

TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})


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


def one_terminal_state(history: Sequence[Event]) -> Check:
    """Every accepted run ends in exactly one terminal state, entered exactly once."""
    name = "one terminal state per accepted run"
    trans = _by_run(_of(history, "transition"))
    bad = []
    for run in sorted(accepted_runs(history)):
        entries = [e for e in trans.get(run, []) if e["new_state"] in TERMINAL]
        if len(entries) != 1:
            bad.append(f"{run}: {len(entries)} terminal transitions")
        elif trans[run][-1]["new_state"] not in TERMINAL:
            bad.append(f"{run}: ends in {trans[run][-1]['new_state']}")
    runs = len(accepted_runs(history))
    return Check(name, not bad, _summary(bad) or f"{runs} runs", ("R-STATE-1",), judged=runs)


def row_version_strictly_increasing(history: Sequence[Event]) -> Check:
    """Per run, in the database's commit order, ``row_version`` goes up by exactly one.
    Restates the guard's QG003."""
    name = "row_version strictly increasing"
    bad = []
    transitions = _of(history, "transition")
    for run, evs in _by_run(transitions).items():
        versions = [int(e["row_version"]) for e in evs]
        for a, b in itertools.pairwise(versions):
            if b != a + 1:
                bad.append(f"{run}: {a} -> {b}")
                break
    return Check(name, not bad, _summary(bad) or f"{len(transitions)} transitions", ("R-STATE-1", "R-EXEC-3"),
                 judged=len(transitions), restates="QG003")


def no_write_after_terminal(history: Sequence[Event]) -> Check:
    """Nothing changes a run once it is terminal: no transition and no checkpoint after it.
    Restates the guard's QG001 (and the checkpoint guard's QG015)."""
    name = "no write after terminal"
    bad = []
    ended = 0
    trans = _by_run(_of(history, "transition"))
    ckpts = _by_run(_of(history, "checkpoint"))
    for run, evs in trans.items():
        idx = next((i for i, e in enumerate(evs) if e["new_state"] in TERMINAL), None)
        if idx is None:
            continue
        ended += 1
        if idx != len(evs) - 1:
            bad.append(f"{run}: {len(evs) - 1 - idx} transitions after {evs[idx]['new_state']}")
        final_version = int(evs[idx]["row_version"])
        late = [c for c in ckpts.get(run, []) if int(c["row_version"]) > final_version]
        if late:
            bad.append(f"{run}: checkpoint after terminal")
    return Check(name, not bad, _summary(bad) or f"{ended} ended runs", ("R-STATE-1", "R-EXEC-7", "R-CANCEL-1"),
                 judged=ended, restates="QG001")


def no_step_repeated_after_checkpoint(history: Sequence[Event]) -> Check:
    """The provider is never asked for a step after that step's checkpoint committed."""
    name = "no provider step repeated after its checkpoint"
    committed: dict[tuple[str, int], float] = {}
    for c in _of(history, "checkpoint"):
        key = (str(c["run_id"]), int(c["step"]))
        committed[key] = min(committed.get(key, c["t"]), c["t"])
    bad = []
    judged = 0  # calls of a step whose checkpoint committed: the only ones that could repeat it
    for call in _of(history, "provider_call"):
        key = (str(call["run_id"]), int(call["step"]))
        judged += key in committed
        if key in committed and call["t"] > committed[key]:
            bad.append(f"{key[0]}: step {key[1]} asked again (attempt {call.get('attempt')})")
    return Check(name, not bad, _summary(bad) or f"{judged} calls of checkpointed steps", ("R-EXEC-4",),
                 judged=judged)


def checkpoints_one_per_step(history: Sequence[Event]) -> Check:
    """Each run's checkpoints are steps 1..n, each exactly once, in order."""
    name = "one checkpoint per step"
    bad = []
    checkpoints = _of(history, "checkpoint")
    for run, evs in _by_run(checkpoints).items():
        steps = [int(e["step"]) for e in sorted(evs, key=lambda e: int(e["row_version"]))]
        dup = [s for s, n in Counter(steps).items() if n > 1]
        if dup or steps != list(range(1, len(steps) + 1)):
            bad.append(f"{run}: steps {steps}")
    return Check(name, not bad, _summary(bad) or f"{len(checkpoints)} checkpoints", ("R-EXEC-3",),
                 judged=len(checkpoints))


def state_restored_at_every_step(history: Sequence[Event]) -> Check:
    """Every provider call was handed exactly the state the run's previous step
    checkpointed (R-EXEC-4): the synthetic provider appends each step to the state's
    ``trail`` and records the trail it was given, so step k must have seen ``[1..k-1]``
    — after any takeover, resume or restore of a delta chain."""
    name = "each step was handed the state the previous step checkpointed"
    bad = []
    calls = [c for c in _of(history, "provider_call") if "trail_seen" in c]
    for call in calls:
        step = int(call["step"])
        if call["trail_seen"] != list(range(1, step)):
            bad.append(f"{call['run_id']}: step {step} (attempt {call.get('attempt')}) was handed "
                       f"trail {call['trail_seen']}")
    return Check(name, not bad, _summary(bad) or f"{len(calls)} provider calls", ("R-EXEC-4",),
                 judged=len(calls))


def no_write_by_a_superseded_attempt(history: Sequence[Event]) -> Check:
    """Within a generation, once attempt n owns the run no write carries an attempt < n
    (a paused or partitioned zombie is fenced, R-EXEC-7). Restates the guard's QG008."""
    name = "no write by a superseded attempt"
    bad = []
    judged = 0
    for run, evs in _by_run(_of(history, "transition")).items():
        highest: dict[int, int] = {}
        for e in evs:
            attempt = e.get("owner_attempt")
            if attempt is None:
                continue
            judged += 1
            gen = int(e["generation"])
            if attempt < highest.get(gen, 0):
                bad.append(f"{run}: attempt {attempt} wrote v{e['row_version']} after attempt {highest[gen]}")
            highest[gen] = max(highest.get(gen, 0), int(attempt))
    return Check(name, not bad, _summary(bad) or f"{judged} owned writes", ("R-EXEC-7",),
                 judged=judged, restates="QG008")


def _token(text: str | None) -> tuple[str, int, int] | None:
    """``<run_id>:<generation>:<attempt>`` of a writer token, or None (no owner, or a
    token this harness cannot read: the checker then reports it)."""
    if not text:
        return None
    run, _, rest = str(text).partition(":")
    gen, _, attempt = rest.partition(":")
    try:
        return run, int(gen), int(attempt)
    except ValueError:
        return run, -1, -1


def every_write_by_its_owner(history: Sequence[Event]) -> Check:
    """Every write is checked against the run's owner at that ``row_version``, by the
    writer's identity the writing session itself gave the audit trigger (R-EXEC-7,
    R-EXEC-2): a session holding an owner token (an activity attempt) wrote only its own
    run, in its own generation, while holding the run's advisory lock; a ``running ->
    running`` write (claim, checkpoint, journal) was made by exactly the stored owner
    attempt, any other by that attempt or a later claimer (which may end a run its dead
    predecessor owned); and a ``running -> running`` write by a session with no token
    was made by no owner at all. Histories from before the writer columns carry no
    ``writer_pid`` and are not judged here."""
    name = "every write by its owner"
    bad: list[str] = []
    judged = 0
    for e in _of(history, "transition"):
        if "writer_pid" not in e:
            continue
        judged += 1
        run, version = str(e["run_id"]), e["row_version"]
        token = _token(e.get("writer_token"))
        stay = e.get("old_state") == e["new_state"] == "running"
        if token is None:
            if stay:
                bad.append(f"{run} v{version}: running -> running by pid {e['writer_pid']}"
                           f" ({e.get('writer_role')}), which owns nothing")
            continue
        t_run, t_gen, t_attempt = token
        owner = e.get("owner_attempt")
        if t_run != run or t_gen != int(e["generation"]):
            bad.append(f"{run} v{version}: written by the owner token of {t_run} generation {t_gen}")
        elif owner is not None and (t_attempt != owner if stay else t_attempt < owner):
            bad.append(f"{run} v{version}: written by attempt {t_attempt} while attempt {owner} owns it")
        if not e.get("writer_lock"):
            bad.append(f"{run} v{version}: attempt {t_attempt} wrote without the run's advisory lock")
    return Check(name, not bad, _summary(bad) or f"{judged} writes", ("R-EXEC-7", "R-EXEC-2"),
                 judged=judged)


#: Provider calls are stamped by the worker a few microseconds after it checked the
#: deadline; checkpoints and transitions are stamped by the database that enforces it.
PROVIDER_CLOCK_SLACK_S = 0.05


def deadline_respected(history: Sequence[Event]) -> Check:
    """After a run's deadline: no provider call, no checkpoint, and no transition except
    into ``expired``, ``failed`` or ``cancelled`` (R-EXEC-8); and never ``expired`` before
    it (R-EXEC-12). Deadlines and transitions are both stamped by the database's clock.
    Judges what a deadline bounded: each event stamped after its run's deadline and each
    ``expired`` transition (a history whose runs all ended early judged nothing)."""
    name = "deadline respected"
    deadlines = {str(e["run_id"]): float(e["deadline_t"]) for e in _of(history, "run")}
    bad = []
    judged = 0
    for e in history:
        run = str(e.get("run_id", ""))
        if run not in deadlines or e["type"] not in ("provider_call", "checkpoint", "transition"):
            continue
        late = e["t"] - deadlines[run]
        judged += late > 0 or (e["type"] == "transition" and e["new_state"] == "expired")
        if e["type"] == "provider_call" and late > PROVIDER_CLOCK_SLACK_S:
            bad.append(f"{run}: provider step {e['step']} asked {late:.3f} s after the deadline")
        elif e["type"] == "checkpoint" and late > 0:
            bad.append(f"{run}: checkpoint {e['step']} {late:.3f} s after the deadline")
        elif (e["type"] == "transition" and late > 0
              and e["new_state"] not in ("expired", "failed", "cancelled")):
            bad.append(f"{run}: {e['old_state']} -> {e['new_state']} {late:.3f} s after the deadline")
        elif e["type"] == "transition" and late < 0 and e["new_state"] == "expired":
            bad.append(f"{run}: expired {-late:.3f} s before its deadline")
    return Check(name, not bad, _summary(bad) or f"{judged} events at or past a deadline",
                 ("R-EXEC-8", "R-EXEC-12"), judged=judged)


def _journal(history: Sequence[Event]) -> dict[str, dict[int, str | None]]:
    """Per run, the event ids a stream may deliver and their kinds: the event journal's
    ``seq -> kind`` (``run_event``), or for a history without the journal (an older
    schema) the transitions' ids, kinds unknown."""
    journal: dict[str, dict[int, str | None]] = defaultdict(dict)
    events = _of(history, "run_event")
    if events:
        for e in events:
            journal[str(e["run_id"])][int(e["seq"])] = str(e["kind"])
    else:
        for t in _of(history, "transition"):
            journal[str(t["run_id"])][int(t["id"])] = None
    return journal


def stream_events_consistent(history: Sequence[Event]) -> Check:
    """Events delivered to stream clients (R-EVENT-2/3), per run and client: ids strictly increasing
    (no duplicate across reconnects), each one an event the journal recorded, of the
    journal's kind, and — for a stream read to its end — every journal event delivered (every
    one after the ``Last-Event-ID`` the client first opened with, ``stream_open``) and the
    last event ``terminal`` with the run's final state. A pruned run's journal is gone
    (R-EVENT-5): only the order of what was delivered is checked."""
    name = "stream events complete, ordered and ending in the run's terminal state"
    finals = {str(e["run_id"]): e["state"] for e in _of(history, "run")}
    journal = _journal(history)
    pruned = {str(e["run_id"]) for e in _of(history, "event_prune")}
    bad = []
    begins: dict[tuple[str, str], int] = {}
    for e in _of(history, "stream_open"):  # the client's first open: where its stream begins
        begins.setdefault((str(e["run_id"]), str(e.get("client", ""))), int(e.get("after") or 0))
    by_client: dict[tuple[str, str], list[Event]] = defaultdict(list)
    for e in _of(history, "stream_event"):  # each client's own sequence (several may follow a run)
        by_client[(str(e["run_id"]), str(e.get("client", "")))].append(e)
    for (run, client), evs in sorted(by_client.items()):
        ids = [int(e["event_id"]) for e in sorted(evs, key=lambda e: e["t"])]
        if any(b <= a for a, b in itertools.pairwise(ids)):
            bad.append(f"{run}: ids not strictly increasing {ids}")
        if run in pruned:
            continue
        recorded = journal.get(run, {})
        unknown = set(ids) - set(recorded)
        if unknown:
            bad.append(f"{run}: events the journal never recorded {sorted(unknown)}")
        wrong = [e["event_id"] for e in evs if recorded.get(int(e["event_id"])) not in (None, e["event"])]
        if wrong:
            bad.append(f"{run}: events delivered as another kind than the journal's {wrong}")
        last = max(evs, key=lambda e: int(e["event_id"]))
        if last["event"] == "terminal":
            owed = sorted(i for i in recorded if i > begins.get((run, client), 0))
            if ids != owed:
                bad.append(f"{run}: stream incomplete: got {ids}, journal {owed}")
            if last["state"] != finals.get(run):
                bad.append(f"{run}: terminal event {last['state']} but run is {finals.get(run)}")
    return Check(name, not bad, _summary(bad) or f"{len(by_client)} stream clients", ("R-EVENT-2", "R-EVENT-3"),
                 judged=len(by_client))


def usage_events_match_the_record(history: Sequence[Event]) -> Check:
    """Every settled provider call (the provider-call record) has exactly one ``usage``
    event in its run's journal, with its attempt, step and status, and every usage event
    names a settled call; each event's running total of calls counts at least the calls
    settled up to it (R-EVENT-1, R-Q34-2). Pruned runs' journals are gone and skipped."""
    name = "one usage event per settled provider call"
    events = [e for e in _of(history, "run_event") if e["kind"] == "usage"]
    records = [r for r in _of(history, "provider_call_record") if r["status"] != "started"]
    if not _of(history, "run_event"):
        return Check(name, True, "no event journal in this history")  # cites nothing: vacuous
    if not records and not events:
        return Check(name, True, "no settled provider call")  # cites nothing: vacuous
    pruned = {str(e["run_id"]) for e in _of(history, "event_prune")}
    want = Counter((str(r["run_id"]), int(r["attempt"]), int(r["step"]), r["status"])
                   for r in records if str(r["run_id"]) not in pruned)
    got = Counter((str(e["run_id"]), int(e["attempt"]), int(e["step"]), e["status"]) for e in events)
    bad = [f"{k[0]}: call a{k[1]} step {k[2]} {k[3]}: {got[k]} usage events for {want[k]} settled"
           for k in sorted(set(want) | set(got)) if want[k] != got[k]]
    for run, evs in _by_run(events).items():
        totals = [int(e["total_calls"]) for e in sorted(evs, key=lambda e: int(e["seq"]))]
        if any(b < a for a, b in itertools.pairwise(totals)) or (
                totals and totals[-1] < len(evs)):
            bad.append(f"{run}: running totals {totals[:10]} for {len(evs)} usage events")
    return Check(name, not bad, _summary(bad) or f"{sum(want.values())} settled calls",
                 ("R-EVENT-1", "R-Q34-2"), judged=sum(want.values()) + len(events))


def event_journal_matches_run_record(history: Sequence[Event]) -> Check:
    """The event journal (R-EVENT-1, R-EVENT-3, R-Q-5), per run not pruned: ``seq`` is
    1, 2, … without gaps; every transition has exactly one event at its ``row_version``
    (``state``, ``checkpoint``, ``tool_call``, ``tool_result``, ``claim``, ``failure`` or
    ``terminal``: a tool invocation's intent and outcome versions are its
    ``tool_call``/``tool_result``, a ``checkpoint`` event's version has a committed
    checkpoint, a takeover's is a ``claim``) and no
    event names a row version the run never had; the last event is ``terminal`` exactly
    when the run is terminal, and then its state, row version and generation are the run
    record's; otherwise the last transition's event is the run record's row version.
    Passes with a note on a history without the journal (an older schema)."""
    name = "event journal consistent with the run record"
    reqs = ("R-EVENT-1", "R-EVENT-3", "R-Q-5")
    events = _of(history, "run_event")
    if not events:
        return Check(name, True, "no event journal in this history")  # cites nothing: vacuous
    pruned = {str(e["run_id"]) for e in _of(history, "event_prune")}
    records = {str(e["run_id"]): e for e in _of(history, "run")}
    versions: dict[str, list[int]] = defaultdict(list)
    for t in _of(history, "transition"):
        versions[str(t["run_id"])].append(int(t["row_version"]))
    by_run: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        by_run[str(e["run_id"])].append(e)
    tools: dict[str, list[Event]] = defaultdict(list)
    for e in _of(history, "tool_invocation"):
        tools[str(e["run_id"])].append(e)
    checkpointed = {(str(c["run_id"]), int(c["row_version"])) for c in _of(history, "checkpoint")}
    claims: dict[str, list[int]] = defaultdict(list)
    previous: dict[str, Event] = {}
    for t in sorted(_of(history, "transition"), key=lambda t: (str(t["run_id"]), int(t["row_version"]))):
        run = str(t["run_id"])
        before = previous.get(run)
        if (before is not None and t.get("old_state") == "running" and t.get("new_state") == "running"
                and t.get("generation") == before.get("generation")
                and t.get("owner_attempt") != before.get("owner_attempt")):
            claims[run].append(int(t["row_version"]))
        previous[run] = t
    bad = []
    judged = 0
    for run, record in sorted(records.items()):
        if run in pruned:
            continue
        judged += 1
        evs = sorted(by_run.get(run, []), key=lambda e: int(e["seq"]))
        seqs = [int(e["seq"]) for e in evs]
        if seqs != list(range(1, len(seqs) + 1)):
            bad.append(f"{run}: seq not 1..n {seqs[:12]}")
        described = Counter(int(e["row_version"]) for e in evs if e["kind"] not in ("output", "usage"))
        missing = sorted(set(versions.get(run, [])) - set(described))
        if missing:
            bad.append(f"{run}: transitions with no event: row versions {missing[:10]}")
        extra = sorted(v for v, n in described.items() if n > 1 or v not in versions.get(run, []))
        if extra:
            bad.append(f"{run}: events for row versions recorded {extra[:10]} (repeated or never written)")
        if not evs:
            continue
        kinds = {int(e["row_version"]): e["kind"] for e in evs if e["kind"] not in ("output", "usage")}
        # A ``checkpoint`` event names a committed checkpoint; a write by which another
        # attempt took the run over is a ``claim`` (migration 20261206_090000_claim_events).
        for version, kind in sorted(kinds.items()):
            if kind == "checkpoint" and (run, version) not in checkpointed:
                bad.append(f"{run}: a checkpoint event at v{version}, where no checkpoint was committed")
        for version in claims.get(run, []):
            if kinds.get(version) not in (None, "claim"):
                bad.append(f"{run}: the takeover at v{version} is a {kinds.get(version)} event, not a claim")
        for inv in tools.get(run, []):
            intent, outcome = inv.get("intent_row_version"), inv.get("outcome_row_version")
            want = [(intent, "tool_result" if intent == outcome else "tool_call")] if intent else []
            want += [(outcome, "tool_result")] if outcome and outcome != intent else []
            for version, kind in want:
                if kinds.get(int(version)) != kind:
                    bad.append(f"{run}: call {inv['call_id']} at v{version} is a "
                               f"{kinds.get(int(version))} event, not {kind}")
        last = evs[-1]
        terminal = record["state"] in TERMINAL
        if terminal != (last["kind"] == "terminal"):
            bad.append(f"{run}: last event {last['kind']} but the run is {record['state']}")
        elif terminal and (last["state"], int(last["row_version"]), last["generation"]) != (
                record["state"], int(record["row_version"]), record["generation"]):
            bad.append(f"{run}: terminal event {last['state']} v{last['row_version']} "
                       f"g{last['generation']} but the run is {record['state']} "
                       f"v{record['row_version']} g{record['generation']}")
        elif not terminal and max(described, default=0) != int(record["row_version"]):
            bad.append(f"{run}: newest event at v{max(described, default=0)}, run at v{record['row_version']}")
    return Check(name, not bad, _summary(bad) or f"{judged} runs' journals", reqs, judged=judged)


#: Journal events that describe the write at their ``row_version`` (written by the audit
#: row's commit trigger); ``output`` ones too when they carry a checkpoint's whole text.
_WRITE_EVENTS = frozenset({"state", "checkpoint", "tool_call", "tool_result", "claim", "failure", "terminal"})


def writes_committed_whole(history: Sequence[Event]) -> Check:
    """Each write is one transaction (R-EXEC-3, R-EXEC-7, R-EVENT-1, R-Q-5), judged by the
    transaction the database stamped on every row it wrote (``xact_id``; migration
    ``20261203_090000_write_xacts``), not by luck of a kill landing between two commits:

    - a checkpoint at ``row_version`` v was committed by the transaction that bumped the
      run to v (its audit row, the ``transition`` at v): a step's checkpoint and its
      ``row_version + 1`` are one commit (R-EXEC-3);
    - each journal event describing the write at v (``state``, ``checkpoint``,
      ``tool_call``, ``tool_result``, ``terminal``, and a checkpoint's ``output`` with
      its whole text) was committed with it too (R-EVENT-1); a streamed delta is not;
    - a tool invocation's intent (or request, or an outcome written at once) was committed
      with the fenced write at its ``intent_row_version``, and a worker's outcome with
      the one at its ``outcome_row_version`` (R-EXEC-7, R-TOOL-1);
    - a ``usage`` event was committed by the transaction that settled a provider call of
      its run, attempt, step and status (R-Q34-2).

    A stamped row whose write is missing (no transition at its row version) is a split
    too: its partner never committed. Unstamped rows (an older schema, rows written
    before the migration) are not judged; a history with none passes with a note."""
    name = "every row committed in its write's transaction"
    reqs = ("R-EXEC-3", "R-EXEC-7", "R-EVENT-1", "R-Q-5")
    writes: dict[tuple[str, int], str | None] = {}
    for t in _of(history, "transition"):
        writes[(str(t["run_id"]), int(t["row_version"]))] = t.get("xact_id")
    # (what, run, row version, its transaction): rows that belong to the write at that version
    parts: list[tuple[str, str, int, str]] = []
    for c in _of(history, "checkpoint"):
        if c.get("xact_id"):
            parts.append((f"checkpoint {c['step']}", str(c["run_id"]), int(c["row_version"]), c["xact_id"]))
    usage: list[Event] = []
    for e in _of(history, "run_event"):
        if not e.get("xact_id"):
            continue
        if e["kind"] in _WRITE_EVENTS or (e["kind"] == "output" and e.get("text_chars") is not None):
            parts.append((f"{e['kind']} event {e['seq']}", str(e["run_id"]), int(e["row_version"]),
                          e["xact_id"]))
        elif e["kind"] == "usage":
            usage.append(e)
    for i in _of(history, "tool_invocation"):
        run, call = str(i["run_id"]), i["call_id"]
        if i.get("intent_xact") and i.get("intent_row_version") is not None:
            parts.append((f"call {call}'s intent", run, int(i["intent_row_version"]), i["intent_xact"]))
        if (i.get("outcome_xact") and i.get("outcome_xact") != i.get("intent_xact")
                and i.get("settled_by") == "worker" and i.get("outcome_row_version") is not None):
            parts.append((f"call {call} outcome {i['status']}", run, int(i["outcome_row_version"]),
                          i["outcome_xact"]))
    bad: list[str] = []
    judged = 0
    for what, run, version, xact in parts:
        if (run, version) not in writes:
            judged += 1
            bad.append(f"{run}: {what} committed (transaction {xact}) for v{version}, a row version"
                       " the run never had")
            continue
        write = writes[(run, version)]
        if write is None:
            continue  # the write predates the stamps
        judged += 1
        if write != xact:
            bad.append(f"{run}: {what} committed in transaction {xact}, its write to v{version} in {write}")
    settles: dict[tuple[str, int, int, str], set[str]] = defaultdict(set)
    for r in _of(history, "provider_call_record"):
        if r.get("ended_xact"):
            settles[(str(r["run_id"]), int(r["attempt"]), int(r["step"]), r["status"])].add(r["ended_xact"])
    for e in usage:
        judged += 1
        key = (str(e["run_id"]), int(e["attempt"]), int(e["step"]), e["status"])
        if e["xact_id"] not in settles.get(key, set()):
            bad.append(f"{key[0]}: usage event {e['seq']} (a{key[1]} step {key[2]} {key[3]}) committed in"
                       f" transaction {e['xact_id']}, which settled no such provider call")
    if not judged:
        return Check(name, True, "no row stamped with its transaction")  # cites nothing: vacuous
    return Check(name, not bad, _summary(bad) or f"{judged} rows, each in its write's transaction", reqs,
                 judged=judged)


def event_prunes_bounded(history: Sequence[Event]) -> Check:
    """Pruning (R-EVENT-5, R-OPS-3): each pruning transaction (tombstones sharing
    ``pruned_by`` and ``t``) pruned at most 100 streams of one tenant; every pruned run is
    terminal and its journal holds nothing. Passes with a note when nothing was pruned."""
    name = "at most 100 event streams pruned per tenant per sweep, only ended runs"
    reqs = ("R-EVENT-5", "R-OPS-3")
    prunes = _of(history, "event_prune")
    if not prunes:
        return Check(name, True, "nothing pruned")  # cites nothing: vacuous
    records = {str(e["run_id"]): e for e in _of(history, "run")}
    left = Counter(str(e["run_id"]) for e in _of(history, "run_event"))
    sweeps = Counter((e["pruned_by"], e["tenant_id"], e["t"]) for e in prunes)
    bad = [f"{who} pruned {n} streams of {tenant} in one sweep" for (who, tenant, _), n in sweeps.items()
           if n > 100]
    for e in prunes:
        run = str(e["run_id"])
        if records.get(run, {}).get("state") not in TERMINAL:
            bad.append(f"{run}: pruned while {records.get(run, {}).get('state')}")
        if left.get(run):
            bad.append(f"{run}: pruned but {left[run]} events remain")
    return Check(name, not bad, _summary(bad) or f"{len(prunes)} streams in {len(sweeps)} sweeps "
                 f"(largest {max(sweeps.values())})", reqs, judged=len(prunes))


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


def journal_matches_run_record(history: Sequence[Event]) -> Check:
    """For every run, the last transition the database's own audit recorded equals the run
    record at collection (state, row_version, generation): no write escaped the journal
    (R-Q-5, R-EVENT-1). Restates the audit trigger (``run_transitions`` is written by the
    database for every write of a run)."""
    name = "every run's last journaled transition equals its run record"
    last: dict[str, Event] = {}
    for t in sorted(_of(history, "transition"), key=lambda e: int(e.get("id", 0))):
        last[str(t["run_id"])] = t
    bad = []
    for run in _of(history, "run"):
        found = last.get(str(run["run_id"]))
        want = (run["state"], run["row_version"], run["generation"])
        got = (found["new_state"], found["row_version"], found["generation"]) if found else None
        if got != want:
            bad.append(f"{run['run_id']}: journal {got}, record {want}")
    return Check(name, not bad, _summary(bad) or f"{len(last)} runs", ("R-Q-5", "R-EVENT-1"),
                 judged=len(_of(history, "run")), restates="the audit trigger")


def deadline_from_acceptance(history: Sequence[Event]) -> Check:
    """``deadline_at`` is the acceptance time plus the seconds the client asked for (the
    spec's default when it asked for none), both on the database's clock (R-EXEC-8). The
    guard keeps it unchanged across generations; this checks the value it kept."""
    name = "deadline_at = accepted_at + the requested seconds"
    asked = {str(e["key"]): e["deadline_seconds"] for e in _of(history, "client")
             if e.get("op") == "create" and e.get("phase") == "invoke" and "deadline_seconds" in e}
    created = {str(e["run_id"]): asked[str(e["key"])] for e in _of(history, "client")
               if e.get("op") == "create" and e.get("phase") == "ok" and e.get("run_id")
               and str(e.get("key")) in asked}
    bad = []
    judged = 0
    for run in _of(history, "run"):
        want = created.get(str(run["run_id"]))
        judged += want is not None
        if want is not None and abs(float(run["deadline_t"]) - float(run["t"]) - float(want)) > 0.001:
            bad.append(f"{run['run_id']}: deadline {float(run['deadline_t']) - float(run['t']):.3f} s"
                       f" after acceptance, asked {want} s")
    return Check(name, not bad, _summary(bad) or f"{judged} runs", ("R-EXEC-8", "R-Q-5"), judged=judged)


_WORKFLOW_ID = re.compile(r"^agent-run-(?P<run>[0-9a-f-]{36})-g(?P<gen>[0-9]+)$")


def one_workflow_per_generation(history: Sequence[Event]) -> Check:
    """Temporal holds at most one execution per workflow id, and every durable workflow id
    names a generation its run reached (R-CREATE-5): dispatch identity held under
    retries, reconciler sweeps and faults. Judges every workflow of the namespace the
    listing saw that is the scenario's — on its task queue, or naming one of its runs
    under any id or queue: a workflow naming one of its runs on another task queue is a
    misdirected dispatch (unless a process of the scenario was started on that queue, its
    ``process`` events). Vacuous without ``workflow`` events."""
    name = "one Temporal workflow per run generation"
    failed = [e["error"] for e in _of(history, "workflow_listing") if e.get("error")]
    if failed:
        return Check(name, None, f"Temporal's executions could not be listed: {failed[0]}",
                     ("R-CREATE-5", "R-Q-5"))
    generations = {str(e["run_id"]): int(e["generation"]) for e in _of(history, "run")}
    ours = [e for e in _of(history, "workflow")
            if e.get("ours", True) or any(run in str(e["workflow_id"]) for run in generations)]
    per_id = Counter(str(e["workflow_id"]) for e in ours)
    bad = [f"{wid}: {n} executions" for wid, n in per_id.items() if n > 1]
    queues = {str(e["settings"]["QIMPL_TASK_QUEUE"]) for e in _of(history, "process")
              if "QIMPL_TASK_QUEUE" in (e.get("settings") or {})}
    bad += [f"{e['workflow_id']}: started on task queue {e.get('task_queue')}, where no process of the"
            " scenario was" for e in ours if e.get("ours") is False and e.get("task_queue") not in queues]
    for wid in per_id:
        m = _WORKFLOW_ID.match(wid)
        if m is None:
            continue  # the version-1 workflow type and other ids are not generations
        if int(m["gen"]) > generations.get(m["run"], 0):
            bad.append(f"{wid}: no such generation (run at {generations.get(m['run'])})")
    return Check(name, not bad, _summary(bad) or f"{len(per_id)} workflows", ("R-CREATE-5", "R-Q-5"),
                 judged=len(per_id))


def workflow_input_matches_its_run(history: Sequence[Event]) -> Check:
    """Every generation's workflow was started with its own run, generation and the run's
    ``deadline_at`` as Temporal recorded the input (R-EXEC-8, R-RESUME-1): a resume or an
    approval keeps the deadline, and a reused or stale input (another run's, an older
    generation's) is caught where the worker would act on it. Judges the version-2
    workflows of the listing whose input was read (``input``) and whose run is in the
    history; vacuous without them."""
    from datetime import datetime

    name = "each workflow started with its own run, generation and deadline_at"
    deadlines = {str(e["run_id"]): float(e["deadline_t"]) for e in _of(history, "run") if e.get("deadline_t")}
    bad, judged = [], 0
    for wf in _of(history, "workflow"):
        m = _WORKFLOW_ID.match(str(wf["workflow_id"]))
        given = wf.get("input")
        if m is None or not isinstance(given, dict) or m["run"] not in deadlines:
            continue
        judged += 1
        try:
            deadline = datetime.fromisoformat(str(given.get("deadline_at"))).timestamp()
        except ValueError:
            deadline = float("nan")
        if given.get("run_id") != m["run"] or int(given.get("generation") or 0) != int(m["gen"]):
            bad.append(f"{wf['workflow_id']}: input names run {given.get('run_id')} g{given.get('generation')}")
        if not abs(deadline - deadlines[m["run"]]) <= 0.001:
            bad.append(f"{wf['workflow_id']}: input deadline_at {given.get('deadline_at')}, the run's is "
                       f"{deadlines[m['run']]:.3f} (epoch s)")
    return Check(name, not bad, _summary(bad) or f"{judged} workflows", ("R-EXEC-8", "R-RESUME-1"),
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


#: Provider-call records are stamped by the database before the call, the synthetic
#: provider's own lines by the worker as the call begins: causally ordered on one host's
#: clock, so only rounding is allowed for (a record stamped after its call is a defect).
RECORD_CLOCK_SLACK_S = 0.001


def provider_calls_recorded(history: Sequence[Event]) -> Check:
    """Observed usage counts every provider call (R-Q34-2, R-Q-5), per durable run: each
    call the synthetic provider saw — by any attempt, also one that failed or died — has
    the owner's record (``provider_calls``) for the same generation, attempt and step,
    committed before the call; a record with an outcome (``succeeded``, ``failed``,
    ``cancelled``) is a call the provider saw (only a record with no outcome may lack
    one: its attempt died between the record and the call); and every terminal read of
    the run by a client reports ``usage.provider_calls`` equal to the calls recorded.
    A history with no synthetic-provider record at all (a scenario of another provider,
    which checks that provider's count itself) has only its reads checked. Legacy runs
    (``lifecycle_version`` 1) are not recorded and not checked."""
    name = "observed usage counts every provider call"
    reqs = ("R-Q34-2", "R-Q-5")
    durable = {str(e["run_id"]) for e in _of(history, "run") if int(e.get("lifecycle_version") or 2) >= 2}
    calls: dict[tuple[str, int, int, int], list[Event]] = defaultdict(list)
    for e in _of(history, "provider_call"):
        if str(e["run_id"]) in durable:
            calls[(str(e["run_id"]), int(e["generation"]), int(e["attempt"]), int(e["step"]))].append(e)
    records: dict[tuple[str, int, int, int], list[Event]] = defaultdict(list)
    for e in _of(history, "provider_call_record"):
        if str(e["run_id"]) in durable:
            records[(str(e["run_id"]), int(e["generation"]), int(e["attempt"]),
                     int(e["step"]))].append(e)
    # Without the synthetic provider's own record (a scenario of another provider, which
    # checks that provider's count itself) only the reads are compared with the record.
    observed = any(e.get("type") == "provider_call" for e in history)
    bad = []
    for key in sorted(set(calls) | set(records)) if observed else ():
        run, gen, attempt, step = key
        asked, recorded = sorted(calls.get(key, []), key=lambda e: e["t"]), records.get(key, [])
        settled = [r for r in recorded if r.get("status") != "started"]
        where = f"{run}: step {step} (g{gen} a{attempt})"
        if len(recorded) < len(asked):
            bad.append(f"{where} asked {len(asked)} times, recorded {len(recorded)}")
        elif len(settled) > len(asked):
            bad.append(f"{where} recorded with an outcome {len(settled)} times, asked {len(asked)}")
        elif asked and float(min(r["t"] for r in recorded)) > asked[0]["t"] + RECORD_CLOCK_SLACK_S:
            late = float(min(r["t"] for r in recorded)) - asked[0]["t"]
            bad.append(f"{where} recorded {late:.3f} s after it was asked")
    per_run = Counter(str(e["run_id"]) for e in _of(history, "provider_call_record"))
    by_run = _by_run(_of(history, "provider_call_record"))
    reads = 0
    for e in _of(history, "client"):
        usage = e.get("usage")
        if (e.get("op") != "read" or e.get("phase") != "ok" or e.get("state") not in TERMINAL
                or not isinstance(usage, dict) or str(e.get("run_id")) not in durable):
            continue
        reads += 1
        want = per_run.get(str(e["run_id"]), 0)
        if usage.get("provider_calls") != want:
            bad.append(f"{e['run_id']}: read reports provider_calls {usage.get('provider_calls')},"
                       f" {want} recorded")
        for count in ("input_tokens", "output_tokens"):
            total = token_total(by_run.get(str(e["run_id"]), []), count)
            if count in usage and usage[count] != total:
                bad.append(f"{e['run_id']}: read reports {count} {usage[count]}, the record's total is {total}"
                           " (None: a call that answered did not report it)")
    asked_n, recorded_n = sum(map(len, calls.values())), sum(map(len, records.values()))
    seen = f"{asked_n} calls asked" if observed else "no provider's own record of its calls"
    return Check(name, not bad, _summary(bad) or f"{seen}, {recorded_n} recorded, {reads} terminal reads",
                 reqs, judged=asked_n + recorded_n + reads)


def token_total(records: Sequence[Event], key: str) -> int | None:
    """A run's ``input_tokens`` or ``output_tokens`` by its provider-call record: None
    (unknown) once a call that answered (``succeeded``) did not report it, else the sum of
    what was reported (0 without calls). Unknown is never 0 (issue 25, item 9)."""
    if any(r.get("status") == "succeeded" and r.get(key) is None for r in records):
        return None
    return sum(int(r.get(key) or 0) for r in records)


#: How often the harness lets one step be asked of the provider: the documented default of
#: ``QIMPL_PROVIDER_MAX_FAILURES`` (5), which no catalog scenario raises (R-EXEC-12).
ASK_BOUND = 5
#: How many times in a row a run may be claimed by a new attempt with no checkpoint
#: committed in between before it is judged a crash loop (R-EXEC-12, R-EXEC-6).
CLAIMS_WITHOUT_PROGRESS = 12


def no_crash_loop(history: Sequence[Event]) -> Check:
    """Crash loops are judged, not left to end as a late ``expired`` (R-EXEC-12, R-EXEC-6):
    per durable run, no step was asked of the provider (the owners' own records, which
    are written before each call and count every attempt's ask) more than ``ASK_BOUND``
    times, or than the lowest ``QIMPL_PROVIDER_MAX_FAILURES`` a process of the history
    was started with (its ``process`` events), and no run was claimed by ``CLAIMS_WITHOUT_PROGRESS`` new attempts in a row
    without a checkpoint committed between two of them. Judges every durable run with
    a provider record or a claim."""
    name = "no crash loop: each step asked a bounded number of times, attempts make progress"
    bound = min([ASK_BOUND, *(int(e["settings"]["QIMPL_PROVIDER_MAX_FAILURES"]) for e in _of(history, "process")
                              if "QIMPL_PROVIDER_MAX_FAILURES" in (e.get("settings") or {}))])
    asks = Counter((str(e["run_id"]), int(e["step"])) for e in _of(history, "provider_call_record"))
    bad = [f"{run}: step {step} asked {n} times (bound {bound})"
           for (run, step), n in sorted(asks.items()) if n > bound]
    checkpoints = _by_run(_of(history, "checkpoint"))
    judged = {run for run, _ in asks}
    for run, evs in _by_run(_of(history, "transition")).items():
        done = sorted(int(c["row_version"]) for c in checkpoints.get(run, []))
        streak, owner = 0, None
        for e in sorted(evs, key=lambda e: int(e["row_version"])):
            attempt = (e.get("generation"), e.get("owner_attempt"))
            if e.get("owner_attempt") is not None and attempt != owner:
                judged.add(run)
                streak += 1
                if streak > CLAIMS_WITHOUT_PROGRESS:
                    bad.append(f"{run}: {streak} attempts claimed it in a row without a checkpoint"
                               f" (up to v{e['row_version']})")
                    break
            owner = attempt if e.get("owner_attempt") is not None else owner
            if int(e["row_version"]) in done:
                streak = 0
    return Check(name, not bad, _summary(bad) or f"{len(judged)} runs", ("R-EXEC-12", "R-EXEC-6"),
                 judged=len(judged))


SLOT_STATES = frozenset({"running", "awaiting_approval"})


def slot_holders(history: Sequence[Event]) -> int:
    """The most runs of one tenant ever holding a slot (``running`` or
    ``awaiting_approval``) at once, replaying transitions in the database's commit order:
    by commit time (``commit_t``, PostgreSQL's ``track_commit_timestamp``), then by insert
    order (``id``). A transition's id is taken when its row is inserted, not when it
    commits, so two runs' writes can commit in the other order than their ids; without
    commit times (a stack that does not track them) the ids are the order used."""
    tenant_of = {str(e["run_id"]): e.get("tenant_id", "") for e in _of(history, "run")}
    holding: dict[str, set[str]] = defaultdict(set)
    most = 0
    transitions = _of(history, "transition")
    timed = all(e.get("commit_t") is not None for e in transitions)
    ordered = sorted(transitions, key=lambda e: (float(e["commit_t"]) if timed else 0.0, int(e.get("id", 0))))
    for e in ordered:
        run = str(e["run_id"])
        held = holding[tenant_of.get(run, "")]
        if e["new_state"] in SLOT_STATES:
            held.add(run)
        else:
            held.discard(run)
        most = max(most, len(held))
    return most


def slot_limit_respected(limit: int) -> Callable[[Sequence[Event]], Check]:
    """A checker: no tenant ever had more than ``limit`` slot holders (R-EXEC-9)."""

    def check(history: Sequence[Event]) -> Check:
        most = slot_holders(history)
        held = {str(e["run_id"]) for e in _of(history, "transition") if e["new_state"] in SLOT_STATES}
        return Check(f"at most {limit} slot holders per tenant", most <= limit,
                     f"max {most} at once ({len(held)} runs held a slot)", ("R-EXEC-9",), judged=len(held))

    check.__name__ = "slot_limit_respected"
    return check


GENERIC_CHECKERS: tuple[Callable[[Sequence[Event]], Check], ...] = (
    one_terminal_state,
    row_version_strictly_increasing,
    no_write_after_terminal,
    no_step_repeated_after_checkpoint,
    checkpoints_one_per_step,
    state_restored_at_every_step,
    no_write_by_a_superseded_attempt,
    every_write_by_its_owner,
    deadline_respected,
    stream_events_consistent,
    event_journal_matches_run_record,
    usage_events_match_the_record,
    writes_committed_whole,
    event_prunes_bounded,
    no_side_effect_repeated,
    no_execution_without_intent,
    no_unapproved_effect,
    journal_matches_run_record,
    deadline_from_acceptance,
    one_workflow_per_generation,
    workflow_input_matches_its_run,
    provider_calls_recorded,
    no_crash_loop,
)


def run_checks(
    history: Sequence[Event], checkers: Iterable[Callable[[Sequence[Event]], Check]]
) -> list[Check]:
    """Run each checker; one that raises gives ``ok=None`` (verdict ``unknown``), never green."""
    out = []
    for checker in checkers:
        try:
            out.append(checker(history))
        except Exception as exc:  # noqa: BLE001 - attached to the report as unknown
            out.append(Check(getattr(checker, "__name__", "checker"), None,
                             f"checker raised {type(exc).__name__}: {exc}"))
    return out
