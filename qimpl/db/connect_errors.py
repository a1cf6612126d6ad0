"""What a failed connection to PostgreSQL says to an operator (pure; no I/O).

libpq reports both kinds of failure as ``psycopg.OperationalError`` with no SQLSTATE: a
server that could not be reached (refused, timed out, no such host) and a server that
answered and refused the session (a wrong password, an unknown role or database, no
``pg_hba.conf`` entry). They need different fixes, so the processes' start messages tell
them apart: a refusal quotes the server's own ``FATAL`` line (it names the role or the
database, never a password), anything else is "cannot reach". The server's language
(``lc_messages``) does not matter: the split is on libpq's ``FATAL:`` prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ConnectProblem", "connect_problem"]

#: At most this many characters of the server's line are quoted.
MAX_DETAIL_CHARS = 200


@dataclass(frozen=True)
class ConnectProblem:
    """``code``: ``database_refused`` (the server answered and refused the session) or
    ``database_unreachable``; ``summary``: one clause for a start message, e.g.
    ``the database refused the connection: password authentication failed for user "qimpl"``."""

    code: str
    summary: str


def connect_problem(exc: BaseException) -> ConnectProblem:
    """Classify a failed connect (``psycopg.OperationalError`` or any other exception)."""
    text = str(exc)
    _, fatal, rest = text.partition("FATAL:")
    if fatal:
        detail = " ".join(rest.split("\n")[0].split())[:MAX_DETAIL_CHARS]
        return ConnectProblem("database_refused", f"the database refused the connection: {detail}")
    return ConnectProblem("database_unreachable", f"cannot reach the database: {type(exc).__name__}")
