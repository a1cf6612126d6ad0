"""The takeover watcher's decisions (R-EXEC-13): pure, on a fake monotonic clock."""

from __future__ import annotations

import pytest

from qimpl.takeover import (
    Pending,
    TakeoverTracker,
    first_heartbeat_s,
    heartbeat_throttle_s,
    home_queue,
    should_move,
    takeover_queue,
    watcher_margin_s,
)

KEY = ("run-1", 1)


def _started(attempt: int, at: float = 100.0) -> Pending:
    return Pending(attempt=attempt, state="started", started_at=at, activity_id="1")


@pytest.mark.req("R-EXEC-13")
def test_a_token_is_failed_once_per_orphaned_stretch() -> None:
    t = TakeoverTracker(unclaimed_s=0.5)
    t.look([KEY], now=0.0)
    assert t.token_to_fail(KEY, b"tok-1") == b"tok-1"
    t.token_failed(KEY, b"tok-1")
    t.look([KEY], now=0.2)
    assert t.token_to_fail(KEY, b"tok-1") is None
    # A new owner's token (it claimed, then lost its lease too) is failed in its turn.
    assert t.token_to_fail(KEY, b"tok-2") == b"tok-2"
    # No token (claimed before tokens were stored): nothing to fail by token.
    assert t.token_to_fail(KEY, None) is None


@pytest.mark.req("R-EXEC-13")
def test_a_run_claimed_again_is_forgotten() -> None:
    t = TakeoverTracker(unclaimed_s=0.5)
    t.look([KEY], now=0.0)
    t.token_failed(KEY, b"tok-1")
    t.look([], now=0.2)  # claimed (lock held) or ended
    t.look([KEY], now=0.4)  # orphaned again, same token: a new stretch
    assert t.token_to_fail(KEY, b"tok-1") == b"tok-1"


@pytest.mark.req("R-EXEC-13")
def test_a_started_attempt_is_failed_only_after_the_bound_unchanged() -> None:
    t = TakeoverTracker(unclaimed_s=0.5)
    t.look([KEY], now=0.0)
    assert not t.unclaimed(KEY, _started(2), now=0.2)
    assert not t.unclaimed(KEY, _started(2), now=0.6)   # 0.4 s seen: not yet
    assert t.unclaimed(KEY, _started(2), now=0.71)      # 0.51 s unchanged
    t.failed_by_id(KEY)
    # The next attempt is judged afresh, from its own first sighting.
    assert not t.unclaimed(KEY, _started(3, at=101.0), now=0.9)
    assert not t.unclaimed(KEY, _started(3, at=101.0), now=1.3)
    assert t.unclaimed(KEY, _started(3, at=101.0), now=1.45)


@pytest.mark.req("R-EXEC-13")
def test_a_changed_or_scheduled_attempt_restarts_the_clock() -> None:
    t = TakeoverTracker(unclaimed_s=0.5)
    t.look([KEY], now=0.0)
    assert not t.unclaimed(KEY, _started(2), now=0.0)
    # Same attempt number, another start (an operator reset): a different attempt.
    assert not t.unclaimed(KEY, _started(2, at=105.0), now=0.6)
    assert not t.unclaimed(KEY, Pending(attempt=3, state="scheduled", started_at=None,
                                        activity_id="1"), now=1.2)
    assert not t.unclaimed(KEY, _started(3), now=1.3)
    assert not t.unclaimed(KEY, None, now=2.0)
    assert not t.unclaimed(KEY, _started(3), now=2.1)
    # Never for a run that is not (or no longer) orphaned.
    t.look([], now=3.0)
    assert not t.unclaimed(KEY, _started(3), now=9.0)


@pytest.mark.req("R-EXEC-13")
def test_temporal_is_asked_after_one_poll_then_at_most_every_quarter_bound() -> None:
    t = TakeoverTracker(unclaimed_s=0.8)
    t.look([KEY], now=0.0)
    assert not t.wants_describe(KEY, now=0.1, poll_s=0.2)
    assert t.wants_describe(KEY, now=0.2, poll_s=0.2)
    assert not t.wants_describe(KEY, now=0.3, poll_s=0.2)
    assert t.wants_describe(KEY, now=0.41, poll_s=0.2)
    assert not t.wants_describe(("other", 1), now=5.0, poll_s=0.2)


@pytest.mark.req("R-EXEC-13")
def test_an_attempt_that_heartbeated_since_its_start_gets_twice_the_bound() -> None:
    t = TakeoverTracker(unclaimed_s=0.5)
    t.look([KEY], now=0.0)
    beating = Pending(attempt=2, state="started", started_at=100.0, activity_id="1", heartbeat_at=100.01)
    assert not beating.silent
    assert not t.unclaimed(KEY, beating, now=0.0)
    assert not t.unclaimed(KEY, beating, now=0.6)
    assert t.unclaimed(KEY, beating, now=1.01)
    # A heartbeat from an earlier attempt (Temporal keeps it across attempts) is silence.
    assert Pending(attempt=3, state="started", started_at=101.0, activity_id="1", heartbeat_at=100.5).silent


@pytest.mark.req("R-EXEC-13")
def test_a_retry_swallowed_by_the_lost_owners_worker_gets_a_third_of_the_bound() -> None:
    t = TakeoverTracker(unclaimed_s=0.3)
    t.look([KEY], now=0.0)
    t.token_failed(KEY, b"tok-1")  # the paused owner's attempt, ended by the watcher
    # The dead owner's retry waits out its backoff: Temporal still names its worker.
    waiting = Pending(attempt=2, state="scheduled", started_at=None, activity_id="1", worker="7@paused")
    assert not t.unclaimed(KEY, waiting, now=0.1)
    swallowed = Pending(attempt=2, state="started", started_at=100.0, activity_id="1", worker="7@paused")
    assert not t.unclaimed(KEY, swallowed, now=0.8)
    assert not t.unclaimed(KEY, swallowed, now=0.85)   # 0.05 s seen: not yet
    assert t.unclaimed(KEY, swallowed, now=0.91)        # 0.11 s >= 0.3 / 3
    t.failed_by_id(KEY)
    # Started by another worker, silent: the full bound (it may just be slow).
    other = Pending(attempt=3, state="started", started_at=101.0, activity_id="1", worker="8@alive")
    assert not t.unclaimed(KEY, other, now=1.0)
    assert not t.unclaimed(KEY, other, now=1.2)
    assert t.unclaimed(KEY, other, now=1.31)
    # A lost worker's attempt that heartbeated is alive: twice the bound, as any.
    beating = Pending(attempt=4, state="started", started_at=102.0, activity_id="1",
                      heartbeat_at=102.01, worker="7@paused")
    assert not t.unclaimed(KEY, beating, now=2.0)
    assert not t.unclaimed(KEY, beating, now=2.5)
    assert t.unclaimed(KEY, beating, now=2.61)


@pytest.mark.req("R-EXEC-13")
def test_a_counted_failure_does_not_make_its_live_worker_a_lost_one() -> None:
    """Issue 56 item 2: a ``StepFailure`` is reported by a live worker (the count takes
    the token off the run, so the watcher ended nothing); its retry, started on that
    same worker and not yet heartbeated (a loaded worker), gets the full bound, not a
    third of it."""
    t = TakeoverTracker(unclaimed_s=0.3)
    t.look([KEY], now=0.0)
    backoff = Pending(attempt=2, state="scheduled", started_at=None, activity_id="1", worker="7@live")
    assert not t.unclaimed(KEY, backoff, now=0.1)
    retry = Pending(attempt=2, state="started", started_at=100.0, activity_id="1", worker="7@live")
    assert not t.unclaimed(KEY, retry, now=0.2)
    assert not t.lost_worker(KEY, retry)
    assert not t.unclaimed(KEY, retry, now=0.31), "a live worker's retry failed on the lost-worker bound"
    assert not t.unclaimed(KEY, retry, now=0.45)
    assert t.unclaimed(KEY, retry, now=0.51)  # silent for the full bound: as any


@pytest.mark.req("R-EXEC-13")
def test_a_timed_out_attempt_or_one_the_watcher_ended_makes_its_worker_lost() -> None:
    t = TakeoverTracker(unclaimed_s=0.3)
    t.look([KEY], now=0.0)
    # Temporal timed the attempt out (a paused or dead worker): lost.
    assert not t.unclaimed(KEY, Pending(attempt=2, state="scheduled", started_at=None, activity_id="1",
                                        worker="7@paused", timed_out=True), now=0.1)
    assert not t.lost_worker(KEY, _started(2))  # no worker named
    assert t.lost_worker(KEY, Pending(attempt=2, state="started", started_at=1.0, activity_id="1",
                                      worker="7@paused"))
    # The watcher ending an attempt marks only the worker of the retry seen next: a later
    # counted failure (its own backoff) of another worker in the same stretch does not.
    t.token_failed(KEY, b"tok-1")
    assert not t.unclaimed(KEY, Pending(attempt=3, state="scheduled", started_at=None, activity_id="1",
                                        worker="8@paused"), now=0.2)
    assert not t.unclaimed(KEY, Pending(attempt=4, state="scheduled", started_at=None, activity_id="1",
                                        worker="9@live"), now=0.3)
    assert t.lost_worker(KEY, Pending(attempt=4, state="started", started_at=2.0, activity_id="1",
                                      worker="8@paused"))
    assert not t.lost_worker(KEY, Pending(attempt=4, state="started", started_at=2.0, activity_id="1",
                                          worker="9@live"))
    # A swallowed attempt the watcher failed by id names its worker in the next backoff.
    t.failed_by_id(KEY)
    assert not t.unclaimed(KEY, Pending(attempt=5, state="scheduled", started_at=None, activity_id="1",
                                        worker="10@swallowed"), now=0.4)
    assert t.lost_worker(KEY, Pending(attempt=5, state="started", started_at=3.0, activity_id="1",
                                      worker="10@swallowed"))


@pytest.mark.req("R-EXEC-13")
def test_takeover_queue_names_its_home() -> None:
    own = takeover_queue("q", "abc")
    assert own == "q.takeover.abc" and home_queue(own) == "q" and home_queue("q") == "q"


@pytest.mark.req("R-EXEC-13")
@pytest.mark.parametrize(("state", "queue", "moves"), [
    ("started", "q", True),                 # the dead or paused owner's attempt on the shared queue
    ("started", "q.takeover.dead", True),   # a successor on another worker's takeover queue
    ("started", "q.takeover.me", False),    # already here
    ("scheduled", "q.takeover.dead", True),  # moved there, its worker died before the claim
    ("scheduled", "q", False),              # a counted failure's backoff on the shared queue stays
    ("started", "other", False),            # another deployment's run: failed, never adopted
    ("started", "other.takeover.x", False),
    ("other", "q", False),
    ("started", None, False),               # not reported
])
def test_should_move(state: str, queue: str | None, moves: bool) -> None:
    pending = Pending(attempt=1, state=state, started_at=1.0, activity_id="1", task_queue=queue)
    assert should_move(pending, home="q", own="q.takeover.me") is moves


@pytest.mark.req("R-EXEC-13")
@pytest.mark.parametrize("queue", ["q.takeover.dead", "q"])
def test_a_retry_temporal_timed_out_moves_only_when_its_workflow_redispatches(queue: str) -> None:
    # Measured: the server then ends the activity with a non-retryable ScheduleToStart
    # timeout, in the retry's backoff or after it: a workflow without the re-dispatch
    # patch fails the run, one with it schedules the activity again.
    pending = Pending(attempt=2, state="scheduled", started_at=None, activity_id="1", task_queue=queue,
                      timed_out=True)
    assert not should_move(pending, home="q", own="q.takeover.me")
    stranded = queue != "q"   # on a dead worker's takeover queue; on the shared one it stays
    assert should_move(pending, home="q", own="q.takeover.me", redispatches=True) is stranded


def test_whether_a_workflow_redispatches_is_kept_per_stretch() -> None:
    tracker = TakeoverTracker(unclaimed_s=0.3)
    tracker.look([("r", 1)], now=0.0)
    assert tracker.redispatches(("r", 1)) is None
    tracker.redispatched(("r", 1), True)
    assert tracker.redispatches(("r", 1)) is True
    tracker.look([], now=0.1)
    tracker.look([("r", 1)], now=0.2)
    assert tracker.redispatches(("r", 1)) is None


def test_moves_hold_a_slot_until_claimed() -> None:
    tracker = TakeoverTracker(unclaimed_s=0.3)
    tracker.look([("r", 1), ("s", 1)], now=0.0)
    tracker.moved(("r", 1))
    assert tracker.moves_unclaimed() == 1
    tracker.look([("s", 1)], now=0.1)  # r claimed
    assert tracker.moves_unclaimed() == 0


def test_a_move_is_not_a_new_pending_attempt() -> None:
    a = Pending(attempt=2, state="started", started_at=1.0, activity_id="1", task_queue="q")
    assert a == Pending(attempt=2, state="started", started_at=1.0, activity_id="1", task_queue="q.takeover.me")


@pytest.mark.req("R-EXEC-13")
def test_a_retry_heartbeats_at_once_a_first_attempt_before_the_watcher_could_fail_it() -> None:
    assert first_heartbeat_s(2, moved=False, unclaimed_s=0.3) == 0.0
    assert first_heartbeat_s(1, moved=True, unclaimed_s=0.3) == 0.0
    held = first_heartbeat_s(1, moved=False, unclaimed_s=0.3)
    assert 0 < held < 0.3 / 3, "a first attempt must heartbeat before the watcher's shortest bound"
    # The watcher's shortest bound for a silent started attempt is unclaimed_s / 3: one
    # started by a worker whose attempt lost the run's lease (named by the retry's backoff).
    tracker = TakeoverTracker(unclaimed_s=0.3)
    key = ("r", 1)
    tracker.look([key], 0.0)
    tracker.token_failed(key, b"tok")  # w's attempt lost the lease and was ended
    assert not tracker.unclaimed(key, Pending(attempt=2, state="scheduled", started_at=None,
                                              activity_id="1", worker="w"), 0.0)
    silent = Pending(attempt=2, state="started", started_at=10.0, activity_id="1", worker="w")
    assert not tracker.unclaimed(key, silent, 0.0)  # first seen: its bound starts now
    assert not tracker.unclaimed(key, silent, held), "failed before a live first attempt heartbeats"
    assert tracker.unclaimed(key, silent, 0.3 / 3), "the shortest bound is unclaimed_s / 3"
    # Heartbeated: judged afresh, against 2 x unclaimed_s.
    beat = Pending(attempt=2, state="started", started_at=10.0, activity_id="1", worker="w",
                   heartbeat_at=10.0 + held)
    assert not tracker.unclaimed(key, beat, 1.0)
    assert not tracker.unclaimed(key, beat, 1.0 + 0.3), "a heartbeated attempt waits 2 x unclaimed_s"
    assert tracker.unclaimed(key, beat, 1.0 + 0.6)


@pytest.mark.req("R-EXEC-13")
@pytest.mark.parametrize(("h", "lease", "throttle", "margin"), [
    (4.0, 2.0, 1.5, 0.4),     # the defaults
    (3.0, 2.0, 0.5, 0.4),     # a tighter timeout: heartbeats every touch interval
    (2.0, 2.0, 0.5, -0.6),    # lease = H (the former default): Temporal may win
    (1.0, 3.0, 0.75, -2.85),  # the harness's paused-transaction scenarios
    (30.0, 1.0, 24.0, 4.9),   # the takeover scenarios' slow timeout: the SDK's 0.8 H
])
def test_the_heartbeat_throttle_leaves_the_watcher_room(h: float, lease: float, throttle: float,
                                                        margin: float) -> None:
    assert heartbeat_throttle_s(h, lease) == pytest.approx(throttle)
    assert watcher_margin_s(h, lease) == pytest.approx(margin)
    # The margin is what it claims: an owner paused right after a heartbeat went out and
    # right after its last statement is timed out by Temporal at pause - throttle + H, and
    # its lease ends at pause + L, seen by the watcher within a poll.
    pause = 100.0
    temporal_times_out = pause - throttle + h
    watcher_ends_it = pause + lease + 0.1
    assert temporal_times_out - watcher_ends_it == pytest.approx(margin)


def _start_event(workflow_type: str) -> object:
    from temporalio.api.history.v1 import HistoryEvent

    event = HistoryEvent(event_id=1)
    event.workflow_execution_started_event_attributes.workflow_type.name = workflow_type
    return event


@pytest.mark.req("R-EXEC-13")
def test_the_watcher_reads_the_workflow_version_from_the_start_event() -> None:
    """A version-3 workflow re-dispatches with no patch marker in its history; any other
    (version 2, no start event) is judged by the marker."""
    from temporalio.api.history.v1 import HistoryEvent

    from qimpl.watcher import _workflow_type
    from qimpl.workflows.agent_run import WORKFLOW_TYPE

    assert _workflow_type(_start_event(WORKFLOW_TYPE)) == WORKFLOW_TYPE == "AgentRunWorkflowV3"  # type: ignore[arg-type]
    assert _workflow_type(_start_event("AgentRunWorkflowV2")) == "AgentRunWorkflowV2"  # type: ignore[arg-type]
    assert _workflow_type(HistoryEvent(event_id=5)) is None
    assert _workflow_type(None) is None


@pytest.mark.req("R-EXEC-14")
def test_a_look_forgets_only_the_runs_of_its_own_page() -> None:
    # The watcher lists one page of orphans a look (issue 55): a run on another page is
    # not claimed for being absent, so its stretch (and its unclaimed bound) goes on.
    t = TakeoverTracker(unclaimed_s=0.5)
    low, mid, high = ("a", 1), ("m", 1), ("z", 1)
    t.look([low, mid, high], now=0.0)
    t.token_failed(high, b"tok")
    t.look([low], now=0.1, after=None, upto="f")  # the page up to "f": mid and high elsewhere
    assert t.token_to_fail(high, b"tok") is None  # still known: not failed twice
    t.look([], now=0.2, after="f", upto=None)  # the rest: neither mid nor high is orphaned now
    assert t.token_to_fail(high, b"tok") is None and t.token_to_fail(mid, b"t") is None
    assert t.token_to_fail(low, b"t") == b"t"


@pytest.mark.req("R-EXEC-14")
def test_describes_are_bounded_per_look_and_reach_every_orphan() -> None:
    # 100 orphans, a budget of 10 a look: never more than 10 describes in one look, the
    # never-described first, and every orphan described within 10 looks (issue 55).
    t = TakeoverTracker(unclaimed_s=0.4)
    keys = [(f"run-{i:03d}", 1) for i in range(100)]
    t.look(keys, now=0.0)
    seen: set[tuple[str, int]] = set()
    for n in range(1, 11):
        chosen = t.to_describe(keys, now=0.1 * n, poll_s=0.1, budget=10)
        assert len(chosen) == 10 and not seen & set(chosen)
        seen |= set(chosen)
    assert seen == set(keys)
    # The next look goes back to the longest undescribed (the first ten).
    assert t.to_describe(keys, now=1.1, poll_s=0.1, budget=10) == keys[:10]
    # None before an orphan's first poll interval, nor twice within unclaimed_s / 4.
    fresh = TakeoverTracker(unclaimed_s=0.4)
    fresh.look([KEY], now=0.0)
    assert fresh.to_describe([KEY], now=0.05, poll_s=0.1, budget=10) == []
    assert fresh.to_describe([KEY], now=0.1, poll_s=0.1, budget=10) == [KEY]
    assert fresh.to_describe([KEY], now=0.15, poll_s=0.1, budget=10) == []
    assert fresh.to_describe([KEY], now=0.2, poll_s=0.1, budget=10) == [KEY]
