"""Verdicts, merged worst-first, each with its own exit code (R-Q-6).

    fail > crashed > unknown > vacuous > flaky > pass

``unknown``: a checker raised (never green). ``vacuous``: a fault hit nothing, so the
scenario proved nothing. ``crashed``: the harness itself broke. ``flaky``: a failure
that did not reproduce on every re-run (reported as ``flaky k/n``).
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["EXIT_CODES", "Verdict", "merge"]


class Verdict(StrEnum):
    PASS = "pass"
    FLAKY = "flaky"
    VACUOUS = "vacuous"
    UNKNOWN = "unknown"
    CRASHED = "crashed"
    FAIL = "fail"

    @property
    def severity(self) -> int:
        return _ORDER.index(self)


_ORDER = [Verdict.PASS, Verdict.FLAKY, Verdict.VACUOUS, Verdict.UNKNOWN, Verdict.CRASHED, Verdict.FAIL]

#: Process exit codes of ``qualify run``.
EXIT_CODES: dict[Verdict, int] = {
    Verdict.PASS: 0,
    Verdict.FAIL: 1,
    Verdict.CRASHED: 2,
    Verdict.UNKNOWN: 3,
    Verdict.VACUOUS: 4,
    Verdict.FLAKY: 5,
}


def merge(verdicts: list[Verdict]) -> Verdict:
    """The worst of ``verdicts``; ``pass`` for none."""
    return max(verdicts, key=lambda v: v.severity, default=Verdict.PASS)
