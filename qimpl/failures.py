"""Which failures of a step are retried as they are and which are counted (pure).

A step fails either in the provider or after it, while its result is being stored.
Counted failures (R-EXEC-6, R-EXEC-12) end the run ``failed`` after
``QIMPL_PROVIDER_MAX_FAILURES``, so a step is asked of the provider a bounded number of
times: every provider error (its own timeouts included — only the run's deadline expires
a run), and every value the database refuses to store (class 22 data exceptions such as
a NUL character, 23 integrity, 42 a statement it cannot run, 54 a program limit), since
asking again would only produce the same refusal.

Transient failures are not the run's fault and are not counted: a lost or terminated
session, a lock or idle timeout, a serialization failure or deadlock, a server short of
resources or shutting down. The attempt stops as having lost ownership and the next
attempt retries from the last checkpoint (R-EXEC-4); the deadline bounds them.
"""

from __future__ import annotations

import psycopg

__all__ = [
    "TRANSIENT_SQLSTATES",
    "TRANSIENT_SQLSTATE_CLASSES",
    "is_counted_storage_failure",
    "is_transient_sqlstate",
]

#: Connection exception, transaction rollback, insufficient resources, operator
#: intervention (admin shutdown, idle-session timeout), system error.
TRANSIENT_SQLSTATE_CLASSES = frozenset({"08", "40", "53", "57", "58"})
#: lock_not_available (lock_timeout), idle_in_transaction_session_timeout.
TRANSIENT_SQLSTATES = frozenset({"55P03", "25P03"})


def is_transient_sqlstate(sqlstate: str | None) -> bool:
    """True when a database error with ``sqlstate`` says nothing about the stored value.

    ``None`` (no SQLSTATE: the client lost the connection) is transient.
    """
    if sqlstate is None:
        return True
    return sqlstate in TRANSIENT_SQLSTATES or sqlstate[:2] in TRANSIENT_SQLSTATE_CLASSES


def is_counted_storage_failure(exc: BaseException) -> bool:
    """True when storing a step's result failed because of the result itself: a database
    refusal that is not transient, a client-side refusal (psycopg's ``DataError`` for a
    NUL character carries no SQLSTATE), or a value that is not JSON or not a count
    (``ValueError``, ``TypeError``, ``OverflowError``). False for connection loss and other
    transient errors, and for anything else (a bug: let it surface)."""
    if isinstance(exc, psycopg.Error):
        if exc.sqlstate is None:
            return not isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
        return not is_transient_sqlstate(exc.sqlstate)
    return isinstance(exc, ValueError | TypeError | OverflowError)
