"""Lease sessions that carry the locks of many runs (issue 55, R-EXEC-2 as amended,
R-EXEC-14).

Why: agent runs spend most of their life waiting for a model. With one lease session per
in-flight run, a worker's concurrency cost one PostgreSQL backend per run (about 3 MiB
and a connection slot each), so a worker was held to 20 runs and a model-bound load ran at
a quarter of bare Temporal's speed (``bench/RESULTS.md``, "Model-bound load"). Here each
of a worker's few lease sessions (a *carrier*) holds the session advisory locks of up to
``runs_per_session`` of its runs, across all their commits, as the one session did.

What each lease still has, and how:

* **One owner per run.** The run's lock is taken with ``pg_try_advisory_lock`` on the
  carrier and held until the lease ends (``pg_advisory_unlock``) or the session does.
  A session advisory lock is re-entrant (bensheldon/good_job#1735: taken twice on one
  session, it survives one unlock), so the worker refuses a second attempt of a run it
  already owns before the lock is asked for, and so before any provider call
  (``LeaseCarriers.carry``: ``AlreadyOwned``, a ``LockNotAcquired``).
* **Every write on the lock's session, one lease at a time.** A lease's statements go
  through its ``CarriedConnection``: a statement, a transaction or a cursor block holds
  the carrier's *turn* (an ``asyncio.Lock``) from its first statement to its end, and
  sets the session's scope first when another lease used it last (``qimpl.tenant`` for
  row-level security, ``qimpl.owner`` for the audit's writer identity): no statement of
  one run ever runs inside another's transaction or under its scope.
* **The lease bound.** The carrier's session runs with the lease's timeouts, applied and
  read back before any lock is taken (``OwnershipLease``'s settings; ``LeaseNotBounded``),
  and the carrier's keeper touches it every ``lease_s / 4`` with one statement for all its
  runs (``qimpl_run_states``): a stopped or cut-off worker stops touching, and PostgreSQL
  ends the session ``lease_s`` after its last statement, freeing every lock it carried; a
  run stalled inside its transaction keeps the turn, so the keeper cannot touch, and
  ``idle_in_transaction_session_timeout`` ends the session (R-EXEC-11). A cancelled or
  expired run is seen by the same touch (R-Q34-1).
* **A lost session ends the ownership of every run it carried** (and of no other): the
  carrier is marked broken, each of its leases raises ``LostOwnership`` at its next touch
  or statement, and the watcher takes each run over as after any lost owner.

A lease that ends gives its lock back with ``pg_advisory_unlock`` before the activity
returns; one that finds the session inside a transaction or a statement (a cancelled
statement psycopg could not finish) breaks the carrier instead. An empty carrier stays
open for the next lease (at most ``IDLE_CARRIERS`` of them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg
from psycopg import pq

from qimpl.errors import LeaseSessionUnavailable, LockNotAcquired, LostOwnership

__all__ = ["APPLICATION_NAME", "ENDED_STATES", "IDLE_CARRIERS", "AlreadyOwned", "CarriedConnection", "Carrier",
           "LeaseCarriers", "lock_key_sql"]

log = logging.getLogger("qimpl.lease")

#: ``application_name`` of a carrier session (``qualify`` finds a run's session by its lock).
APPLICATION_NAME = "qimpl-lease-session"
#: Empty carriers kept open for the next leases.
IDLE_CARRIERS = 2
#: Longest a new session may take to connect and be bounded, seconds: it holds no lock yet,
#: so this bounds only the wait of the lease that opens it (over a slow network a connect
#: takes several round trips, more than a lease).
OPEN_BOUND_S = 5.0
#: The advisory lock key of a run: one bigint derived from its id (also a lease's on a
#: session of its own, ``qimpl.db.lease``).
lock_key_sql = "hashtextextended('qimpl-run:' || %s, 0)"
#: SQLSTATEs with which PostgreSQL ends a session: idle in transaction too long, idle too
#: long, terminated by an administrator.
_SESSION_ENDED = frozenset({"25P03", "57P05", "57P01"})
#: States in which a run has ended: its owner stops at its next touch (R-Q34-1).
ENDED_STATES = frozenset({"completed", "failed", "expired", "cancelled"})


class AlreadyOwned(LockNotAcquired):
    """This worker already owns the run (another attempt's lease is open): a second attempt
    is refused before it asks for the lock, which its session would grant again (R-EXEC-2).
    Retryable, like any LockNotAcquired."""

    code = "already_owned"


class Carrier:
    """One lease session and the runs whose locks it holds. ``settings(conn)`` applies and
    verifies the lease's session settings (raises ``LeaseNotBounded``)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], *, lease_s: float, number: int) -> None:
        self.conn = conn
        self.lease_s = lease_s
        self.number = number
        self.turn = asyncio.Lock()
        #: The task holding ``turn`` (a lease's statement, transaction or cursor block).
        self.holder: asyncio.Task[Any] | None = None
        #: When (monotonic seconds) the holder took the turn; None: nobody holds it.
        self.held_since: float | None = None
        #: ``(tenant, writer)`` the session is scoped to now.
        self.scope: tuple[str, str] | None = None
        #: run id -> its state as the last touch read it.
        self.runs: dict[str, str | None] = {}
        self.broken = False
        self._keeper: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._keeper = asyncio.get_running_loop().create_task(self._keep(), name=f"lease-carrier-{self.number}")

    @contextlib.asynccontextmanager
    async def held(self, scope: tuple[str, str]) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """The session, for one block of the lease scoped ``scope``; re-entrant within the
        task that holds it. Raises LostOwnership once the carrier is broken."""
        task = asyncio.current_task()
        if self.holder is task and task is not None:
            yield self.conn
            return
        async with self.turn:
            self.holder = task
            self.held_since = time.monotonic()
            try:
                if self.broken or self.conn.closed:
                    raise LostOwnership(f"lease session {self.number} is gone")
                if self.scope != scope:
                    self.scope = None
                    await self.conn.execute(
                        "SELECT set_config('qimpl.tenant', %s, false), set_config('qimpl.owner', %s, false)",
                        scope)
                    self.scope = scope
                yield self.conn
            except psycopg.Error as exc:
                # Only a lost session breaks the carrier: a refused value or a lock timeout
                # is the lease's own error, and the session goes on for the others.
                if self.conn.broken or self.conn.closed or exc.sqlstate in _SESSION_ENDED:
                    await self.break_(reason=f"session lost: {exc.sqlstate or type(exc).__name__}")
                raise
            finally:
                self.holder = None
                self.held_since = None

    async def _keep(self) -> None:
        """Touch the session every ``lease_s / 4`` with one read of every carried run's state;
        a lost session breaks the carrier."""
        try:
            while not self.broken:
                await asyncio.sleep(self.lease_s / 4)
                async with self.turn:
                    if self.broken or self.conn.closed:
                        break
                    ids = list(self.runs)
                    cur = await self.conn.execute(
                        "SELECT run_id::text, state FROM qimpl_run_states(%s::uuid[])", (ids,))
                    states = {str(r[0]): str(r[1]) for r in await cur.fetchall()}
                for run_id in ids:
                    if run_id in self.runs:
                        self.runs[run_id] = states.get(run_id)
        except (psycopg.Error, OSError) as exc:
            await self.break_(reason=f"touch failed: {type(exc).__name__}")
        except asyncio.CancelledError:
            raise

    async def break_(self, *, reason: str) -> None:
        """Mark the carrier lost and close its session (every lock it held is freed)."""
        if self.broken:
            return
        self.broken = True
        if self.runs:
                log.warning("lease session %s lost (%s): its %s runs lose their ownership", self.number, reason,
                        len(self.runs), extra={"event": "lease.session_lost", "runs": len(self.runs)})
        with contextlib.suppress(psycopg.Error, OSError):
            await self.conn.close()

    async def stop(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._keeper
        with contextlib.suppress(psycopg.Error, OSError):
            await self.conn.close()


class CarriedConnection:
    """A lease's view of its carrier's session: the subset of ``psycopg.AsyncConnection``
    the owner uses (``execute``, ``transaction``, ``cursor``, ``closed``, ``broken``,
    ``info``), each block holding the carrier's turn under the lease's scope."""

    def __init__(self, carrier: Carrier, *, run_id: str, scope: tuple[str, str]) -> None:
        self.carrier = carrier
        self.run_id = run_id
        self.scope = scope
        self.released = False

    @property
    def closed(self) -> bool:
        return self.released or self.carrier.broken or self.carrier.conn.closed

    @property
    def broken(self) -> bool:
        return self.carrier.broken or self.carrier.conn.broken

    @property
    def info(self) -> Any:
        return self.carrier.conn.info

    def holds_the_turn(self) -> bool:
        """Whether one of this lease's blocks holds its session now."""
        return self.carrier.holder is not None and self.carrier.scope == self.scope

    def _check(self) -> None:
        if self.released:
            raise LostOwnership(f"the lease of run {self.run_id} has ended")

    async def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:
        self._check()
        async with self.carrier.held(self.scope) as conn:
            return await conn.execute(query, params, **kw)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        self._check()
        async with self.carrier.held(self.scope) as conn, conn.transaction() as tx:
            yield tx

    @contextlib.asynccontextmanager
    async def cursor(self, *args: Any, **kw: Any) -> AsyncIterator[Any]:
        self._check()
        async with self.carrier.held(self.scope) as conn, conn.cursor(*args, **kw) as cur:
            yield cur

    def touch(self) -> None:
        """Raise LostOwnership when the carrier's session is gone or the last touch saw the
        run ended (cancelled or expired by another writer: R-Q34-1)."""
        if self.closed:
            raise LostOwnership(f"lease of run {self.run_id} lost: its session is gone")
        state = self.carrier.runs.get(self.run_id)
        if state in ENDED_STATES:
            raise LostOwnership(f"run {self.run_id} is {state}")


class LeaseCarriers:
    """A worker's lease sessions for leases of ``lease_s`` seconds on ``dsn``: at most
    ``max_sessions`` carriers of at most ``runs_per_session`` runs each.
    ``connect(dsn)`` opens a session; ``bound(conn)`` applies and verifies the lease's
    settings on it (raises ``LeaseNotBounded``). Call ``close()`` at shutdown."""

    def __init__(self, dsn: str, *, lease_s: float, runs_per_session: int, max_sessions: int,
                 connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]],
                 bound: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]) -> None:
        if runs_per_session < 1 or max_sessions < 1:
            raise ValueError("a carrier carries at least one run, and there is at least one")
        self.dsn = dsn
        self.lease_s = lease_s
        self.runs_per_session = runs_per_session
        self.max_sessions = max_sessions
        self._connect = connect
        self._bound = bound
        self._carriers: list[Carrier] = []
        #: run id -> its lease on this worker (or a claim in progress).
        self._owned: dict[str, object] = {}
        self._opening = 0
        self._numbers = 0
        self._room = asyncio.Condition()
        self._warm: asyncio.Task[None] | None = None

    def serves(self, dsn: str, lease_s: float) -> bool:
        """Whether a lease of ``lease_s`` seconds on ``dsn`` may use these sessions."""
        return dsn == self.dsn and lease_s == self.lease_s

    @property
    def sessions(self) -> int:
        """Carrier sessions open now."""
        return len(self._carriers)

    def _live(self) -> list[Carrier]:
        self._carriers = [c for c in self._carriers if not c.broken]
        return self._carriers

    async def carry(self, run_id: str, *, scope: tuple[str, str]) -> CarriedConnection:
        """Take the run's lock on a carrier with room (the least loaded; a new one while
        fewer than ``max_sessions`` are open). Raises ``AlreadyOwned`` when this worker owns
        the run already, ``LockNotAcquired`` when another session holds its lock,
        ``LeaseSessionUnavailable`` when no carrier has room within the lease (or none can
        be opened), and ``LeaseNotBounded`` when a new session does not run with the lease's
        settings."""
        existing = self._owned.get(run_id)
        if existing is not None and not self._lost(existing):
            raise AlreadyOwned(f"run {run_id} is already owned by an attempt on this worker")
        claim = object()
        self._owned[run_id] = claim
        try:
            if isinstance(existing, CarriedConnection):
                # Its attempt held its session longer than the lease (stalled inside a
                # transaction): PostgreSQL ends such a session, and its keeper, waiting for
                # the turn, cannot notice. The new attempt must not wait for the stalled one.
                await existing.carrier.break_(reason=f"run {run_id} held its session past the lease")
            carrier = await self._with_room()
            carried = CarriedConnection(carrier, run_id=run_id, scope=scope)
            carrier.runs[run_id] = None
            try:
                cur = await carried.execute(f"SELECT pg_try_advisory_lock({lock_key_sql})", (run_id,))
                row = await cur.fetchone()
            except BaseException:
                carrier.runs.pop(run_id, None)
                raise
            if not (row and row[0]):
                carrier.runs.pop(run_id, None)
                raise LockNotAcquired(f"run {run_id} is owned by another session")
            self._owned[run_id] = carried
            return carried
        except BaseException:
            if self._owned.get(run_id) is claim:
                del self._owned[run_id]
            async with self._room:
                self._room.notify_all()
            raise

    def open(self) -> None:
        """Open one carrier in the background, so that the first lease finds a session
        ready (a new session costs several round trips: over a slow network, more than a
        lease). Call inside the event loop that uses it; a failure is logged, and the first
        lease opens one itself."""
        self._warm = asyncio.get_running_loop().create_task(self._open_one())

    async def _open_one(self) -> None:
        async with self._room:
            if self._live() or self._opening:
                return
            self._opening += 1
        try:
            carrier = await self._open(OPEN_BOUND_S)
            async with self._room:
                self._carriers.append(carrier)
        except Exception as exc:  # noqa: BLE001 - best effort: the first lease opens one itself
            log.warning("no lease session opened ahead: %s", type(exc).__name__,
                        extra={"event": "lease.session_not_opened"})
        finally:
            async with self._room:
                self._opening -= 1
                self._room.notify_all()

    def _lost(self, owned: object) -> bool:
        """Whether a lease of this worker no longer owns its run: its session is gone, or
        its attempt has held the session alone for longer than the lease (idle inside a
        transaction, which PostgreSQL ends at the lease; a statement waits on a lock at most
        the lease). A claim still in progress is not lost."""
        if not isinstance(owned, CarriedConnection):
            return False
        carrier = owned.carrier
        return carrier.broken or (carrier.holder is not None and carrier.held_since is not None
                                  and owned.holds_the_turn()
                                  and time.monotonic() - carrier.held_since > self.lease_s)

    async def _with_room(self) -> Carrier:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.lease_s
        async with self._room:
            while True:
                live = self._live()
                roomy = [c for c in live if len(c.runs) < self.runs_per_session]
                if roomy:
                    return min(roomy, key=lambda c: len(c.runs))
                # One session opens at a time; the others wait for it (a burst of claims
                # opens them one after another, each in a few milliseconds on a LAN).
                if not self._opening and len(live) < self.max_sessions:
                    break
                left = deadline - loop.time()
                if left <= 0:
                    raise LeaseSessionUnavailable(
                        f"no lease session with room within {self.lease_s:g} s ({len(live)} sessions of "
                        f"{self.runs_per_session} runs each, at most {self.max_sessions})")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._room.wait(), left)
            self._opening += 1
        try:
            carrier = await self._open(OPEN_BOUND_S)
        finally:
            async with self._room:
                self._opening -= 1
                self._room.notify_all()
        async with self._room:
            self._carriers.append(carrier)
        return carrier

    async def _open(self, timeout_s: float) -> Carrier:
        try:
            async with asyncio.timeout(timeout_s):
                conn = await self._connect()
        except (psycopg.Error, OSError, TimeoutError):
            raise LeaseSessionUnavailable(
                f"no lease session within {timeout_s:g} s: the database refuses connections or does not answer"
            ) from None
        try:
            await self._bound(conn)
        except BaseException:
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.close()
            raise
        self._numbers += 1
        carrier = Carrier(conn, lease_s=self.lease_s, number=self._numbers)
        carrier.start()
        return carrier

    async def release(self, carried: CarriedConnection, *, clean: bool = True) -> None:
        """``_release``, shielded: a lease ended by a cancellation can be cancelled again
        while it gives its lock back (Temporal's cancel beside the lost lease's own), and an
        unlock cut short there would leave the run's lock held on a session that lives on,
        so that no later attempt could claim it. The release finishes whatever its caller
        does; the caller's cancellation is raised after it."""
        task = asyncio.ensure_future(self._release(carried, clean=clean))
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            await asyncio.wait([task])
            raise

    async def _release(self, carried: CarriedConnection, *, clean: bool) -> None:
        """End a lease: give its run's lock back (before the activity returns), or break the
        carrier when its session is not idle (a statement or a transaction left open). A
        lease that ended with an exception (``clean`` False: lost ownership, a step failure,
        a cancel) on a carrier that carries no other run closes the session instead, as a
        session of its own would have been: it serves no later lease. Never raises for the
        session's state."""
        carrier = carried.carrier
        try:
            if not clean and not carrier.broken and set(carrier.runs) <= {carried.run_id}:
                await carrier.break_(reason=f"the lease of run {carried.run_id} ended with an error")
            if not carrier.broken and not carried.released:
                try:
                    async with asyncio.timeout(self.lease_s), carrier.held(carried.scope) as conn:
                        if conn.info.transaction_status != pq.TransactionStatus.IDLE:
                            raise LostOwnership("session not idle")
                        cur = await conn.execute(f"SELECT pg_advisory_unlock({lock_key_sql})", (carried.run_id,))
                        row = await cur.fetchone()
                        if not (row and row[0]):
                            raise LostOwnership("the run's lock was not held")
                except (psycopg.Error, OSError, TimeoutError, LostOwnership) as exc:
                    await carrier.break_(reason=f"release of run {carried.run_id}: {type(exc).__name__}")
        finally:
            carried.released = True
            carrier.runs.pop(carried.run_id, None)
            if self._owned.get(carried.run_id) is carried:
                del self._owned[carried.run_id]
            async with self._room:
                idle = [c for c in self._live() if not c.runs]
                for extra in idle[IDLE_CARRIERS:]:
                    self._carriers.remove(extra)
                    await extra.stop()
                self._room.notify_all()

    async def close(self) -> None:
        """Close every carrier (their locks are freed with their sessions)."""
        if self._warm is not None:
            self._warm.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._warm
        async with self._room:
            carriers, self._carriers = self._carriers, []
        for carrier in carriers:
            await carrier.stop()
