import pytest

from qualify.determinism import check_schedules, scrub


@pytest.mark.req("R-Q-7")
def test_every_random_scenario_schedule_is_derived_identically() -> None:
    same, total = check_schedules([1, 2, 3, 2**40], 4)
    assert same == total == 16


def test_scrub_drops_times_pids_and_ids() -> None:
    def history(pid: int, t0: float) -> list[dict]:  # type: ignore[type-arg]
        return [
            {"type": "client", "op": "create", "phase": "ok", "run_id": f"r{pid}", "t": t0},
            {"type": "barrier", "name": "f0", "step": 2, "pid": pid, "t": t0 + 1},
            {"type": "fault", "fault": "sigkill", "target": "worker-1", "landed": True, "t": t0 + 2,
             "evidence": {"pid": pid, "barrier": "f0", "step": 2}},
            {"type": "run", "run_id": f"r{pid}", "state": "completed", "t": t0},
        ]

    assert scrub(history(10, 100.0)) == scrub(history(99, 5.0))
    other = history(10, 1.0)
    other[-1]["state"] = "failed"
    assert scrub(other) != scrub(history(10, 1.0))
