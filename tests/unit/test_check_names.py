"""A scenario's checks are named alike in every run of the same code: ``qualify diff`` and
the gate compare checks by name, so an id in a name reads as one check removed and another
added (a tester saw 19 such names in three scenarios, 2026-12-06)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from qualify.errors import HarnessError
from qualify.scenarios.base import ScenarioContext


def _context() -> ScenarioContext:
    return ScenarioContext(deployment=SimpleNamespace(dsn=""), processes=None, history=None,  # type: ignore[arg-type]
                           nemesis=None, rng=random.Random(0))  # type: ignore[arg-type]


@pytest.mark.req("R-Q-6")
@pytest.mark.parametrize("name", ["run 709f3731 completed", "fbbb822e: the answer (202) agrees with the record",
                                  "key 3f2a9c0d1e: replayed"])
def test_a_check_named_with_an_id_is_a_harness_error(name: str) -> None:
    ctx = _context()
    with pytest.raises(HarnessError, match="carries an id"):
        ctx.expect(name, True)
    assert ctx.checks == []


@pytest.mark.req("R-Q-6")
@pytest.mark.parametrize("name", ["each within 10 s (worst 1.11 s)", "the 410 came at once (0.03 s, bound 1 s)"])
def test_a_check_named_with_a_measurement_is_a_harness_error(name: str) -> None:
    ctx = _context()
    with pytest.raises(HarnessError, match="carries a measurement"):
        ctx.expect(name, True)
    assert ctx.checks == []


@pytest.mark.req("R-Q-6")
@pytest.mark.parametrize("name", ["every run completed", "the resume -1000 ms from its deadline: the answer agrees",
                                  "deadbeef is a word here", "12345678 is a number", "within the lease + 1.5 s (3.5 s)"])
def test_a_check_named_in_words_and_numbers_is_recorded(name: str) -> None:
    ctx = _context()
    assert ctx.expect(name, True, "run 709f3731: completed")
    assert [c.name for c in ctx.checks] == [name]


@pytest.mark.req("R-Q-6")
def test_a_check_asserted_again_is_one_check() -> None:
    """An ``expect`` in a retry loop appeared once per round: the report counted it twice in
    one run and not at all in a run whose first round succeeded (a reviewer's finding)."""
    ctx = _context()
    assert ctx.expect("while in flight: 409", True, "409 first", "R-CREATE-2")
    assert not ctx.expect("while in flight: 409", False, "500 second", "R-CREATE-2")
    assert ctx.expect("while in flight: 409", True, "409 third", "R-CREATE-2", judged=2)
    (check,) = ctx.checks
    assert (check.ok, check.judged, check.requirements) == (False, 4, ("R-CREATE-2",))
    assert check.detail == "500 second [asserted 3 times]"
