"""One exception tree for ``qimpl``; each ``code`` is the string the API returns.

    QimplError (code)
    ├── LostOwnership          a fenced write: stale row_version/attempt or terminal run (R-EXEC-7)
    ├── DeadlinePassed         the database refused a write: the run's deadline passed (R-EXEC-8)
    ├── LockNotAcquired        another owner holds the run's advisory lock (R-EXEC-2)
    ├── LeaseSessionUnavailable  no ready lease session within the lease: retried (R-EXEC-2)
    ├── RunNotFound            run_not_found (R-AUTH-1)
    ├── DispatchUnknown        durable_dispatch_unknown (R-CREATE-5)
    ├── UnsafeDatabaseRole     database_role_unsafe: a process would bypass row-level security (R-AUTH-4)
    └── ProviderFailed         a provider call failed; ``code`` is a fixed word, never the provider's text
        └── ProviderTimedOut   provider_timeout (also a TimeoutError: R-EXEC-12)
"""

from __future__ import annotations

__all__ = ["SAFE_MESSAGES", "DeadlinePassed", "DispatchUnknown", "IncompleteDatabaseRole",
           "LeaseSessionUnavailable", "LockNotAcquired", "LostOwnership", "MigrationRefused",
           "ProviderFailed", "ProviderTimedOut", "QimplError", "RunNotFound", "UnsafeDatabaseRole"]


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


class LeaseSessionUnavailable(QimplError):
    """No ready lease session within the lease (``qimpl.db.lease_carriers``): the
    database does not accept connections, or every session is in use. Nothing was
    claimed or written; the attempt is retried. Not a lost ownership."""

    code = "lease_session_unavailable"


class RunNotFound(QimplError):
    code = "run_not_found"


class DispatchUnknown(QimplError):
    code = "durable_dispatch_unknown"


class UnsafeDatabaseRole(QimplError):
    """The role a process connects as escapes row-level security (superuser, BYPASSRLS,
    owner of a tenant table or a member of its owner's role): the process refuses to
    start (R-AUTH-4)."""

    code = "database_role_unsafe"


class IncompleteDatabaseRole(UnsafeDatabaseRole):
    """The worker's (or the one-shot sweep's) role lacks ``qimpl_worker_role``, which
    alone may call the worker's functions (the takeover watcher's orphan query, event
    pruning): the process refuses to start rather than fail at each sweep."""

    code = "database_role_incomplete"


class MigrationRefused(QimplError):
    """A migration was not started: the migrating role cannot see every tenant's rows
    (``qimpl/db/migrations/env.py``, R-OPS-1)."""

    code = "migration_refused"


class ProviderFailed(QimplError):
    """A provider call failed (R-PROV-1): one counted failure of the step (R-EXEC-6). The
    instance's ``code`` (``provider_http_500``, ``provider_unreachable``,
    ``provider_malformed_response``, ...) is its whole message: a provider's own error text
    may echo a prompt, a header or a key, so none of it is kept."""

    code = "provider_failed"

    def __init__(self, code: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(code)
        self.code = code
        #: Seconds the provider asked to wait before the next call (HTTP ``Retry-After``),
        #: honoured within the run's deadline (``qimpl.backoff``); None when it said nothing.
        self.retry_after_s = retry_after_s


class ProviderTimedOut(ProviderFailed, TimeoutError):
    """The provider's own timeout (a read or request timeout): a counted failure, never an
    expiry; only the deadline expires a run (R-EXEC-12)."""

    code = "provider_timeout"

    def __init__(self, code: str = "provider_timeout") -> None:
        super().__init__(code)


#: The fixed ``error_message`` of each ``error_code`` a run can end with (R-EXEC-6):
#: never an exception text, a trace, a secret or a grant.
SAFE_MESSAGES: dict[str, str] = {
    "agent_attempts_exhausted": "the agent could not complete after repeated attempts",
    "agent_step_asks_exhausted": "one step of the agent was asked of the provider too many times "
                                 "without its result being saved",
    "agent_activity_failed": "the agent activity failed and cannot be retried",
    "deadline_exceeded": "the run's deadline passed",
    "workflow_vanished": "the run's workflow closed without it; it cannot continue",
}
