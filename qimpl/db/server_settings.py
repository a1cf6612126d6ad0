"""A session's server settings, read cheaply in SQL (R-EXEC-11: the lease reads its
timeouts back; ``qimpl.db.lease``, ``qimpl.db.lease_carriers``)."""

from __future__ import annotations

__all__ = ["at_most_sql", "setting_sql"]


def setting_sql(name_sql: str, scale: int) -> str:
    """SQL: the session's value of the setting named by the SQL expression ``name_sql``, as
    a bigint: for a time setting whose base unit is milliseconds (``scale`` 1000) or
    seconds (``scale`` 1), in that unit; for an integer setting without a unit, itself.
    NULL when the server has no such setting. Not for memory settings (``8MB`` is no
    interval), minute-based ones or reals.

    ``current_setting`` shows a time in the largest unit that keeps it exact (``1500ms``,
    ``2s``, ``5min``, ``1d``), which reads as an ``interval``; ``scale`` turns its seconds
    into the base unit. Zero, -1, counts and the TCP settings (shown from the socket) are
    bare integers already. Cheap, unlike ``pg_settings``, which formats every setting of
    the server at each read (0.4-0.6 ms of the server's CPU; seven such reads were 4.6 ms
    of each run's 16 ms, issue 21)."""
    return ("(SELECT CASE WHEN v ~ '^-?[0-9]+$' THEN v::bigint"
            f" ELSE (extract(epoch FROM v::interval) * {scale})::bigint END"
            f" FROM current_setting({name_sql}, true) AS v)")


def at_most_sql(name_sql: str, cap_sql: str, scale: int) -> str:
    """SQL: the value to set the setting named by ``name_sql`` to so that it is at most the
    SQL integer ``cap_sql`` (its base unit, ``setting_sql``'s ``scale``): the session's own
    value when it is non-zero and within the cap (a tighter value is kept), else the cap."""
    return (f"CASE WHEN {setting_sql(name_sql, scale)} BETWEEN 1 AND {cap_sql}"
            f" THEN current_setting({name_sql}) ELSE ({cap_sql})::text END")
