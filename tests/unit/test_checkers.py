"""Every checker on a good history and on a bad one it must catch (R-Q-5)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from qualify import checkers as ck
from qualify.history import merge

R = "run-1"


def tr(v: int, old: str | None, new: str, t: float, step: int = 0) -> dict[str, Any]:
    return {"type": "transition", "run_id": R, "row_version": v, "old_state": old, "new_state": new,
            "generation": 1, "owner_attempt": 1, "checkpoint_step": step, "id": v, "t": t}


def cp(step: int, v: int, t: float) -> dict[str, Any]:
    return {"type": "checkpoint", "run_id": R, "step": step, "row_version": v, "t": t}


def call(step: int, t: float, attempt: int = 1) -> dict[str, Any]:
    return {"type": "provider_call", "run_id": R, "step": step, "attempt": attempt, "generation": 1,
            "t": t}


def rec(step: int, t: float, attempt: int = 1, status: str = "succeeded") -> dict[str, Any]:
    """The owner's record of a provider call, committed before it (R-Q34-2)."""
    return {"type": "provider_call_record", "run_id": R, "step": step, "attempt": attempt,
            "generation": 1, "status": status, "t": t}


def good() -> list[dict[str, Any]]:
    return merge([
        {"type": "run", "run_id": R, "t": 0.9, "deadline_t": 100.0, "state": "completed",
         "row_version": 8, "generation": 1},
        {"type": "client", "op": "create", "phase": "ok", "run_id": R, "t": 0.5},
        tr(1, None, "accepted", 1), tr(2, "accepted", "queued", 2), tr(3, "queued", "running", 3),
        rec(1, 3.05), call(1, 3.1), tr(4, "running", "running", 4, 1), cp(1, 4, 4),
        rec(2, 4.05), call(2, 4.1), tr(5, "running", "running", 5, 2), cp(2, 5, 5),
        # attempt 2 after a crash: step 3 may be asked again (it was never checkpointed)
        rec(3, 5.05, status="started"), call(3, 5.1), rec(3, 6.05, attempt=2), call(3, 6.1, attempt=2),
        tr(6, "running", "running", 6.5, 2),
        tr(7, "running", "running", 7, 3), cp(3, 7, 7), tr(8, "running", "completed", 8, 3),
    ])


@pytest.mark.parametrize("checker", ck.GENERIC_CHECKERS)
def test_good_history_passes(checker) -> None:  # type: ignore[no-untyped-def]
    result = checker(good())
    assert result.ok is True, result.detail


@pytest.mark.req("R-STATE-1")
def test_catches_two_terminal_transitions() -> None:
    h = [*good(), tr(9, "completed", "cancelled", 9, 3)]
    assert ck.one_terminal_state(h).ok is False


@pytest.mark.req("R-Q-5")
def test_catches_a_run_that_never_ends() -> None:
    h = [e for e in good() if e.get("new_state") != "completed"]
    assert ck.every_run_ended(h).ok is False


@pytest.mark.req("R-Q-5")
def test_catches_an_accepted_run_with_no_transitions() -> None:
    h = [*good(), {"type": "client", "op": "create", "phase": "ok", "run_id": "run-2", "t": 9}]
    assert ck.every_run_ended(h).ok is False


@pytest.mark.req("R-Q-12")
def test_the_terminal_state_check_restates_the_guard_and_the_liveness_one_does_not() -> None:
    assert ck.one_terminal_state(good()).restates == "QG001"
    assert ck.every_run_ended(good()).restates == "" and ck.every_run_ended(good()).requirements == ("R-Q-5",)


@pytest.mark.req("R-EXEC-3")
def test_catches_row_version_going_back() -> None:
    h = good()
    h[-1] = {**h[-1], "row_version": 7}
    assert ck.row_version_strictly_increasing(h).ok is False


@pytest.mark.req("R-EXEC-7")
def test_catches_a_write_after_terminal() -> None:
    h = [*good(), tr(9, "completed", "running", 9, 4)]
    assert ck.no_write_after_terminal(h).ok is False
    h2 = [*good(), cp(4, 9, 9)]
    assert ck.no_write_after_terminal(h2).ok is False


@pytest.mark.req("R-EXEC-4")
def test_catches_a_step_asked_again_after_its_checkpoint() -> None:
    h = merge(good(), [call(2, 6.2, attempt=2)])
    result = ck.no_step_repeated_after_checkpoint(h)
    assert result.ok is False and "step 2" in result.detail


@pytest.mark.req("R-EXEC-3")
def test_catches_a_duplicate_or_missing_checkpoint() -> None:
    assert ck.checkpoints_one_per_step([*good(), cp(3, 8, 8)]).ok is False
    assert ck.checkpoints_one_per_step([e for e in good() if not (e["type"] == "checkpoint" and e["step"] == 2)]).ok is False


def test_a_raising_checker_is_unknown_never_green() -> None:
    def broken(history):  # type: ignore[no-untyped-def]
        raise KeyError("boom")

    (result,) = ck.run_checks(good(), [broken])
    assert result.ok is None and "KeyError" in result.detail


@pytest.mark.req("R-EXEC-7")
def test_catches_a_zombie_write_after_takeover() -> None:
    h = merge(good(), [{**tr(9, "running", "running", 7.5, 3), "owner_attempt": 1, "id": 6.7}])
    h = [e if not (e["type"] == "transition" and e["row_version"] in (6, 7, 8)) else {**e, "owner_attempt": 2} for e in h]
    result = ck.no_write_by_a_superseded_attempt(h)
    assert result.ok is False and "attempt 1" in result.detail


def se(event_id: int, event: str, state: str, t: float) -> dict[str, Any]:
    return {"type": "stream_event", "run_id": R, "event_id": event_id, "event": event,
            "state": state, "t": t}


@pytest.mark.req("R-EVENT-3")
def test_stream_checker() -> None:
    full = [se(i, "state", "x", 10 + i) for i in range(1, 8)] + [se(8, "terminal", "completed", 20)]
    assert ck.stream_events_consistent(merge(good(), full)).ok is True
    assert ck.stream_events_consistent(merge(good(), full[:3])).ok is True  # a partial read proves nothing wrong
    gap = [e for e in full if e["event_id"] != 5]
    assert ck.stream_events_consistent(merge(good(), gap)).ok is False
    dup = [*full[:3], se(3, "state", "x", 13.5), *full[3:]]
    assert ck.stream_events_consistent(merge(good(), dup)).ok is False
    wrong_end = [*full[:-1], se(8, "terminal", "cancelled", 20)]
    assert ck.stream_events_consistent(merge(good(), wrong_end)).ok is False



@pytest.mark.req("R-EVENT-3")
def test_a_stream_the_server_ended_after_the_run_without_its_terminal_event_is_caught() -> None:
    full = [se(i, "state", "x", 10 + i) for i in range(1, 8)] + [se(8, "terminal", "completed", 20)]
    end = {"type": "stream_end", "run_id": R, "client": "", "process": "api-1", "events": 7, "t": 21.0}
    assert ck.stream_events_consistent(merge(good(), [*full, end])).ok is True
    check = ck.stream_events_consistent(merge(good(), [*full[:-1], end]))
    assert check.ok is False and "without its terminal event" in check.detail, check
    # ended before the run did (its deadline for streams, a read failing): nothing owed
    early = {**end, "t": 7.9}
    assert ck.stream_events_consistent(merge(good(), [*full[:3], early])).ok is True


@pytest.mark.req("R-EVENT-2")
def test_a_stream_opened_after_an_id_owes_only_the_events_after_it() -> None:
    full = [se(i, "state", "x", 10 + i) for i in range(1, 8)] + [se(8, "terminal", "completed", 20)]
    opened = {"type": "stream_open", "run_id": R, "client": "", "after": 4, "t": 10.0}
    assert ck.stream_events_consistent(merge(good(), [opened, *full[4:]])).ok is True
    missing_one = [e for e in full[4:] if e["event_id"] != 6]
    assert ck.stream_events_consistent(merge(good(), [opened, *missing_one])).ok is False
    # Without its stream_open the same tail is an incomplete stream.
    assert ck.stream_events_consistent(merge(good(), full[4:])).ok is False
    # Where a client begins is its first open: a later reconnect does not excuse a gap.
    later = {**opened, "after": 6, "t": 15.5}
    early = {**opened, "after": 2}
    gap = [e for e in full[2:] if e["event_id"] != 5]
    assert ck.stream_events_consistent(merge(good(), [early, later, *gap])).ok is False


def ev(seq: int, kind: str, v: int, state: str = "running") -> dict[str, Any]:
    return {"type": "run_event", "run_id": R, "seq": seq, "kind": kind, "row_version": v,
            "state": state, "generation": 1, "t": 10.0 + seq}


def journal() -> list[dict[str, Any]]:
    # v6 is a write with no checkpoint by the same attempt (a counted failure).
    kinds = ["state", "state", "state", "checkpoint", "checkpoint", "failure", "checkpoint"]
    return [*(ev(v, k, v) for v, k in enumerate(kinds, start=1)), ev(8, "output", 7),
            ev(9, "terminal", 8, "completed")]


@pytest.mark.req("R-EVENT-1")
@pytest.mark.req("R-EVENT-3")
@pytest.mark.req("R-Q-5")
def test_journal_checker_catches_a_missing_repeated_or_wrong_last_event() -> None:
    assert ck.event_journal_matches_run_record(merge(good(), journal())).ok is True
    assert "no event journal" in ck.event_journal_matches_run_record(good()).detail
    j = journal()
    missing = [e for e in j if e["seq"] != 5]
    assert ck.event_journal_matches_run_record(merge(good(), missing)).ok is False
    renumbered = [{**e, "seq": i} for i, e in enumerate(missing, start=1)]
    result = ck.event_journal_matches_run_record(merge(good(), renumbered))
    assert result.ok is False and "no event" in result.detail
    repeated = [*j[:5], {**j[4], "seq": 6}, *({**e, "seq": e["seq"] + 1} for e in j[5:])]
    assert ck.event_journal_matches_run_record(merge(good(), repeated)).ok is False
    wrong_end = [*j[:-1], ev(9, "terminal", 8, "cancelled")]
    result = ck.event_journal_matches_run_record(merge(good(), wrong_end))
    assert result.ok is False and "terminal event cancelled" in result.detail
    no_end = j[:-1]
    result = ck.event_journal_matches_run_record(merge(good(), no_end))
    assert result.ok is False and "last event output" in result.detail
    inv = {"type": "tool_invocation", "run_id": R, "call_id": "c1", "intent_row_version": 5,
           "outcome_row_version": 6, "t": 5.0}
    tooled = [ev(5, "tool_call", 5) if e["seq"] == 5 else ev(6, "tool_result", 6) if e["seq"] == 6 else e
              for e in j]
    assert ck.event_journal_matches_run_record(merge(good(), tooled, [inv])).ok is True
    result = ck.event_journal_matches_run_record(merge(good(), j, [inv]))
    assert result.ok is False and "call c1 at v5 is a checkpoint event, not tool_call" in result.detail
    # A write with no checkpoint journaled as a checkpoint (issue 22, item 5), and a
    # takeover (another attempt at v6) journaled as anything but a claim.
    as_checkpoint = [ev(6, "checkpoint", 6) if e["seq"] == 6 else e for e in j]
    result = ck.event_journal_matches_run_record(merge(good(), as_checkpoint))
    assert result.ok is False and "checkpoint event at v6, where no checkpoint was committed" in result.detail
    taken = [{**e, "owner_attempt": 2} if e.get("type") == "transition" and e["row_version"] >= 6 else e
             for e in good()]
    result = ck.event_journal_matches_run_record(merge(taken, j))
    assert result.ok is False and "the takeover at v6 is a failure event, not a claim" in result.detail
    claimed = [ev(6, "claim", 6) if e["seq"] == 6 else e for e in j]
    assert ck.event_journal_matches_run_record(merge(taken, claimed)).ok is True
    pruned = [{"type": "event_prune", "run_id": R, "tenant_id": "t", "pruned_by": "r", "events": 9, "t": 30}]
    assert ck.event_journal_matches_run_record(merge(good(), [ev(1, "state", 1), *pruned])).ok is True


@pytest.mark.req("R-EVENT-3")
def test_stream_checker_compares_kinds_with_the_journal() -> None:
    delivered = [se(e["seq"], e["kind"], e["state"], 20 + e["seq"]) for e in journal()]
    assert ck.stream_events_consistent(merge(good(), journal(), delivered)).ok is True
    relabelled = [{**e, "event": "state"} if e["event_id"] == 8 else e for e in delivered]
    assert ck.stream_events_consistent(merge(good(), journal(), relabelled)).ok is False
    assert ck.stream_events_consistent(merge(good(), journal(), delivered[:-2] + delivered[-1:])).ok is False
    two = [{**e, "client": c, "t": e["t"] + d} for e in delivered for c, d in (("a", 0.0), ("b", 0.5))]
    assert ck.stream_events_consistent(merge(good(), journal(), two)).ok is True
    b_missing = [e for e in two if not (e["client"] == "b" and e["event_id"] == 3)]
    result = ck.stream_events_consistent(merge(good(), journal(), b_missing))
    assert result.ok is False and "incomplete" in result.detail


def prune(run: str, tenant: str, who: str, t: float) -> dict[str, Any]:
    return {"type": "event_prune", "run_id": run, "tenant_id": tenant, "pruned_by": who,
            "events": 3, "t": t}


@pytest.mark.req("R-EVENT-5")
@pytest.mark.req("R-OPS-3")
def test_prune_checker_catches_more_than_100_per_sweep_and_a_live_run() -> None:
    def runs(n: int, state: str = "cancelled") -> list[dict[str, Any]]:
        return [{"type": "run", "run_id": f"r{i}", "state": state, "t": 1.0} for i in range(n)]

    assert "nothing pruned" in ck.event_prunes_bounded(runs(3)).detail
    hundred = [prune(f"r{i}", "t", "rec-1", 50.0) for i in range(100)]
    other = [prune(f"r{i}", "t", "rec-2", 50.0) for i in range(100, 150)]
    assert ck.event_prunes_bounded(merge(runs(150), hundred, other)).ok is True
    over = [prune(f"r{i}", "t", "rec-1", 50.0) for i in range(101)]
    result = ck.event_prunes_bounded(merge(runs(101), over))
    assert result.ok is False and "101 streams" in result.detail
    live = ck.event_prunes_bounded(merge(runs(1, "running"), [prune("r0", "t", "rec-1", 5.0)]))
    assert live.ok is False and "pruned while running" in live.detail
    kept = [{"type": "run_event", "run_id": "r0", "seq": 1, "kind": "state", "t": 60.0}]
    assert ck.event_prunes_bounded(merge(runs(1), [prune("r0", "t", "rec-1", 5.0)], kept)).ok is False


@pytest.mark.req("R-EXEC-9")
def test_slot_holders_counts_overlap_in_commit_order() -> None:
    def t(i: int, run: str, new: str) -> dict[str, Any]:
        return {"type": "transition", "run_id": run, "new_state": new, "id": i, "t": float(i)}

    runs = [{"type": "run", "run_id": r, "tenant_id": "t1", "t": 0.0} for r in "abc"]
    ok = [*runs, t(1, "a", "running"), t(2, "b", "running"), t(3, "a", "completed"),
          t(4, "c", "running"), t(5, "b", "awaiting_approval"), t(6, "b", "cancelled")]
    assert ck.slot_holders(ok) == 2 and ck.slot_limit_respected(2)(ok).ok is True
    bad = [*ok, t(7, "a", "running"), t(8, "b", "running"), t(9, "c", "running")]
    assert ck.slot_limit_respected(2)(bad).ok is False



@pytest.mark.req("R-EXEC-9")
def test_slot_holders_replay_commit_times_not_insert_ids() -> None:
    def t(i: int, run: str, new: str, commit: float | None) -> dict[str, Any]:
        return {"type": "transition", "run_id": run, "new_state": new, "id": i, "t": float(i), "commit_t": commit}

    runs = [{"type": "run", "run_id": r, "tenant_id": "t1", "t": 0.0} for r in "ab"]
    # a leaves its slot in the transaction that took id 2, b claims in id 3; b committed first:
    # for a moment both held a slot, which the ids alone would hide.
    history = [*runs, t(1, "a", "running", 1.0), t(2, "a", "completed", 3.5), t(3, "b", "running", 3.0)]
    assert ck.slot_holders(history) == 2
    assert ck.slot_holders([{k: v for k, v in e.items() if k != "commit_t"} for e in history]) == 1
    # One write without a commit time (tracking was off for it): the ids are the order.
    partial = [*history[:-1], t(3, "b", "running", None)]
    assert ck.slot_holders(partial) == 1


@pytest.mark.req("R-EXEC-8")
def test_catches_progress_after_the_deadline() -> None:
    def with_deadline(t: float) -> list[dict[str, Any]]:
        return [{**e, "deadline_t": t} if e["type"] == "run" else e for e in good()]

    assert ck.deadline_respected(with_deadline(6.0)).ok is False  # checkpoint 3 at t=7
    late_call = merge(with_deadline(100.0), [call(4, 100.2)])
    assert ck.deadline_respected(late_call).ok is False
    expired = [*with_deadline(7.5)[:-1], tr(8, "running", "expired", 8, 3)]
    assert ck.deadline_respected(expired).ok is True


@pytest.mark.req("R-EXEC-8")
def test_catches_a_provider_call_left_running_past_the_deadline() -> None:
    def ended(at: float, how: str) -> dict[str, Any]:
        return {"type": "provider_call_end", "run_id": R, "step": 3, "attempt": 1, "how": how, "t": at}

    expired = [*[{**e, "deadline_t": 7.5} if e["type"] == "run" else e for e in good()][:-1],
               tr(8, "running", "expired", 8, 3)]
    # Asked before the deadline (t=7), cancelled 0.1 s after it: what the owner does.
    cancelled = ck.deadline_respected(merge(expired, [ended(7.6, "cancelled")]))
    assert cancelled.ok is True and cancelled.judged >= 2
    # Left running: its end comes when the provider answers, 2 s past the deadline.
    ran_on = ck.deadline_respected(merge(expired, [ended(9.5, "answered")]))
    assert ran_on.ok is False and "ran until 2.000 s after the deadline (answered)" in ran_on.detail


@pytest.mark.req("R-EXEC-12")
def test_catches_an_expiry_before_the_deadline() -> None:
    def with_deadline(t: float) -> list[dict[str, Any]]:
        return [{**e, "deadline_t": t} if e["type"] == "run" else e for e in good()]

    early = [*with_deadline(100.0)[:-1], tr(8, "running", "expired", 8, 3)]
    check = ck.deadline_respected(early)
    assert check.ok is False and "before its deadline" in check.detail


def usage_ev(seq: int, step: int, attempt: int, total: int) -> dict[str, Any]:
    return {**ev(seq, "usage", 3 + step), "attempt": attempt, "step": step, "status": "succeeded",
            "total_calls": total}


@pytest.mark.req("R-EVENT-1")
@pytest.mark.req("R-Q34-2")
def test_usage_events_one_per_settled_call() -> None:
    settled = [usage_ev(20, 1, 1, 1), usage_ev(21, 2, 1, 2), usage_ev(22, 3, 2, 4)]
    assert ck.usage_events_match_the_record(merge(good(), journal(), settled)).ok is True
    missing = ck.usage_events_match_the_record(merge(good(), journal(), settled[:2]))
    assert missing.ok is False and "a2 step 3 succeeded: 0 usage events for 1 settled" in missing.detail
    twice = ck.usage_events_match_the_record(merge(good(), journal(), settled, [usage_ev(23, 1, 1, 4)]))
    assert twice.ok is False and "2 usage events for 1 settled" in twice.detail
    shrinking = [usage_ev(20, 1, 1, 2), usage_ev(21, 2, 1, 1), usage_ev(22, 3, 2, 4)]
    assert ck.usage_events_match_the_record(merge(good(), journal(), shrinking)).ok is False
    # The event's token counts are the call's (a trigger that wrote the output count as the
    # input count passed when only the call's identity was compared).
    swapped = [usage_ev(20, 1, 1, 1), {**usage_ev(21, 2, 1, 2), "input_tokens": 5}, usage_ev(22, 3, 2, 4)]
    wrong = ck.usage_events_match_the_record(merge(good(), journal(), swapped))
    assert wrong.ok is False and "(tokens in 5, out None)" in wrong.detail


def stamped() -> list[dict[str, Any]]:
    """``good()`` with every database row stamped with its writing transaction (one per
    write, ``x<row_version>``), its journal, a tool call at v5 (intent) and v6 (outcome),
    and the usage event of a settled provider call."""
    h = [{**e, "xact_id": f"x{e['row_version']}"} if e["type"] in ("transition", "checkpoint") else e
         for e in good()]
    events = [{**e, "xact_id": f"x{e['row_version']}"} for e in journal()]
    output = {**ev(30, "output", 7), "text_chars": 5, "xact_id": "x7"}
    delta = {**ev(31, "output", 6), "text_chars": None, "xact_id": "x99"}  # streamed: its own
    tool = {"type": "tool_invocation", "run_id": R, "call_id": "c1", "status": "succeeded",
            "intent_row_version": 5, "outcome_row_version": 6, "settled_by": "worker",
            "intent_xact": "x5", "outcome_xact": "x6", "t": 5}
    settled = [{**e, "ended_xact": "s1"} if e["type"] == "provider_call_record" and e["step"] == 1 else e
               for e in h]
    usage = {**usage_ev(40, 1, 1, 1), "xact_id": "s1"}
    return merge(settled, events, [output, delta, tool, usage])


@pytest.mark.req("R-EXEC-3")
@pytest.mark.req("R-EVENT-1")
@pytest.mark.req("R-Q-5")
def test_catches_a_checkpoint_committed_apart_from_its_row_version_bump() -> None:
    assert ck.writes_committed_whole(good()).detail == "no row stamped with its transaction"
    ok = ck.writes_committed_whole(stamped())
    assert ok.ok is True, ok.detail
    assert ok.requirements == ("R-EXEC-3", "R-EXEC-7", "R-EVENT-1", "R-Q-5")

    def split(h: list[dict[str, Any]], type_: str, kind: str | None = None,
              **changes: Any) -> list[dict[str, Any]]:
        hit = [i for i, e in enumerate(h) if e["type"] == type_ and kind in (None, e.get("kind"))][-1]
        return [{**e, **changes} if i == hit else e for i, e in enumerate(h)]

    # The checkpoint of step 3 committed on its own, just before its fenced update.
    apart = ck.writes_committed_whole(split(stamped(), "checkpoint", xact_id="x6b"))
    assert apart.ok is False
    assert f"{R}: checkpoint 3 committed in transaction x6b, its write to v7 in x7" in apart.detail
    # ... and the update never committed (the owner died between the two).
    orphan = [e for e in split(stamped(), "checkpoint", xact_id="x6b")
              if not (e["type"] == "transition" and e["row_version"] == 7)]
    assert "checkpoint 3 committed (transaction x6b) for v7, a row version the run never had" in (
        ck.writes_committed_whole(orphan).detail)
    # The final state's event committed apart from the final state.
    terminal = ck.writes_committed_whole(split(stamped(), "run_event", "terminal", xact_id="late"))
    assert terminal.ok is False and "terminal event 9 committed in transaction late, its write to v8 in x8" in (
        terminal.detail)
    # A tool intent or outcome, a usage event apart from their writes.
    intent = ck.writes_committed_whole(split(stamped(), "tool_invocation", intent_xact="x4"))
    assert intent.ok is False and "call c1's intent committed in transaction x4, its write to v5 in x5" in intent.detail
    outcome = ck.writes_committed_whole(split(stamped(), "tool_invocation", outcome_xact="x5b"))
    assert outcome.ok is False and "call c1 outcome succeeded committed in transaction x5b" in outcome.detail
    usage = ck.writes_committed_whole(split(stamped(), "run_event", "usage", xact_id="s2"))
    assert usage.ok is False and "which settled no such provider call" in usage.detail
    # Rows of writes that predate the stamps are not judged.
    old = [{**e, "xact_id": None} if e["type"] == "transition" else e for e in split(stamped(), "checkpoint", xact_id="y")]
    assert ck.writes_committed_whole(old).ok is True


@pytest.mark.req("R-EXEC-12")
def test_catches_a_step_asked_more_than_the_bound() -> None:
    history = good() + [rec(2, 4.0 + i, attempt=i + 2, status="started") for i in range(ck.ASK_BOUND)]
    check = ck.no_crash_loop(history)
    assert check.ok is False and "step 2 asked" in check.detail, check
    assert ck.no_crash_loop([*good(), rec(2, 4.0, attempt=2)]).ok is True


@pytest.mark.req("R-EXEC-12", "R-EXEC-6")
def test_catches_attempts_that_claim_again_and_again_without_progress() -> None:
    def claim(v: int, attempt: int) -> dict[str, Any]:
        return {**tr(v, "running", "running", 10 + v), "owner_attempt": attempt}

    n = ck.CLAIMS_WITHOUT_PROGRESS
    loop = [tr(1, None, "accepted", 1), tr(2, "accepted", "queued", 2), tr(3, "queued", "running", 3)]
    loop += [claim(4 + i, 2 + i) for i in range(n + 1)]
    check = ck.no_crash_loop(loop)
    assert check.ok is False and "in a row without a checkpoint" in check.detail, check
    # The same claims with a checkpoint committed every few of them are progress.
    progress = loop + [cp(i, 4 + 3 * i, 20.0) for i in range(1, n // 3 + 1)]
    assert ck.no_crash_loop(progress).ok is True


@pytest.mark.req("R-EXEC-12")
def test_the_ask_bound_is_the_lowest_a_process_was_started_with() -> None:
    lowered = [{"type": "process", "name": "worker-1", "kind": "worker", "t": 0.1,
                "settings": {"QIMPL_PROVIDER_MAX_FAILURES": "2"}}]
    history = good() + lowered + [rec(2, 4.0 + i, attempt=i + 2, status="started") for i in range(2)]
    check = ck.no_crash_loop(history)
    assert check.ok is False and "(bound 2)" in check.detail, check


@pytest.mark.req("R-CREATE-5")
def test_catches_a_workflow_of_a_run_on_another_task_queue() -> None:
    wf = {"type": "workflow", "workflow_id": f"agent-run-{'1' * 8}-1111-1111-1111-{'1' * 12}-g1",
          "task_queue": "elsewhere", "ours": False, "t": 1.0}
    run = {"type": "run", "run_id": f"{'1' * 8}-1111-1111-1111-{'1' * 12}", "generation": 1, "t": 0.5,
           "state": "completed", "row_version": 5, "deadline_t": 100.0}
    check = ck.one_workflow_per_generation([run, wf])
    assert check.ok is False and "task queue elsewhere" in check.detail, check
    moved = {"type": "process", "name": "api-2", "kind": "api", "t": 0.1, "settings": {"QIMPL_TASK_QUEUE": "elsewhere"}}
    assert ck.one_workflow_per_generation([run, wf, moved]).ok is True
    stranger = {**wf, "workflow_id": "someone-else", "task_queue": "other"}
    assert ck.one_workflow_per_generation([run, stranger]).judged == 0  # not the scenario's: not judged


@pytest.mark.req("R-CREATE-5")
def test_catches_a_second_execution_of_a_generation_under_another_id() -> None:
    run_id = f"{'1' * 8}-1111-1111-1111-{'1' * 12}"
    run = {"type": "run", "run_id": run_id, "generation": 1, "t": 0.5, "state": "completed",
           "row_version": 5, "deadline_t": 100.0}
    given = {"run_id": run_id, "generation": 1, "deadline_at": "1970-01-01T00:01:40+00:00"}
    wf = {"type": "workflow", "workflow_id": f"agent-run-{run_id}-g1", "task_queue": "q", "ours": True,
          "t": 1.0, "input": given}
    assert ck.one_workflow_per_generation([run, wf]).ok is True
    again = {**wf, "workflow_id": f"agent-run-{run_id}-g1-again", "t": 2.0}
    check = ck.one_workflow_per_generation([run, wf, again])
    assert check.ok is False and "executions under 2 workflow ids" in check.detail, check
    assert "whose dispatch identity is" in check.detail, check
    # a generation-2 input under generation 1's id is not its generation's dispatch
    stale = {**wf, "input": {**given, "generation": 2}}
    assert ck.one_workflow_per_generation([{**run, "generation": 2}, stale]).ok is False


@pytest.mark.req("R-EXEC-8", "R-RESUME-1")
def test_a_workflow_started_with_another_deadline_or_generation_is_caught() -> None:
    run = "0b0e5a52-7a0c-4a7e-9d0b-8f1c2a3b4c5d"
    deadline = "2026-12-02T10:00:00+00:00"
    t = datetime.fromisoformat(deadline).timestamp()

    def wf(gen: int, **given: Any) -> dict[str, Any]:
        return {"type": "workflow", "workflow_id": f"agent-run-{run}-g{gen}", "t": 1.0,
                "input": {"run_id": run, "generation": gen, "deadline_at": deadline, **given}}

    history = [{"type": "run", "run_id": run, "deadline_t": t, "t": 2.0, "state": "completed", "generation": 2}]
    ok = ck.workflow_input_matches_its_run([*history, wf(1), wf(2)])
    assert ok.ok is True and ok.judged == 2
    later = ck.workflow_input_matches_its_run([*history, wf(1), wf(2, deadline_at="2026-12-02T11:00:00+00:00")])
    assert later.ok is False and "g2" in later.detail and "deadline_at" in later.detail
    stale = ck.workflow_input_matches_its_run([*history, wf(2, generation=1)])
    assert stale.ok is False
    unread = {"type": "workflow", "workflow_id": f"agent-run-{run}-g1", "t": 1.0}
    assert ck.workflow_input_matches_its_run([*history, unread]).judged == 0


@pytest.mark.req("R-EXEC-4")
def test_a_step_handed_another_state_than_the_folded_checkpoints_is_caught() -> None:
    from qualify.digests import canonical_sha256 as state_digest

    rows = [{**cp(1, 4, 4), "state_json": {"trail": [1], "n": 1, "odd": 1}, "state_delta": None},
            {**cp(2, 5, 5), "state_json": None,
             "state_delta": {"set": {"n": 2}, "unset": ["odd"], "append": {"trail": [2]}}}]
    right = {"trail": [1, 2], "n": 2}
    step3 = {**call(3, 6.0, attempt=2), "trail_seen": [1, 2], "state_sha256": state_digest(right)}
    assert ck.state_restored_at_every_step([*rows, step3]).ok is True
    kept = {"trail": [1, 2], "n": 1, "odd": 1}  # a fold that ignored set and unset
    bad = ck.state_restored_at_every_step([*rows, {**step3, "state_sha256": state_digest(kept)}])
    assert bad.ok is False and "another state than step 2 checkpointed" in bad.detail
