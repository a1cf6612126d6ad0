import pytest

from qimpl.approvals import action_version, approval_id, approval_request


@pytest.mark.req("R-APPROVAL-1")
def test_action_version_changes_with_tool_arguments_or_plan() -> None:
    base = action_version("send_email", {"to": "a"}, "p1")
    assert base == action_version("send_email", {"to": "a"}, "p1")
    assert base != action_version("send_sms", {"to": "a"}, "p1")
    assert base != action_version("send_email", {"to": "b"}, "p1")
    assert base != action_version("send_email", {"to": "a"}, "p2")
    assert action_version("t", {"a": 1, "b": 2}) == action_version("t", {"b": 2, "a": 1})


def test_approval_ids_are_per_generation_and_step() -> None:
    assert approval_id("r", 1, 2) == approval_id("r", 1, 2)
    assert len({approval_id("r", 1, 2), approval_id("r", 2, 2), approval_id("r", 1, 3)}) == 3
    req = approval_request("r", 1, 2, {"kind": "approval", "tool": "t", "arguments": {"x": 1}, "plan": "p"})
    assert set(req) == {"kind", "approval_id", "action_version", "tool", "arguments"}
