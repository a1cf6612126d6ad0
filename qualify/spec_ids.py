"""Every requirement ID of ``shared/spec/durable-runs.md``, in the spec's order, with its
section. The report's requirement matrix is drawn over this list; a test keeps it equal
to the spec when the spec is present."""

from __future__ import annotations

__all__ = ["REQUIREMENTS", "section_of"]

REQUIREMENTS: tuple[str, ...] = (
    "R-CREATE-1", "R-CREATE-2", "R-CREATE-3", "R-CREATE-4", "R-CREATE-5", "R-CREATE-6",
    "R-CREATE-7",
    "R-STATE-1", "R-STATE-2",
    "R-READ-1", "R-READ-2", "R-READ-3", "R-READ-4", "R-READ-5",
    "R-CANCEL-1", "R-RESUME-1", "R-RESUME-2", "R-RESUME-3", "R-APPROVAL-1",
    "R-AUTH-1", "R-AUTH-2", "R-AUTH-3", "R-AUTH-4", "R-LEGACY-1",
    "R-EXEC-1", "R-EXEC-2", "R-EXEC-3", "R-EXEC-4", "R-EXEC-5", "R-EXEC-6", "R-EXEC-7",
    "R-EXEC-8", "R-EXEC-9", "R-EXEC-10", "R-EXEC-11", "R-EXEC-12", "R-EXEC-13", "R-EXEC-14",
    "R-TOOL-1", "R-TOOL-2", "R-TOOL-3", "R-TOOL-4", "R-TOOL-5",
    "R-EVENT-1", "R-EVENT-2", "R-EVENT-3", "R-EVENT-4", "R-EVENT-5", "R-EVENT-6",
    "R-Q34-1", "R-Q34-2", "R-Q34-3",
    "R-OPS-1", "R-OPS-2", "R-OPS-3", "R-OPS-4", "R-OPS-5", "R-OPS-6", "R-OPS-7",
    "R-OPS-8",
    "R-Q-1", "R-Q-2", "R-Q-3", "R-Q-4", "R-Q-5", "R-Q-6", "R-Q-7", "R-Q-8", "R-Q-9", "R-Q-10",
    "R-Q-11", "R-Q-12", "R-Q-13",
    "R-PROV-1",
)


def section_of(req: str) -> str:
    """``R-EXEC-7`` -> ``EXEC``."""
    return req.split("-")[1]
