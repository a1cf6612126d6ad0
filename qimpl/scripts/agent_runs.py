"""One-shot operator sweep (R-OPS-4): ``python -m qimpl.scripts.agent_runs --tenant T``.

Runs one reconciler sweep per ``--tenant`` with the same code the worker runs, prints one
JSON line per tenant with what it did, and exits 0. Exits 2 with a clear message when the
database cannot be reached, 3 when Temporal cannot (nothing is changed then).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys

import psycopg
from temporalio.client import Client

from qimpl.logs import temporal_runtime
from qimpl.reconciler import SWEEP_LIMIT, sweep_tenant
from qimpl.settings import get_settings

__all__ = ["main"]


async def _run(tenants: list[str], limit: int) -> int:
    settings = get_settings()
    try:
        conn = await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True,
                                                     connect_timeout=5,
                                                     application_name="qimpl-sweep")
    except psycopg.Error as exc:
        print(f"agent_runs: cannot reach the database: {type(exc).__name__}", file=sys.stderr)
        return 2
    try:
        try:
            client = await asyncio.wait_for(
                Client.connect(settings.temporal_address, namespace=settings.temporal_namespace,
                               runtime=temporal_runtime()),
                timeout=settings.dispatch_timeout_s)
        except Exception as exc:  # noqa: BLE001 - reported as a clear message and exit code
            print(f"agent_runs: cannot reach Temporal at {settings.temporal_address}: "
                  f"{type(exc).__name__}", file=sys.stderr)
            return 3
        name = f"sweep:{socket.gethostname()}:{os.getpid()}"
        for tenant in tenants:
            res = await sweep_tenant(conn, client, settings, tenant, reconciler=name, limit=limit,
                                     grace_s=settings.reconcile_grace_s)
            print(json.dumps(res.as_dict()))
        return 0
    finally:
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qimpl.scripts.agent_runs",
                                     description="Run one reconciler sweep now.")
    parser.add_argument("--tenant", action="append", required=True, help="tenant id (repeatable)")
    parser.add_argument("--limit", type=int, default=SWEEP_LIMIT, help="candidates per tenant")
    args = parser.parse_args(argv)
    return asyncio.run(_run(args.tenant, args.limit))


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter finalisation under the Temporal core's threads
