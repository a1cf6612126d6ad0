"""Checkers of the run record against the journal, the deadline arithmetic and Temporal's
executions (R-Q-5): each fails on the fault and passes without it."""

from __future__ import annotations

import pytest

from qualify import checkers as ck

RUN = "0b6d1f7e-2f0a-4c2c-9a51-0a0e5c7d9f10"


def _run(**over: object) -> dict[str, object]:
    return {"type": "run", "run_id": RUN, "state": "completed", "row_version": 4, "generation": 1,
            "t": 100.0, "deadline_t": 3700.0, **over}


def _transition(id_: int, new: str, version: int, gen: int = 1) -> dict[str, object]:
    return {"type": "transition", "id": id_, "run_id": RUN, "new_state": new, "row_version": version,
            "generation": gen, "t": float(id_)}


@pytest.mark.req("R-Q-5", "R-EVENT-1")
def test_a_write_the_journal_missed_is_caught() -> None:
    history = [_transition(1, "accepted", 1), _transition(2, "running", 3), _transition(3, "completed", 4), _run()]
    assert ck.transition_audit_matches_run_record(history).ok
    missed = ck.transition_audit_matches_run_record([*history[:2], _run()])
    assert not missed.ok and RUN in missed.detail


@pytest.mark.req("R-EXEC-8", "R-Q-5")
def test_deadline_must_be_acceptance_plus_what_was_asked() -> None:
    asked = [{"type": "client", "op": "create", "phase": "invoke", "key": "k", "deadline_seconds": 3600, "t": 1},
             {"type": "client", "op": "create", "phase": "ok", "key": "k", "run_id": RUN, "t": 2}]
    assert ck.deadline_from_acceptance([*asked, _run()]).ok
    assert not ck.deadline_from_acceptance([*asked, _run(deadline_t=3701.0)]).ok
    assert ck.deadline_from_acceptance([_run(deadline_t=5.0)]).ok  # not created through the client


@pytest.mark.req("R-CREATE-5", "R-Q-5")
def test_a_generation_has_one_workflow_and_no_stray_one() -> None:
    wf = {"type": "workflow", "workflow_id": f"agent-run-{RUN}-g1", "t": 1.0}
    listing = {"type": "workflow_listing", "count": 1, "t": 2.0}
    assert ck.one_workflow_per_generation([wf, listing, _run()]).ok
    assert not ck.one_workflow_per_generation([wf, wf, listing, _run()]).ok
    assert not ck.one_workflow_per_generation([{**wf, "workflow_id": f"agent-run-{RUN}-g2"}, _run()]).ok
    unknown = ck.one_workflow_per_generation([{"type": "workflow_listing", "error": "down", "t": 1.0}])
    assert unknown.ok is None
