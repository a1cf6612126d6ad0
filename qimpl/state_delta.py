"""Checkpoint state stored as deltas (pure; issue 22, item 5; R-EXEC-3).

An agent's state grows with its steps (a transcript, a list of messages): stored whole at
every checkpoint, a run of n steps stores O(n²). Each checkpoint after a run's first
stores instead what changed since the previous one, at the top level of the state object:

    {"set": {key: value, ...}, "unset": [key, ...], "append": {key: suffix, ...}}

``append`` holds, for a list or a string that only grew, the new tail; ``set`` any other
new or changed value; ``unset`` the keys that went. A delta is stored only when it is
smaller than the state itself; otherwise the checkpoint holds the whole state (as the
first one always does). Restoring folds the deltas, in step order, onto the last whole
state (``fold``). Values are compared as JSON (``true`` is not ``1``): what is folded back
is exactly what was checkpointed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["apply", "diff", "fold"]


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values (Python's ``True == 1`` and ``1 == 1.0`` are not)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _size(doc: Any) -> int:
    return len(json.dumps(doc, separators=(",", ":")))


def diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any] | None:
    """The delta that turns ``old`` into ``new``, or None when it would be no smaller than
    ``new`` (store the whole state then). Both are JSON objects."""
    set_: dict[str, Any] = {}
    append: dict[str, Any] = {}
    for key, value in new.items():
        if key not in old:
            set_[key] = value
            continue
        before = old[key]
        if _same(before, value):
            continue
        if (isinstance(before, list) and isinstance(value, list) and len(value) > len(before)
                and _same(value[:len(before)], before)):
            append[key] = value[len(before):]
        elif isinstance(before, str) and isinstance(value, str) and value.startswith(before):
            append[key] = value[len(before):]
        else:
            set_[key] = value
    unset = [key for key in old if key not in new]
    delta = {name: part for name, part in (("set", set_), ("unset", unset), ("append", append)) if part}
    return delta if _size(delta) < _size(new) else None


def apply(state: Mapping[str, Any], delta: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` with ``delta`` applied (a new object). Raises ValueError when an append
    does not fit the value it extends (a corrupt chain)."""
    out = {key: value for key, value in state.items() if key not in set(delta.get("unset", ()))}
    out.update(delta.get("set", {}))
    for key, tail in delta.get("append", {}).items():
        before = out.get(key)
        if isinstance(before, list) and isinstance(tail, list):
            out[key] = [*before, *tail]
        elif isinstance(before, str) and isinstance(tail, str):
            out[key] = before + tail
        else:
            raise ValueError(f"checkpoint delta appends to {key!r}, which is not a list or a string")
    return out


def fold(rows: Iterable[tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]]) -> dict[str, Any]:
    """The state after ``rows`` — ``(state_json, state_delta)`` per checkpoint in step
    order, starting at one that holds a whole state. ``{}`` for no rows. Raises ValueError
    when the first row is a delta (nothing to apply it to)."""
    state: dict[str, Any] | None = None
    for whole, delta in rows:
        if whole is not None:
            state = dict(whole)
        elif state is None or delta is None:
            raise ValueError("a checkpoint delta without a whole state before it")
        else:
            state = apply(state, delta)
    return state or {}
