"""One exception tree for ``qimpl``; each ``code`` is the string the API returns.

    QimplError (code)
    ├── LostOwnership          a fenced write: stale row_version/attempt or terminal run (R-EXEC-7)
    ├── LockNotAcquired        another owner holds the run's advisory lock (R-EXEC-2)
    ├── RunNotFound            run_not_found (R-AUTH-1)
    └── DispatchUnknown        durable_dispatch_unknown (R-CREATE-5)
"""

from __future__ import annotations

__all__ = ["DispatchUnknown", "LockNotAcquired", "LostOwnership", "QimplError", "RunNotFound"]


class QimplError(Exception):
    code: str = "internal_error"


class LostOwnership(QimplError):
    code = "lost_ownership"


class LockNotAcquired(QimplError):
    code = "run_lock_busy"


class RunNotFound(QimplError):
    code = "run_not_found"


class DispatchUnknown(QimplError):
    code = "durable_dispatch_unknown"
