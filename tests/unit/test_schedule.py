from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qualify.schedule import (
    NEW_ACTIONS,
    TOOL_ACTIONS,
    Schedule,
    generate,
    problems,
    shrink_candidates,
)


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
        if f.action in TOOL_ACTIONS:  # a step after the tool call (the synthetic script's rule)
            assert f.step < s.runs[f.run].steps
    assert problems(s) == []


@pytest.mark.req("R-Q-10")
def test_every_schedule_of_many_seeds_is_valid_and_each_new_fault_is_in_about_one_of_seven() -> None:
    n = 3000
    seen = {a: 0 for a in NEW_ACTIONS}
    for seed in range(n):
        s = generate(seed)
        assert problems(s) == [], (seed, s)
        for a in {f.action for f in s.faults} & set(NEW_ACTIONS):
            seen[a] += 1
    for a, k in seen.items():
        assert 0.10 < k / n < 0.25, (a, k / n)


def test_problems_names_what_is_not_valid() -> None:
    from qualify.schedule import FaultPlan, RunPlan

    ok = Schedule(seed=1, runs=(RunPlan(3, 0),), faults=(FaultPlan(0, 2, "kill-sink"),))
    assert problems(ok) == []
    assert problems(Schedule(seed=1, runs=(RunPlan(2, 0),), faults=(FaultPlan(0, 2, "kill-sink"),)))
    assert problems(Schedule(seed=1, runs=(RunPlan(2, 0),), faults=(FaultPlan(0, 3, "sigkill-worker"),)))
    assert problems(Schedule(seed=1, runs=(RunPlan(2, 0),), faults=(FaultPlan(0, 1, "explode"),)))
    assert problems(Schedule(seed=1, runs=(RunPlan(2, 0),), faults=(FaultPlan(1, 1, "sigkill-worker"),)))


@given(st.integers(min_value=0, max_value=2**32))
def test_shrinking_only_shrinks_and_stays_valid(seed: int) -> None:
    s = generate(seed)
    for c in shrink_candidates(s):
        assert c.size < s.size
        assert c.runs
        for f in c.faults:
            assert 0 <= f.run < len(c.runs) and 1 <= f.step <= c.runs[f.run].steps
        assert problems(c) == []


def test_shrinking_keeps_a_step_after_a_tool_call() -> None:
    from qualify.schedule import FaultPlan, RunPlan

    s = Schedule(seed=1, runs=(RunPlan(6, 0),), faults=(FaultPlan(0, 3, "kill-sink"),))
    shortened = [c for c in shrink_candidates(s) if c.faults]
    assert [c.runs[0].steps for c in shortened] == [4]
    assert all(problems(c) == [] for c in shrink_candidates(s))


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


@pytest.mark.parametrize("text", ["garbage", "[1]", '{"x": 1}', '{"schedule": {"seed": 1, "runs": [{"nope": 1}], "faults": []}}',
                                  '{"scenarios": [], "verdict": "pass", "seed": 3}'])
def test_a_file_that_is_not_a_saved_schedule_is_a_usage_error(tmp_path: Path, text: str) -> None:
    """A new user's finding: ``qualify repro --schedule`` given a report's summary.json
    (instead of its repro.json), or a file cut short, printed a KeyError or JSONDecodeError
    traceback and exited 1, the code of a ``fail`` verdict. A usage error names the file."""
    from qualify.errors import UsageError
    from qualify.session import resolve

    path = tmp_path / "repro.json"
    path.write_text(text)
    with pytest.raises(UsageError, match="not a saved schedule"):
        resolve([], seed=1, schedule_path=path)
    saved = tmp_path / "good.json"
    saved.write_text(generate(5).to_json())
    assert len(resolve([], seed=1, schedule_path=saved)) == 1
