"""Replay the tracked corpus of once-failing cases (``qualify repro --save-corpus``):
each must pass now. An entry is a scenario id and seed, or a saved random schedule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from qualify.runner import run_scenario
from qualify.scenarios import REGISTRY
from qualify.scenarios.random_mix import random_scenario, schedule_scenario
from qualify.schedule import Schedule
from qualify.verdict import Verdict

CORPUS = Path(__file__).parents[1] / "corpus.jsonl"
ENTRIES = [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]


def test_the_corpus_is_not_empty() -> None:
    assert ENTRIES, "tests/corpus.jsonl lost its entries"


@pytest.mark.req("R-Q-7")
@pytest.mark.parametrize("entry", ENTRIES, ids=[f"{e['scenario']}@{e['seed']}" for e in ENTRIES])
def test_corpus_entry_passes(entry: dict[str, Any], stack: Any, tmp_path: Path) -> None:
    if "schedule" in entry:
        sc = schedule_scenario(Schedule.from_json(json.dumps(entry["schedule"])), entry["scenario"])
    elif entry["scenario"].startswith("random-"):
        sc = random_scenario(int(entry["scenario"].removeprefix("random-")), entry["seed"])
    else:
        sc = REGISTRY[entry["scenario"]]
    result = run_scenario(stack, sc, seed=entry["seed"], out_dir=tmp_path)
    assert result.verdict is Verdict.PASS, [c for c in result.checks if c.ok is not True]
