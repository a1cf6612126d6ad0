"""Scenario families, one module each; importing this package registers them all."""

from qualify.scenarios import (  # noqa: F401  (registers)
    api,
    approvals,
    basic,
    contract,
    deadline,
    events,
    failures,
    infra,
    lease,
    legacy,
    lifecycle,
    listing,
    matrix,
    network,
    probes,
    providers,
    reconciler,
    schema,
    security,
    takeover,
    tools,
)
from qualify.scenarios.base import REGISTRY, Scenario, ScenarioContext, scenario

__all__ = ["REGISTRY", "Scenario", "ScenarioContext", "scenario"]
