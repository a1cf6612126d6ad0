"""One-shot operator sweep (R-OPS-4): ``python -m qimpl.scripts.agent_runs --tenant T``.

Runs one reconciler sweep per ``--tenant`` with the same code the worker runs, prints one
JSON line per tenant with what it did on stdout, and a warning line on stderr for a
tenant that has no runs at all (a typo, or a tenant that never created one: tenants are
case-sensitive). Exit codes (nothing is changed unless it is 0):

    0   done
    2   the database cannot be reached
    3   Temporal cannot be reached
    64  usage error: a bad command line, or a missing or malformed setting
        (one line naming the variable, as the API and the worker print it), or a
        ``QIMPL_DATABASE_URL`` whose role escapes row-level security (a superuser,
        BYPASSRLS, or a table's owner): the sweep connects as the worker's restricted
        role, as the API and the worker do (R-AUTH-4)
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sys
from typing import Any

import psycopg
from temporalio.client import Client

from qimpl.db.connect_errors import connect_problem
from qimpl.db.roles import refuse_unsafe_role
from qimpl.errors import UnsafeDatabaseRole
from qimpl.logs import temporal_runtime
from qimpl.reconciler import SWEEP_LIMIT, sweep_tenant
from qimpl.scripts import EXIT_USAGE, UsageParser, piped
from qimpl.settings import Settings, load_or_exit

__all__ = ["EXIT_DATABASE", "EXIT_TEMPORAL", "EXIT_USAGE", "main"]

EXIT_DATABASE, EXIT_TEMPORAL = 2, 3

#: The role check's logger: the sweep prints its own one line on stderr instead.
log = logging.getLogger("qimpl.sweep")
log.addHandler(logging.NullHandler())
log.propagate = False


async def _has_runs(conn: psycopg.AsyncConnection[Any], tenant: str) -> bool:
    """Whether ``tenant`` has any run (``conn`` is scoped to it by the sweep; the filter
    holds also for a role that bypasses row-level security)."""
    cur = await conn.execute("SELECT EXISTS (SELECT 1 FROM runs WHERE tenant_id = %s)", (tenant,))
    row = await cur.fetchone()
    return bool(row and row[0])


async def _run(settings: Settings, tenants: list[str], limit: int) -> int:
    try:
        conn = await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True,
                                                     connect_timeout=5,
                                                     application_name="qimpl-sweep")
    except psycopg.Error as exc:
        print(f"agent_runs: {connect_problem(exc).summary}", file=sys.stderr)
        return EXIT_DATABASE
    try:
        try:
            await refuse_unsafe_role(conn, "sweep", log, worker_functions=True)
        except UnsafeDatabaseRole as exc:
            print(f"agent_runs: {exc} ({exc.code})", file=sys.stderr)
            return EXIT_USAGE
        try:
            client = await asyncio.wait_for(
                Client.connect(settings.temporal_address, namespace=settings.temporal_namespace,
                               runtime=temporal_runtime()),
                timeout=settings.dispatch_timeout_s)
        except Exception as exc:  # noqa: BLE001 - reported as a clear message and exit code
            print(f"agent_runs: cannot reach Temporal at {settings.temporal_address}: "
                  f"{type(exc).__name__}", file=sys.stderr)
            return EXIT_TEMPORAL
        name = f"sweep:{socket.gethostname()}:{os.getpid()}"
        for tenant in tenants:
            res = await sweep_tenant(conn, client, settings, tenant, reconciler=name, limit=limit,
                                     grace_s=settings.reconcile_grace_s)
            print(json.dumps(res.as_dict()), flush=True)
            if not await _has_runs(conn, tenant):
                print(f"agent_runs: warning: tenant {tenant!r} has no runs (is the name right? "
                      "tenants are case-sensitive)", file=sys.stderr, flush=True)
        return 0
    except psycopg.OperationalError as exc:
        print(f"agent_runs: lost the database: {type(exc).__name__}", file=sys.stderr)
        return EXIT_DATABASE
    finally:
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, read the settings (``Settings``), sweep; returns the exit code."""
    parser = UsageParser(prog="python -m qimpl.scripts.agent_runs",
                     description="Run one reconciler sweep now.")
    parser.add_argument("--tenant", action="append", required=True, help="tenant id (repeatable)")
    parser.add_argument("--limit", type=int, default=SWEEP_LIMIT,
                        help=f"candidates per tenant per phase, 1 to {SWEEP_LIMIT} (R-OPS-3)")
    args = parser.parse_args(argv)
    if blank := [t for t in args.tenant if not t.strip()]:
        parser.error(f"--tenant must name a tenant ({len(blank)} given empty)")
    args.tenant = list(dict.fromkeys(args.tenant))  # each tenant swept once, in the order given
    if not 1 <= args.limit <= SWEEP_LIMIT:
        parser.error(f"--limit must be between 1 and {SWEEP_LIMIT} (a sweep looks at most "
                     f"{SWEEP_LIMIT} candidates per tenant)")
    settings = load_or_exit(Settings, "agent_runs")
    return asyncio.run(_run(settings, args.tenant, args.limit))


if __name__ == "__main__":
    try:
        code = piped(main)
    except SystemExit as exc:  # usage and configuration errors: already reported
        code = int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    sys.stderr.flush()
    os._exit(code)  # no interpreter finalisation under the Temporal core's threads
