"""Scenario families, one module each; importing this package registers them all."""

from qualify.scenarios import (  # noqa: F401  (registers)
    api,
    approvals,
    basic,
    cancel,
    contract,
    deadline,
    dispatch,
    events,
    failures,
    infra,
    keyed,
    lease,
    legacy,
    lifecycle,
    listing,
    matrix,
    network,
    probes,
    providers,
    reconciler,
    scale,
    schema,
    security,
    stream_bounds,
    takeover,
    tool_kinds,
    tools,
)
from qualify.scenarios.base import REGISTRY, Scenario, ScenarioContext, scenario

__all__ = ["REGISTRY", "Scenario", "ScenarioContext", "scenario"]
