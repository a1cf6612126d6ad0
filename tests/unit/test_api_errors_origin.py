"""The API's log line for an unhandled exception says where it came from, and nothing the
client could learn from (R-READ-3: no trace, no message)."""

from __future__ import annotations

import pytest

from qimpl.api.errors import origin


def _raises_inside_qimpl() -> None:
    raise LookupError("secret-value")


@pytest.mark.req("R-READ-3")
def test_origin_names_qimpls_innermost_frame_and_the_first_cause_without_messages() -> None:
    import qimpl.api.errors as errors

    # A frame of qimpl's own code: run the raiser as if it were defined in a qimpl module.
    raiser = type(_raises_inside_qimpl)(_raises_inside_qimpl.__code__, vars(errors), "raiser")
    try:
        try:
            raiser()
        except LookupError as inner:
            raise RuntimeError("response already started") from inner
    except RuntimeError as exc:
        got = origin(exc)
    assert got == {"cause": "LookupError", "origin": f"qimpl.api.errors:{_raises_inside_qimpl.__code__.co_firstlineno + 1}"}
    assert "secret" not in repr(got) and "started" not in repr(got)


def test_an_exception_outside_qimpl_has_no_origin() -> None:
    try:
        int("x")
    except ValueError as exc:
        assert origin(exc) == {}


def test_a_suppressed_context_and_a_cyclic_chain_are_not_followed() -> None:
    try:
        try:
            int("x")
        except ValueError:
            raise KeyError("k") from None
    except KeyError as exc:
        assert origin(exc) == {}  # the ValueError was suppressed: no cause
    looped = RuntimeError("a")
    other = LookupError("b")
    looped.__context__, other.__context__ = other, looped
    assert origin(looped) == {"cause": "LookupError"}
