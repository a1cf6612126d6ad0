"""Checkers of a run's lifecycle (R-STATE-1, R-EXEC-3/4/8/9/12): one terminal state, row
versions, checkpoints, the deadline, crash loops and tenant slots."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence

from qualify.checkers._base import TERMINAL, Check, _by_run, _of, _summary, accepted_runs
from qualify.digests import canonical_sha256
from qualify.history import Event

__all__ = [
    "ASK_BOUND",
    "CLAIMS_WITHOUT_PROGRESS",
    "PROVIDER_CLOCK_SLACK_S",
    "SLOT_STATES",
    "checkpoints_one_per_step",
    "deadline_from_acceptance",
    "deadline_respected",
    "every_run_ended",
    "no_crash_loop",
    "no_step_repeated_after_checkpoint",
    "no_write_after_terminal",
    "one_terminal_state",
    "row_version_strictly_increasing",
    "slot_holders",
    "slot_limit_respected",
    "state_restored_at_every_step",
    "transition_audit_matches_run_record",
]


def every_run_ended(history: Sequence[Event]) -> Check:
    """Every accepted run ends in a terminal state: its last transition is one (R-Q-5's
    "one terminal state per accepted run", its liveness half: no guard enforces it)."""
    name = "every accepted run ended in a terminal state"
    trans = _by_run(_of(history, "transition"))
    bad = []
    for run in sorted(accepted_runs(history)):
        if not trans.get(run):
            bad.append(f"{run}: no transition")
        elif trans[run][-1]["new_state"] not in TERMINAL:
            bad.append(f"{run}: ends in {trans[run][-1]['new_state']}")
    runs = len(accepted_runs(history))
    return Check(name, not bad, _summary(bad) or f"{runs} runs", ("R-Q-5",), judged=runs)


def one_terminal_state(history: Sequence[Event]) -> Check:
    """No accepted run enters a terminal state twice (R-Q-5's "one terminal state per
    accepted run", its safety half). Restates the guard's QG001 (a terminal row never
    changes, R-STATE-1): it fails a scenario whose history breaks it, and covers nothing."""
    name = "no run entered a terminal state twice"
    trans = _by_run(_of(history, "transition"))
    bad = []
    for run in sorted(accepted_runs(history)):
        entries = [e for e in trans.get(run, []) if e["new_state"] in TERMINAL]
        if len(entries) > 1:
            bad.append(f"{run}: {len(entries)} terminal transitions")
    runs = len(accepted_runs(history))
    return Check(name, not bad, _summary(bad) or f"{runs} runs", ("R-STATE-1", "R-Q-5"), judged=runs,
                 restates="QG001")


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
    folded = _folded_states(history)
    whole = 0
    for call in calls:
        step = int(call["step"])
        if call["trail_seen"] != list(range(1, step)):
            bad.append(f"{call['run_id']}: step {step} (attempt {call.get('attempt')}) was handed "
                       f"trail {call['trail_seen']}")
            continue
        want = folded.get((str(call["run_id"]), step - 1))
        if step > 1 and want is not None and call.get("state_sha256") is not None:
            whole += 1
            if call["state_sha256"] != canonical_sha256(want):
                bad.append(f"{call['run_id']}: step {step} (attempt {call.get('attempt')}) was handed "
                           f"another state than step {step - 1} checkpointed (keys {sorted(want)})")
    return Check(name, not bad, _summary(bad) or f"{len(calls)} provider calls, {whole} whole states compared",
                 ("R-EXEC-4",), judged=len(calls))


def _folded_states(history: Sequence[Event]) -> dict[tuple[str, int], dict[str, object]]:
    """``(run, step) -> state`` as the run's checkpoints store it, folded here from the
    stored form's definition (qimpl.state_delta's docstring: a whole ``state_json``, or a
    ``state_delta`` of ``set``, ``unset`` and ``append`` on the previous step's state),
    not by the implementation's function. A step whose chain has a gap or a whole state
    left out of the history (over 20,000 bytes) is not folded."""
    out: dict[tuple[str, int], dict[str, object]] = {}
    by_run: dict[str, list[Event]] = defaultdict(list)
    for e in _of(history, "checkpoint"):
        if "state_delta" in e or "state_json" in e:
            by_run[str(e["run_id"])].append(e)
    for run, rows in by_run.items():
        state: dict[str, object] | None = None
        last = 0
        for row in sorted(rows, key=lambda r: int(r["step"])):
            step = int(row["step"])
            if row.get("state_json") is not None:
                state = dict(row["state_json"])
            elif row.get("state_delta") is not None and state is not None and step == last + 1:
                delta = row["state_delta"]
                state = {k: v for k, v in state.items() if k not in set(delta.get("unset", ()))}
                state.update(delta.get("set", {}))
                for key, tail in (delta.get("append") or {}).items():
                    state[key] = state[key] + tail  # type: ignore[operator]
            else:
                state = None
            last = step
            if state is not None:
                out[(run, step)] = state
    return out


#: Provider calls are stamped by the worker a few microseconds after it checked the
#: deadline; checkpoints and transitions are stamped by the database that enforces it.
PROVIDER_CLOCK_SLACK_S = 0.05

#: How long after its run's deadline a provider call in flight may still run: the owner
#: cancels it at the deadline (``asyncio.timeout``), and the synthetic provider records
#: the cancellation as the call's end, 0.002-0.026 s after the deadline in the deadline
#: scenarios. Without that timeout the activity's schedule-to-close timeout (the
#: deadline) stops some calls (0.06-0.07 s) and lets others answer 0.35-0.51 s late.
CALL_END_BOUND_S = 0.25


def deadline_respected(history: Sequence[Event]) -> Check:
    """After a run's deadline: no provider call asked, none still running
    ``CALL_END_BOUND_S`` after it (the synthetic provider's record of each call's end), no
    checkpoint, and no transition except into ``expired``, ``failed`` or ``cancelled``
    (R-EXEC-8); and never ``expired`` before it (R-EXEC-12). Deadlines and transitions are
    both stamped by the database's clock. Judges what a deadline bounded: each event
    stamped after its run's deadline and each ``expired`` transition (a history whose runs
    all ended early judged nothing)."""
    name = "deadline respected"
    deadlines = {str(e["run_id"]): float(e["deadline_t"]) for e in _of(history, "run")}
    bad = []
    judged = 0
    for e in history:
        run = str(e.get("run_id", ""))
        if run not in deadlines or e["type"] not in ("provider_call", "provider_call_end", "checkpoint",
                                                      "transition"):
            continue
        late = e["t"] - deadlines[run]
        judged += late > 0 or (e["type"] == "transition" and e["new_state"] == "expired")
        if e["type"] == "provider_call" and late > PROVIDER_CLOCK_SLACK_S:
            bad.append(f"{run}: provider step {e['step']} asked {late:.3f} s after the deadline")
        elif e["type"] == "provider_call_end" and late > CALL_END_BOUND_S:
            bad.append(f"{run}: provider step {e['step']} (attempt {e['attempt']}) ran until {late:.3f} s "
                       f"after the deadline ({e['how']})")
        elif e["type"] == "checkpoint" and late > 0:
            bad.append(f"{run}: checkpoint {e['step']} {late:.3f} s after the deadline")
        elif (e["type"] == "transition" and late > 0
              and e["new_state"] not in ("expired", "failed", "cancelled")):
            bad.append(f"{run}: {e['old_state']} -> {e['new_state']} {late:.3f} s after the deadline")
        elif e["type"] == "transition" and late < 0 and e["new_state"] == "expired":
            bad.append(f"{run}: expired {-late:.3f} s before its deadline")
    return Check(name, not bad, _summary(bad) or f"{judged} events at or past a deadline",
                 ("R-EXEC-8", "R-EXEC-12"), judged=judged)


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


def transition_audit_matches_run_record(history: Sequence[Event]) -> Check:
    """For every run, the last transition the database's own transition audit
    (``run_transitions``) recorded equals the run record at collection (state,
    row_version, generation): no write escaped the audit (R-Q-5, R-EVENT-1). Restates the audit trigger (``run_transitions`` is written by the
    database for every write of a run)."""
    name = "every run's last audited transition (run_transitions) equals its run record"
    last: dict[str, Event] = {}
    for t in sorted(_of(history, "transition"), key=lambda e: int(e.get("id", 0))):
        last[str(t["run_id"])] = t
    bad = []
    for run in _of(history, "run"):
        found = last.get(str(run["run_id"]))
        want = (run["state"], run["row_version"], run["generation"])
        got = (found["new_state"], found["row_version"], found["generation"]) if found else None
        if got != want:
            bad.append(f"{run['run_id']}: audit {got}, record {want}")
    return Check(name, not bad, _summary(bad) or f"{len(last)} runs", ("R-Q-5", "R-EVENT-1"),
                 judged=len(_of(history, "run")), restates="the audit trigger")
