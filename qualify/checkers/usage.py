"""Checkers of observed usage (R-Q34-2): every provider call recorded, usage events against
the record."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Sequence

from qualify.checkers._base import TERMINAL, Check, _by_run, _of, _summary
from qualify.history import Event

__all__ = ["RECORD_CLOCK_SLACK_S", "provider_calls_recorded", "token_total", "usage_events_match_the_record"]


def usage_events_match_the_record(history: Sequence[Event]) -> Check:
    """Every settled provider call (the provider-call record) has exactly one ``usage``
    event in its run's journal, with its attempt, step, status and token counts (None for a
    count the provider did not report, on both sides), and every usage event
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
    want = Counter((str(r["run_id"]), int(r["attempt"]), int(r["step"]), r["status"],
                    _tokens(r, "input_tokens"), _tokens(r, "output_tokens"))
                   for r in records if str(r["run_id"]) not in pruned)
    got = Counter((str(e["run_id"]), int(e["attempt"]), int(e["step"]), e["status"],
                   _tokens(e, "input_tokens"), _tokens(e, "output_tokens")) for e in events)
    bad = [f"{k[0]}: call a{k[1]} step {k[2]} {k[3]}: {got[k]} usage events for {want[k]} settled "
           f"(tokens in {k[4]}, out {k[5]})" for k in sorted(set(want) | set(got), key=str) if want[k] != got[k]]
    for run, evs in _by_run(events).items():
        totals = [int(e["total_calls"]) for e in sorted(evs, key=lambda e: int(e["seq"]))]
        if any(b < a for a, b in itertools.pairwise(totals)) or (
                totals and totals[-1] < len(evs)):
            bad.append(f"{run}: running totals {totals[:10]} for {len(evs)} usage events")
    return Check(name, not bad, _summary(bad) or f"{sum(want.values())} settled calls",
                 ("R-EVENT-1", "R-Q34-2"), judged=sum(want.values()))  # settled calls, each paired


def _tokens(event: Event, field: str) -> int | None:
    """A token count of a record or a usage event: an int, or None when not reported (an
    event collected before the counts were, has none: None too)."""
    value = event.get(field)
    return None if value is None else int(value)


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
                 reqs, judged=max(asked_n, recorded_n))  # provider calls (the reads are extra evidence)


def token_total(records: Sequence[Event], key: str) -> int | None:
    """A run's ``input_tokens`` or ``output_tokens`` by its provider-call record: None
    (unknown) once a call that answered (``succeeded``) did not report it, else the sum of
    what was reported (0 without calls). Unknown is never 0 (issue 25, item 9)."""
    if any(r.get("status") == "succeeded" and r.get(key) is None for r in records):
        return None
    return sum(int(r.get(key) or 0) for r in records)
