import pytest
from pydantic import ValidationError

from qimpl.api.models import CreateRunRequest
from qimpl.api.validation import VALIDATION_CODES, code_for


def _code(body: dict) -> str:  # type: ignore[type-arg]
    with pytest.raises(ValidationError) as err:
        CreateRunRequest.model_validate(body)
    return code_for({**err.value.errors()[0], "loc": ("body", *err.value.errors()[0]["loc"])})


@pytest.mark.req("R-CREATE-1")
@pytest.mark.parametrize(("body", "code"), [
    ({}, "prompt_required"),
    ({"prompt": ""}, "prompt_empty"),
    ({"prompt": "   "}, "prompt_empty"),  # whitespace only is empty (a tester's finding)
    ({"prompt": "\u00a0\n\t"}, "prompt_empty"),
    ({"prompt": "\u200b"}, "prompt_empty"),  # a zero-width space is as empty
    ({"prompt": " \u200b\ufeff "}, "prompt_empty"),
    ({"prompt": "a\x00"}, "prompt_invalid"),
    ({"prompt": "x" * 32001}, "prompt_too_long"),
    ({"prompt": 5}, "prompt_invalid"),
    ({"prompt": "x", "mode": "chat"}, "mode_unsupported"),
    ({"prompt": "x", "response_mode": "stream"}, "response_mode_unsupported"),
    ({"prompt": "x", "deadline_seconds": 0}, "deadline_out_of_range"),
    ({"prompt": "x", "deadline_seconds": 86401}, "deadline_out_of_range"),
    ({"prompt": "x", "deadline_seconds": "soon"}, "deadline_invalid"),
    ({"prompt": "x", "durable_temporal": "maybe"}, "durable_temporal_invalid"),
    ({"prompt": "x", "surprise": 1}, "unknown_field"),
    # Strict everywhere (issue 25, item 15): a number in a string is not a number, nor a
    # word a boolean, nor a float a count.
    ({"prompt": "x", "deadline_seconds": "60"}, "deadline_invalid"),
    ({"prompt": "x", "deadline_seconds": 60.0}, "deadline_invalid"),
    ({"prompt": "x", "durable_temporal": "true"}, "durable_temporal_invalid"),
    ({"prompt": "x", "durable_temporal": 1}, "durable_temporal_invalid"),
])
def test_each_bad_field_has_its_code(body: dict, code: str) -> None:  # type: ignore[type-arg]
    assert _code(body) == code
    assert code in VALIDATION_CODES


@pytest.mark.req("R-RESUME-1")
@pytest.mark.parametrize(("body", "code"), [
    ({"additional_prompt": ""}, "additional_prompt_empty"),
    ({"additional_prompt": " \n"}, "additional_prompt_empty"),
    ({"additional_prompt": "x" * 32001}, "additional_prompt_too_long"),
    # Its own field's code, as the create's prompt has (was prompt_invalid / invalid_request).
    ({"additional_prompt": "a\x00"}, "additional_prompt_invalid"),
    ({"additional_prompt": 5}, "additional_prompt_invalid"),
])
def test_a_resume_prompt_has_its_own_codes(body: dict, code: str) -> None:  # type: ignore[type-arg]
    from qimpl.api.models import ResumeRequest

    with pytest.raises(ValidationError) as err:
        ResumeRequest.model_validate(body)
    (error,) = err.value.errors()
    assert code_for({**error, "loc": ("body", *error["loc"])}) == code
    assert code in VALIDATION_CODES


def test_a_prompt_keeps_its_whitespace() -> None:
    assert CreateRunRequest.model_validate({"prompt": " a \n"}).prompt == " a \n"


def test_a_body_that_is_not_an_object() -> None:
    assert code_for({"loc": ("body",), "type": "missing"}) == "malformed_body"
    assert code_for({"loc": ("body", 0), "type": "json_invalid"}) == "malformed_body"
    assert code_for({"loc": ("body",), "type": "dict_type"}) == "malformed_body"


def test_a_field_that_is_not_an_object_is_that_fields_error() -> None:
    """A tool result's ``result`` given as a string was ``malformed_body`` (the body *was*
    an object), and missing, ``invalid_request``: both are the field's error now."""
    assert code_for({"loc": ("body", "result"), "type": "dict_type"}) == "invalid_request"
    assert code_for({"loc": ("body", "result"), "type": "missing"}) == "invalid_request"


@pytest.mark.req("R-CREATE-1")
def test_a_422_lists_at_most_twenty_problems_and_counts_the_rest() -> None:
    """A body of 100,000 unknown fields was answered with every one of them: a 9.6 MB
    response per request that stalled the API for every client (a tester's finding). More
    than 20 unknown fields are one problem; any list is cut at 20 and the rest counted."""
    from qimpl.api.models import MAX_UNKNOWN_FIELDS
    from qimpl.api.validation import MAX_LISTED_ERRORS, listed

    for n, listed_n in ((MAX_UNKNOWN_FIELDS, MAX_UNKNOWN_FIELDS), (MAX_UNKNOWN_FIELDS + 1, 1), (100_000, 1)):
        with pytest.raises(ValidationError) as err:
            CreateRunRequest.model_validate({"prompt": "x", **{f"f{i}": 0 for i in range(n)}})
        assert len(err.value.errors()) == listed_n, n
        assert {code_for({**e, "loc": ("body", *e["loc"])}) for e in err.value.errors()} == {"unknown_field"}
    many = [{"loc": ("body", f"f{i}"), "type": "extra_forbidden", "msg": "x"} for i in range(1000)]
    shown, omitted = listed(many)
    assert (len(shown), omitted) == (MAX_LISTED_ERRORS, 1000 - MAX_LISTED_ERRORS) == (20, 980)
    assert listed(many[:3]) == (shown[:3], 0)
