"""The pytest module behind ``qualify run -n N``: pytest-xdist spreads the scenarios over N
workers, each with its own stack (R-Q-7). Not collected by the project's own test suite;
``qualify.session`` runs it with ``QUALIFY_XDIST_SPEC`` set and merges what it writes:
one scenario document per scenario in ``<report_dir>/.docs/`` and each worker's stack
description in ``<report_dir>/.stacks/``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

SPEC: dict[str, Any] = json.loads(os.environ.get("QUALIFY_XDIST_SPEC", '{"ids": []}'))


@pytest.fixture(scope="session")
def qualify_stack() -> Iterator[Any]:
    from qualify.stack import make_stack

    stack = make_stack(SPEC["stack_kind"], pg_dsn=SPEC["pg_dsn"], temporal_address=SPEC["temporal_address"],
                       timers=SPEC.get("timers", "default"))
    info = stack.start()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    out = Path(SPEC["report_dir"]) / ".stacks"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{worker}.json").write_text(json.dumps({k: v for k, v in asdict(info).items() if k != "pg_dsn"}))
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="session")
def spawn_policy() -> Iterator[Any]:
    from qualify.forkserver import SpawnPolicy

    policy = SpawnPolicy(SPEC.get("spawn", "auto"))
    try:
        yield policy
    finally:
        policy.stop()


@pytest.mark.parametrize("scenario_id", SPEC["ids"])
def test_scenario(scenario_id: str, qualify_stack: Any, spawn_policy: Any) -> None:
    from qualify.session import _run_one, resolve

    if SPEC.get("schedule") and scenario_id == SPEC.get("schedule_id"):
        (sc,) = resolve([], seed=SPEC["seed"], schedule_path=Path(SPEC["schedule"]))
    else:
        (sc,) = resolve([scenario_id], seed=SPEC["seed"])
    report_dir = Path(SPEC["report_dir"])
    doc = _run_one(qualify_stack, sc, seed=SPEC["seed"], report_dir=report_dir, reruns=SPEC["reruns"],
                   stack_kind=SPEC["stack_kind"], spawn_policy=spawn_policy)
    out = report_dir / ".docs"
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f"{scenario_id}.json.tmp"  # renamed whole: the session reads it as it lands
    tmp.write_text(json.dumps(doc, default=str))
    tmp.rename(out / f"{scenario_id}.json")
