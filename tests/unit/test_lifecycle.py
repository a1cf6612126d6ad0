from datetime import UTC, datetime, timedelta

import pytest

from qimpl import lifecycle as lc
from qimpl.lifecycle import RunState as S


@pytest.mark.req("R-STATE-1")
def test_terminal_states_have_no_exit() -> None:
    for old in lc.TERMINAL:
        for new in S:
            assert not lc.is_allowed(old, new)


@pytest.mark.req("R-STATE-1")
def test_table_matches_the_spec() -> None:
    nexts = {s: {b for a, b in lc.TRANSITIONS if a == s} for s in S}
    assert nexts[S.ACCEPTED] == {S.QUEUED, S.CANCELLED, S.EXPIRED, S.FAILED}
    # queued -> queued records a confirmed dispatch of a generation queued by an approval
    assert nexts[S.QUEUED] == {S.QUEUED, S.RUNNING, S.CANCELLED, S.EXPIRED, S.FAILED}
    assert nexts[S.AWAITING_INPUT] == {S.ACCEPTED, S.CANCELLED, S.EXPIRED}
    assert nexts[S.AWAITING_APPROVAL] == {S.RUNNING, S.QUEUED, S.CANCELLED, S.EXPIRED}
    assert S.RUNNING in nexts[S.RUNNING]
    assert not lc.is_allowed(S.QUEUED, S.COMPLETED)
    assert not lc.is_allowed(S.ACCEPTED, S.RUNNING)


@pytest.mark.req("R-STATE-2")
def test_states_are_lowercase_strings() -> None:
    assert all(s.value == s.value.lower() and isinstance(s.value, str) for s in S)


@pytest.mark.req("R-CREATE-5")
def test_workflow_id() -> None:
    assert lc.workflow_id("abc", 2) == "agent-run-abc-g2"
    with pytest.raises(ValueError):
        lc.workflow_id("abc", 0)


@pytest.mark.req("R-EXEC-8")
@pytest.mark.parametrize("seconds", [0, -1, 86401])
def test_deadline_out_of_range(seconds: int) -> None:
    with pytest.raises(ValueError):
        lc.deadline_at(datetime.now(UTC), seconds)


@pytest.mark.req("R-EXEC-8")
def test_deadline_and_remaining() -> None:
    t = datetime(2026, 1, 1, tzinfo=UTC)
    d = lc.deadline_at(t, 3600)
    assert d - t == timedelta(hours=1)
    assert lc.remaining(d, t + timedelta(minutes=10)) == timedelta(minutes=50)
    assert lc.remaining(d, d + timedelta(seconds=5)) == timedelta(0)
