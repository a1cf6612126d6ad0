"""Scenario families, one module each; importing this package registers them all."""

from qualify.scenarios import api, basic, infra, legacy, lifecycle, reconciler  # noqa: F401  (registers)
from qualify.scenarios.base import REGISTRY, Scenario, ScenarioContext, scenario

__all__ = ["REGISTRY", "Scenario", "ScenarioContext", "scenario"]
