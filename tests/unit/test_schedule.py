import pytest
from hypothesis import given
from hypothesis import strategies as st

from qualify.schedule import Schedule, generate, shrink_candidates


@pytest.mark.req("R-Q-7")
@given(st.integers(min_value=0, max_value=2**63))
def test_one_seed_one_schedule(seed: int) -> None:
    assert generate(seed) == generate(seed)
    assert Schedule.from_json(generate(seed).to_json()) == generate(seed)


def test_seeds_differ() -> None:
    assert len({generate(s).to_json() for s in range(50)}) > 40


@given(st.integers(min_value=0, max_value=2**32))
def test_schedules_are_valid(seed: int) -> None:
    s = generate(seed)
    assert s.runs and len({f.run for f in s.faults}) == len(s.faults)
    for f in s.faults:
        assert 1 <= f.step <= s.runs[f.run].steps


@given(st.integers(min_value=0, max_value=2**32))
def test_shrinking_only_shrinks_and_stays_valid(seed: int) -> None:
    s = generate(seed)
    for c in shrink_candidates(s):
        assert c.size < s.size
        assert c.runs
        for f in c.faults:
            assert 0 <= f.run < len(c.runs) and 1 <= f.step <= c.runs[f.run].steps


def test_minimise_finds_the_minimal_failing_schedule() -> None:
    from qualify.schedule import FaultPlan, RunPlan
    from qualify.shrink import minimise

    big = Schedule(seed=1, runs=(RunPlan(5, 80), RunPlan(6, 20), RunPlan(4, 0)),
                   faults=(FaultPlan(0, 2, "restart-worker"), FaultPlan(1, 4, "sigkill-worker"),
                           FaultPlan(2, 1, "sigstop-worker")))

    def fails(s: Schedule) -> bool:  # the "bug": a SIGKILL at step >= 3 of some run
        return any(f.action == "sigkill-worker" and f.step >= 3 for f in s.faults)

    small = minimise(big, fails)
    assert fails(small)
    assert small.runs == (RunPlan(4, 0),) and small.faults == (FaultPlan(0, 4, "sigkill-worker"),)
