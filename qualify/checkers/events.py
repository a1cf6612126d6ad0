"""Checkers of the event journal and its streams (R-EVENT-1..5): the stream against the
journal, the journal against the run record, writes committed whole, pruning bounded."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Sequence

from qualify.checkers._base import TERMINAL, Check, _of, _summary
from qualify.history import Event

__all__ = [
    "event_journal_matches_run_record",
    "event_prunes_bounded",
    "stream_events_consistent",
    "writes_committed_whole",
]


def _event_journal(history: Sequence[Event]) -> dict[str, dict[int, str | None]]:
    """Per run, the event ids a stream may deliver and their kinds: the event journal's
    ``seq -> kind`` (``run_event``), or for a history without the event journal (an older
    schema) the ids of the transition audit (``run_transitions``), kinds unknown."""
    journal: dict[str, dict[int, str | None]] = defaultdict(dict)
    events = _of(history, "run_event")
    if events:
        for e in events:
            journal[str(e["run_id"])][int(e["seq"])] = str(e["kind"])
    else:
        for t in _of(history, "transition"):
            journal[str(t["run_id"])][int(t["id"])] = None
    return journal


#: How long after its run's terminal commit (database clock) a stream the server ended
#: (harness clock) is owed the terminal event: none, the two clocks are one machine's and
#: a server ending a stream on the terminal commit ends it after that commit.
STREAM_END_SLACK_S = 0.0


def stream_events_consistent(history: Sequence[Event]) -> Check:
    """Events delivered to stream clients (R-EVENT-2/3), per run and client: ids strictly increasing
    (no duplicate across reconnects), each one an event the journal recorded, of the
    journal's kind, and — for a stream read to its end — every journal event delivered (every
    one after the ``Last-Event-ID`` the client first opened with, ``stream_open``) and the
    last event ``terminal`` with the run's final state; a stream the server ended
    (``stream_end``) after its run's terminal commit delivered that terminal event. A pruned run's journal is gone
    (R-EVENT-5): only the order of what was delivered is checked."""
    name = "stream events complete, ordered and ending in the run's terminal state"
    finals = {str(e["run_id"]): e["state"] for e in _of(history, "run")}
    journal = _event_journal(history)
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
    # A stream the server ended (``stream_end``) after its run's terminal commit must
    # have delivered that terminal event to its client: a stream that closes instead of
    # sending it ends in no terminal state at all.
    ended_at: dict[str, float] = {}
    for e in _of(history, "transition"):
        if e.get("new_state") in TERMINAL:
            ended_at.setdefault(str(e["run_id"]), float(e["t"]))
    ends = [e for e in _of(history, "stream_end") if str(e["run_id"]) not in pruned]
    for e in ends:
        run, client = str(e["run_id"]), str(e.get("client", ""))
        if run not in ended_at or float(e["t"]) < ended_at[run] + STREAM_END_SLACK_S:
            continue
        if not any(s["event"] == "terminal" for s in by_client.get((run, client), [])):
            bad.append(f"{run}: client {client or '-'}'s stream was ended by {e.get('process')}"
                       f" {float(e['t']) - ended_at[run]:.3f} s after the run ended, without its terminal event")
    return Check(name, not bad, _summary(bad) or f"{len(by_client)} stream clients", ("R-EVENT-2", "R-EVENT-3"),
                 judged=len(by_client) + len(ends))


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
