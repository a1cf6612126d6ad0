"""``qimpl.db.server_settings.setting_sql``: a session's setting in its base unit, read
with ``current_setting`` instead of ``pg_settings`` (issue 21: seven ``pg_settings`` reads
were 4 ms of the server's CPU per run). Judged against ``pg_settings`` itself, and
through the lease and the ready sessions it serves: a tighter non-zero server value is
kept, a looser one bounded (R-EXEC-11, R-EXEC-2)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from qimpl.db.lease import OwnershipLease
from qimpl.db.server_settings import setting_sql
from qualify.stack._embedded import WORKER_ROLE, with_user

#: (setting, value set, scale): each unit PostgreSQL shows a time in, zero, a count,
#: and the TCP settings, whose values come from the socket.
CASES = [
    ("idle_session_timeout", "1500", 1000), ("idle_session_timeout", "2000", 1000),
    ("idle_session_timeout", "300000", 1000), ("idle_session_timeout", "3600000", 1000),
    ("idle_session_timeout", "86400000", 1000), ("idle_session_timeout", "90061001", 1000),
    ("idle_session_timeout", "0", 1000), ("lock_timeout", "2147483647", 1000),
    ("client_connection_check_interval", "100", 1000), ("tcp_user_timeout", "2000", 1000),
    ("tcp_keepalives_idle", "7200", 1), ("tcp_keepalives_idle", "1", 1),
    ("tcp_keepalives_count", "3", 1), ("tcp_keepalives_count", "0", 1),
    ("statement_timeout", "61000", 1000), ("tcp_keepalives_interval", "75", 1),
]


@pytest.fixture(scope="module")
def dsn(stack: Any) -> str:
    return with_user(str(stack.create_database()), WORKER_ROLE)


@pytest.mark.req("R-EXEC-11")
@pytest.mark.parametrize(("name", "value", "scale"), CASES)
def test_a_setting_reads_as_pg_settings_has_it(dsn: str, name: str, value: str, scale: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT set_config(%s, %s, false)", (name, value))
        row = conn.execute(f"SELECT {setting_sql('%s', scale)}, setting::bigint FROM pg_settings"
                           " WHERE name = %s", (name, name)).fetchone()
        assert row is not None
        assert row[0] == row[1], f"{name} = {value}: read {row[0]}, pg_settings has {row[1]}"


@pytest.mark.req("R-EXEC-11")
def test_a_setting_the_server_lacks_reads_null(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute(f"SELECT {setting_sql('%s', 1000)}", ("no_such_setting",)).fetchone() == (None,)


def _with_options(dsn: str, **settings: str) -> str:
    return make_conninfo(dsn, options=" ".join(f"-c {k}={v}" for k, v in settings.items()))


@pytest.mark.req("R-EXEC-11")
def test_the_lease_keeps_a_tighter_server_value_and_bounds_a_looser_one(dsn: str) -> None:
    """Best-effort settings: at most the lease (1.5 s), a tighter non-zero value kept."""
    shown = ("SELECT current_setting('client_connection_check_interval'),"
             " current_setting('tcp_user_timeout'), current_setting('idle_session_timeout')")

    async def lease_sees(server: dict[str, str]) -> tuple[Any, ...]:
        async with OwnershipLease(_with_options(dsn, **server), str(uuid.uuid4()), lease_s=1.5,
                                  application_name="settings-test", tenant_id="t") as lease:
            cur = await lease.conn.execute(shown)
            row = await cur.fetchone()
            assert row is not None
            return tuple(row)

    tight = asyncio.run(lease_sees({"client_connection_check_interval": "50", "tcp_user_timeout": "700"}))
    assert tight == ("50ms", "700", "1500ms"), "a tighter server value was loosened"
    loose = asyncio.run(lease_sees({"client_connection_check_interval": "10s", "tcp_user_timeout": "0"}))
    assert loose == ("1500ms", "1500", "1500ms"), "a looser (or unset) server value was kept"
