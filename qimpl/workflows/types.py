"""Values passed between the workflow and its activities (serialised by Temporal)."""

from __future__ import annotations

from dataclasses import dataclass

from qimpl.backoff import DEFAULT_BASE_S, DEFAULT_MAX_S

__all__ = ["FailInput", "RunInput"]


@dataclass(frozen=True)
class RunInput:
    """One generation of one run. ``deadline_at`` is ISO 8601 UTC (R-EXEC-8)."""

    run_id: str
    tenant_id: str
    generation: int
    deadline_at: str
    #: Temporal's heartbeat timeout, seconds. The API always sends it; the default is
    #: the value of the time when inputs could lack it (``qimpl.settings`` has its own).
    heartbeat_timeout_s: float = 2.0
    max_provider_failures: int = 5
    #: The ownership lease, seconds. The API always sends the one in effect
    #: (``Settings.lease``); None only in inputs dispatched before it existed, when the
    #: lease was the heartbeat timeout (R-EXEC-11).
    lease_s: float | None = None
    #: The wait after the first counted provider failure, doubling per failure up to
    #: ``failure_backoff_max_s`` (seconds; ``qimpl.backoff``, R-EXEC-6).
    failure_backoff_s: float = DEFAULT_BASE_S
    failure_backoff_max_s: float = DEFAULT_MAX_S
    #: Set the Temporal search attributes of ``qimpl.workflows.search_attributes``
    #: (``QIMPL_TEMPORAL_SEARCH_ATTRIBUTES``); False for inputs dispatched before them.
    search_attributes: bool = False

    @property
    def lease(self) -> float:
        """The ownership lease in seconds."""
        return self.lease_s if self.lease_s is not None else self.heartbeat_timeout_s


@dataclass(frozen=True)
class FailInput:
    """End a generation that no attempt owns: ``state`` is ``failed`` or ``expired``."""

    run_id: str
    generation: int
    error_code: str
    state: str = "failed"
    tenant_id: str = ""
