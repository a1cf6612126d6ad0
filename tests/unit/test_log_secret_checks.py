"""The log checks every scenario ends with (R-READ-3, R-AUTH-3): no workspace grant and no
stream key in any process log, named without the secret itself."""

from __future__ import annotations

import pytest

from qualify.runner import no_grant_in_logs, no_stream_key_in_logs


@pytest.mark.req("R-AUTH-3")
def test_a_stream_key_in_a_log_is_caught_and_not_repeated() -> None:
    logs = {"api-1.log": '{"msg": "stream refused for key sk-live-123"}', "worker-1.log": "nothing"}
    caught = no_stream_key_in_logs(logs, ["sk-live-123", "sk-other"])
    assert caught.ok is False and "api-1.log: 1 stream key(s)" in caught.detail
    assert "sk-live-123" not in caught.detail
    clean = no_stream_key_in_logs({"worker-1.log": "nothing"}, ["sk-live-123"])
    assert clean.ok is True and clean.judged == 1
    assert no_stream_key_in_logs(logs, []).judged == 0, "no run, nothing judged"


@pytest.mark.req("R-READ-3")
def test_a_grant_in_a_log_is_caught() -> None:
    caught = no_grant_in_logs({"worker-1.log": "grant g-secret"}, ["g-secret"])
    assert caught.ok is False and "g-secret" not in caught.detail


@pytest.mark.req("R-AUTH-3")
def test_most_of_a_stream_key_in_a_log_is_caught() -> None:
    key = "EHOJm3p1DOIcOCNiXvQGl1JD3SgFqtAb"
    for part in (key[:-2], key[2:]):
        check = no_stream_key_in_logs({"api-1.log": f"accepted, stream {part}.."}, [key])
        assert check.ok is False and "api-1.log: 1 stream key(s)" in check.detail and part not in check.detail
    assert no_stream_key_in_logs({"api-1.log": f"accepted, stream {key[:20]}"}, [key]).ok is True
    assert no_grant_in_logs({"worker-1.log": f"grant {key[:-2]}"}, [key]).ok is False
