"""Exception tree of the harness.

    QualifyError
    ├── HarnessError         the harness itself broke (verdict ``crashed``, exit 2)
    ├── UsageError           the command was wrong (unknown scenario or stack; exit 64)
    └── InvariantViolation   the product broke a checked property (verdict ``fail``)

A checker that raises anything else yields ``unknown``, never ``pass``.
"""

from __future__ import annotations

__all__ = ["HarnessError", "InvariantViolation", "QualifyError", "UsageError"]


class QualifyError(Exception):
    pass


class HarnessError(QualifyError):
    pass


class UsageError(QualifyError):
    pass


class InvariantViolation(QualifyError):
    pass
