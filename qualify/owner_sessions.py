"""Which PostgreSQL session is a run's lease (R-EXEC-2): the one that holds the run's
session advisory lock. A worker's lease sessions each carry the locks of many of its runs
(``qimpl.db.lease_carriers``), so a run's session is found by its lock, never by its
``application_name``; the fault that ends it (``pg_terminate_backend``) ends every run it
carried, and the evidence names them (``carried_runs``)."""

from __future__ import annotations

__all__ = ["CARRIED_RUNS_SQL", "LEASE_PIDS_SQL"]

#: The pids of the sessions holding the lock of the run given as the one parameter.
LEASE_PIDS_SQL = ("(SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted"
                  " AND l.objsubid = 1 AND ((l.classid::bigint << 32) | l.objid::bigint)"
                  " = hashtextextended('qimpl-run:' || %s, 0))")

#: ``(run_id, pid)`` of every run whose lock a session holds (the parameter: an array of
#: pids, or NULL for every session): what each lease session carries.
CARRIED_RUNS_SQL = ("SELECT r.run_id::text, l.pid FROM runs r JOIN pg_locks l ON l.locktype = 'advisory'"
                    " AND l.granted AND l.objsubid = 1 AND ((l.classid::bigint << 32) | l.objid::bigint)"
                    " = hashtextextended('qimpl-run:' || r.run_id::text, 0)"
                    " WHERE %s::int[] IS NULL OR l.pid = ANY(%s::int[])")
