"""Exception tree of the harness.

    QualifyError
    ├── HarnessError         the harness itself broke (verdict ``crashed``)
    └── InvariantViolation   the product broke a checked property (verdict ``fail``)

A checker that raises anything else yields ``unknown``, never ``pass``.
"""

from __future__ import annotations

__all__ = ["HarnessError", "InvariantViolation", "QualifyError"]


class QualifyError(Exception):
    pass


class HarnessError(QualifyError):
    pass


class InvariantViolation(QualifyError):
    pass
