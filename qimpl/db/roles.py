"""Start-up check of the database role a process connects as (R-AUTH-4).

Row-level security isolates tenants only for a role it applies to. A superuser and a
BYPASSRLS role skip it; a table's owner skips it unless the table FORCEs it, and even
then may switch FORCE off or drop the policy, as may every member of the owner's role
(with ``pg_has_role(..., 'MEMBER')``, which is how managed PostgreSQL often grants its
administrators). So the API and the worker refuse to start as any of them.

The guards and the audit are triggers, and a session in ``session_replication_role =
replica`` skips every trigger that is not ``ENABLE ALWAYS`` (and every foreign key's
check, which are system triggers): a role that may ``SET`` that parameter (PostgreSQL 15's
``GRANT SET ON PARAMETER``), or a session that starts outside ``origin`` (``ALTER ROLE …
SET session_replication_role``), is refused too (issue 56, item 4).

The worker's SECURITY DEFINER functions (``qimpl_lease_orphans``: every tenant's running
runs with their task tokens; ``qimpl_prune_event_streams``) are granted to
``qimpl_worker_role`` only: the worker and the one-shot sweep need it
(``database_role_incomplete`` without), the API must not have it (issue 56, item 5).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from qimpl.errors import IncompleteDatabaseRole, UnsafeDatabaseRole

__all__ = ["ROLE_SQL", "refuse_unsafe_role", "role_problems"]

#: ``(rolsuper, rolbypassrls, [tables with row-level security whose owner's role the
#: current user is, or is a member of], may it SET session_replication_role, the
#: session's session_replication_role, has it qimpl_worker_role's privileges, is it a
#: member of qimpl_worker_role)`` for the connected role.
ROLE_SQL = """
SELECT r.rolsuper, r.rolbypassrls,
       coalesce(array_agg(c.relname::text ORDER BY c.relname)
                FILTER (WHERE c.oid IS NOT NULL), '{}'),
       has_parameter_privilege(r.rolname, 'session_replication_role', 'SET'),
       current_setting('session_replication_role'),
       EXISTS (SELECT 1 FROM pg_roles w WHERE w.rolname = 'qimpl_worker_role'
               AND pg_has_role(r.oid, w.oid, 'USAGE')),
       EXISTS (SELECT 1 FROM pg_roles w WHERE w.rolname = 'qimpl_worker_role'
               AND pg_has_role(r.oid, w.oid, 'MEMBER'))
FROM pg_roles r
LEFT JOIN pg_class c ON c.relrowsecurity AND c.relkind = 'r' AND pg_table_is_visible(c.oid)
     AND pg_has_role(r.oid, c.relowner, 'MEMBER')
WHERE r.rolname = current_user
GROUP BY r.rolsuper, r.rolbypassrls, r.rolname, r.oid
"""


def role_problems(*, superuser: bool, bypassrls: bool, owned: Sequence[str],
                  sets_replication_role: bool = False, replication_role: str = "origin") -> list[str]:
    """Why a role escapes row-level security or the database's guards (pure): an empty
    list for a safe role."""
    problems = []
    if superuser:
        problems.append("a superuser")
    if bypassrls:
        problems.append("BYPASSRLS")
    if owned:
        problems.append("the owner (or a member of the owner's role) of " + ", ".join(owned))
    if sets_replication_role and not superuser:
        problems.append("a role that may SET session_replication_role (which switches triggers "
                        "and foreign keys off)")
    if replication_role != "origin":
        problems.append(f"a session in session_replication_role = {replication_role} (triggers "
                        "and foreign keys off)")
    return problems


async def refuse_unsafe_role(conn: Any, who: str, log: logging.Logger, *,
                             worker_functions: bool | None = None) -> None:
    """Raise UnsafeDatabaseRole (code ``database_role_unsafe``), after logging why, when
    ``conn``'s role escapes row-level security or the guards (``role_problems``), or
    (``worker_functions=False``, the API) is a member of ``qimpl_worker_role``; raise
    IncompleteDatabaseRole (``database_role_incomplete``) when it lacks that role's
    privileges and ``worker_functions`` is True (the worker, the one-shot sweep)."""
    cur = await conn.execute(ROLE_SQL)
    row = await cur.fetchone()
    problems = role_problems(superuser=bool(row and row[0]), bypassrls=bool(row and row[1]),
                             owned=list(row[2]) if row else [],
                             sets_replication_role=bool(row and row[3]),
                             replication_role=str(row[4]) if row else "origin")
    if worker_functions is False and row and row[6] and not row[0]:
        problems.append("a member of qimpl_worker_role (whose functions read every tenant's runs)")
    if not problems and worker_functions and not (row and row[5]):
        message = (f"the {who} connects as a role without qimpl_worker_role: the takeover watcher's "
                   "orphan query and event pruning would be refused; GRANT qimpl_worker_role TO "
                   "the role (docs/operations.md)")
        log.error(message, extra={"event": "database_role_incomplete"})
        raise IncompleteDatabaseRole(message)
    if problems:
        message = (f"the {who} connects as {' and '.join(problems)}: row-level security and the "
                   "database's guards would not hold; connect as a login role in qimpl_app "
                   "(docs/operations.md)")
        log.error(message, extra={"event": "database_role_unsafe"})
        raise UnsafeDatabaseRole(message)
