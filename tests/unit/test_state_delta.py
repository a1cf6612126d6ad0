"""Checkpoint state deltas (issue 22, item 5; R-EXEC-3): what is folded back is exactly
what was checkpointed, and a growing state costs linear storage, not quadratic."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qimpl.state_delta import apply, diff, fold

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(max_size=8),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=4), kids, max_size=4),
                    max_leaves=12)
OBJECTS = st.dictionaries(st.sampled_from(["a", "b", "c", "notes", "text"]), JSON, max_size=5)


def _exact(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True)


KEYS = st.sampled_from(["a", "b", "c", "notes", "text"])
#: One step's change to an agent state: grow a list or a string, set a value, drop a key.
CHANGES = st.one_of(
    st.tuples(st.just("grow"), KEYS, st.lists(JSON, min_size=1, max_size=3)),
    st.tuples(st.just("extend"), KEYS, st.text(min_size=1, max_size=20)),
    st.tuples(st.just("set"), KEYS, JSON),
    st.tuples(st.just("unset"), KEYS, st.none()),
)


def _evolve(start: dict[str, Any], steps: list[list[tuple[str, str, Any]]]) -> list[dict[str, Any]]:
    """The states of a run that starts at ``start`` and changes by ``steps``."""
    states, state = [start], dict(start)
    for changes in steps:
        state = json.loads(json.dumps(state))
        for op, key, value in changes:
            if op == "grow":
                state[key] = [*state[key], *value] if isinstance(state.get(key), list) else list(value)
            elif op == "extend":
                state[key] = state[key] + value if isinstance(state.get(key), str) else value
            elif op == "set":
                state[key] = value
            else:
                state.pop(key, None)
        states.append(state)
    return states


@pytest.mark.req("R-EXEC-3")
@settings(max_examples=300, deadline=None)
@given(OBJECTS, st.lists(st.lists(CHANGES, max_size=3), max_size=8))
def test_folding_a_growing_chain_gives_back_every_checkpointed_state(
        start: dict[str, Any], steps: list[list[tuple[str, str, Any]]]) -> None:
    _check_chain(_evolve(start, steps))


@pytest.mark.req("R-EXEC-3")
@settings(max_examples=200, deadline=None)
@given(st.lists(OBJECTS, min_size=1, max_size=6))
def test_folding_the_stored_chain_gives_back_every_checkpointed_state(states: list[dict[str, Any]]) -> None:
    _check_chain(states)


def _check_chain(states: list[dict[str, Any]]) -> None:
    rows: list[tuple[dict[str, Any] | None, dict[str, Any] | None]] = []
    prev: dict[str, Any] | None = None
    for state in states:
        # What the database hands back: JSON round-tripped.
        delta = diff(prev, state) if prev is not None else None
        rows.append((None, json.loads(json.dumps(delta))) if delta is not None
                    else (json.loads(json.dumps(state)), None))
        assert _exact(fold(rows)) == _exact(state)
        prev = state


@pytest.mark.req("R-EXEC-3")
def test_json_equality_is_strict() -> None:
    """``[1]`` then ``[True, 2]`` is not an append of ``[2]``: Python's True == 1 is not JSON's."""
    old, new = {"a": [1], "b": 1, "pad": "p" * 40}, {"a": [True, 2], "b": 1.0, "pad": "p" * 40}
    assert diff(old, new) == {"set": {"a": [True, 2], "b": 1.0}}
    rows = [(old, None), (None, diff(old, new))] if diff(old, new) else [(new, None)]
    assert _exact(fold(rows)) == _exact(new)


@pytest.mark.req("R-EXEC-3")
def test_a_growing_state_stores_linear_bytes() -> None:
    """100 steps each appending a note and growing a transcript: the stored rows sum to
    about the final state's size, not 100 times half of it."""
    prev: dict[str, Any] | None = None
    stored = 0
    state: dict[str, Any] = {}
    for step in range(1, 101):
        state = {"notes": [f"step {i}" for i in range(1, step + 1)], "text": "x" * (40 * step), "step": step}
        delta = diff(prev, state) if prev is not None else None
        stored += len(json.dumps(delta if delta is not None else state))
        prev = state
    final = len(json.dumps(state))
    assert stored < 3 * final, (stored, final)


def test_a_delta_without_a_whole_state_before_it_is_refused() -> None:
    with pytest.raises(ValueError, match="without a whole state"):
        fold([(None, {"set": {"a": 1}})])
    with pytest.raises(ValueError, match="not a list or a string"):
        apply({"a": 1}, {"append": {"a": [2]}})


def test_a_replaced_state_is_stored_whole() -> None:
    assert diff({"a": "x" * 50}, {"b": 1}) is None  # the new state is smaller than any delta
    assert diff({"a": 1}, {"a": "y" * 100}) is None  # the delta is no smaller than the state
    assert diff({"a": "x" * 50, "b": 1}, {"a": "x" * 50, "b": 2}) == {"set": {"b": 2}}
