"""A queued run and an ownership lease on it, for tests that build histories from the real
database with ``RunOwner`` (writer identity, write transactions)."""

from __future__ import annotations

import uuid

import psycopg

from qimpl.db.lease import OwnershipLease

__all__ = ["lease", "queued_run"]


def queued_run(dsn: str) -> str:
    """Insert a ``queued`` run of tenant ``t`` with an hour to its deadline; returns its id."""
    run_id = str(uuid.uuid4())
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(
            "INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt, stream_key,"
            " deadline_at) VALUES (%s, 't', 'p', 'a', 'queued', 'x', 'k', now() + interval '1 hour')",
            (run_id,))
    return run_id


def lease(dsn: str, run_id: str) -> OwnershipLease:
    """A 30 s ownership lease on ``run_id`` (application name ``test-owner``)."""
    return OwnershipLease(dsn, run_id, lease_s=30.0, application_name="test-owner", tenant_id="t")
