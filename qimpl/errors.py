"""One exception tree for ``qimpl``; each ``code`` is the string the API returns.

    QimplError (code)
    ├── LostOwnership          a fenced write: stale row_version/attempt or terminal run (R-EXEC-7)
    ├── DeadlinePassed         the database refused a write: the run's deadline passed (R-EXEC-8)
    ├── LockNotAcquired        another owner holds the run's advisory lock (R-EXEC-2)
    ├── RunNotFound            run_not_found (R-AUTH-1)
    ├── DispatchUnknown        durable_dispatch_unknown (R-CREATE-5)
    └── UnsafeDatabaseRole     database_role_unsafe: a process would bypass row-level security (R-AUTH-4)
"""

from __future__ import annotations

__all__ = ["SAFE_MESSAGES", "DeadlinePassed", "DispatchUnknown", "LockNotAcquired", "LostOwnership", "QimplError", "RunNotFound",
           "UnsafeDatabaseRole"]


class QimplError(Exception):
    code: str = "internal_error"


class LostOwnership(QimplError):
    code = "lost_ownership"


class DeadlinePassed(QimplError):
    """The transition guard refused a write because ``deadline_at`` has passed by the
    database's clock (SQLSTATE ``QG006``): the writer expires the run instead of retrying."""

    code = "deadline_exceeded"


class LockNotAcquired(QimplError):
    code = "run_lock_busy"


class RunNotFound(QimplError):
    code = "run_not_found"


class DispatchUnknown(QimplError):
    code = "durable_dispatch_unknown"


class UnsafeDatabaseRole(QimplError):
    """The role a process connects as escapes row-level security (superuser, BYPASSRLS,
    owner of a tenant table or a member of its owner's role): the process refuses to
    start (R-AUTH-4)."""

    code = "database_role_unsafe"


#: The fixed ``error_message`` of each ``error_code`` a run can end with (R-EXEC-6):
#: never an exception text, a trace, a secret or a grant.
SAFE_MESSAGES: dict[str, str] = {
    "agent_attempts_exhausted": "the agent could not complete after repeated attempts",
    "agent_activity_failed": "the agent activity failed and cannot be retried",
    "deadline_exceeded": "the run's deadline passed",
    "workflow_vanished": "the run's workflow closed without it; it cannot continue",
}
