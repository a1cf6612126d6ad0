from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from qimpl.crashpoints import CrashPoint, parse_directive
from qimpl.provider import StepContext
from qualify.fakes.synthetic import Script, SyntheticProvider, make_prompt


@pytest.mark.req("R-Q-4")
def test_parse_directive() -> None:
    d = parse_directive("a.b:kill, c:hold@3")
    assert d["a.b"].action == "kill" and d["a.b"].nth == 1
    assert d["c"].action == "hold" and d["c"].nth == 3
    assert parse_directive("") == {}
    with pytest.raises(ValueError):
        parse_directive("a:explode")
    with pytest.raises(ValueError):
        parse_directive("a:kill@0")


@pytest.mark.req("R-Q-4")
def test_unarmed_crash_point_is_inert() -> None:
    point = CrashPoint("unit.test", "doc")
    point.reach(x=1)
    assert point.reached == 1


def test_stream_keys_are_redacted_from_check_details() -> None:
    from qualify.scenarios.base import redact

    text = '{"run_id": "r", "stream_key": "9FqacdIMu9lJON6ZrXxO3mYiC1GFBpJA"}'
    assert "9Fqac" not in redact(text) and '"stream_key": "<redacted>"' in redact(text)


@pytest.mark.req("R-Q-3")
def test_script_refuses_unknown_keys() -> None:
    with pytest.raises(ValueError):
        make_prompt(stepz=3)
    s = Script.from_prompt(make_prompt(steps=2, fail={"steps": [2], "attempts": [1]}))
    assert s.fails(2, 1) and not s.fails(2, 2) and not s.fails(1, 1)
    assert Script.from_prompt("plain text").steps == 3


@pytest.mark.req("R-Q-3")
def test_synthetic_provider_records_every_call(tmp_path: Path) -> None:
    p = SyntheticProvider({"control_dir": str(tmp_path)})
    prompt = make_prompt(steps=2, answer="A")

    def ctx(step: int, state: dict) -> StepContext:  # type: ignore[type-arg]
        return StepContext(run_id="r", tenant_id="t", generation=1, attempt=1, step=step,
                           prompt=prompt, state=state)

    r1 = asyncio.run(p.step(ctx(1, {})))
    r2 = asyncio.run(p.step(ctx(2, dict(r1.state))))
    assert r1.answer is None and r2.answer == "A" and r2.state == {"trail": [1, 2]}
    assert len((tmp_path / "provider_calls.jsonl").read_text().splitlines()) == 2
