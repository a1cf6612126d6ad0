"""The tool journal's checkers on good histories and on bad ones they must catch (R-Q-5, R-TOOL-1)."""

from __future__ import annotations

from typing import Any

import pytest

from qualify import checkers as ck
from qualify.history import merge

R = "run-1"


def intent(call: str, tool: str, t: float, *, status: str = "succeeded", kind: str = "instrumented",
           run: str = R) -> dict[str, Any]:
    return {"type": "tool_invocation", "run_id": run, "call_id": call, "tool": tool, "kind": kind,
            "status": status, "step": 2, "position": 0, "generation": 1, "t": t, "outcome_t": t + 0.5}


def request(call: str, tool: str, t: float, *, kind: str = "instrumented", attempt: int = 1,
            repeat: bool = False, run: str = R) -> dict[str, Any]:
    return {"type": "sink_request", "call_id": call, "run_id": run, "tool": tool, "kind": kind,
            "attempt": attempt, "pid": 7, "t": t, "repeat": repeat}


def execution(call: str, tool: str, t: float, *, kind: str = "instrumented") -> dict[str, Any]:
    return {"type": "sink_execution", "call_id": call, "run_id": R, "tool": tool, "kind": kind, "t": t}


def good() -> list[dict[str, Any]]:
    """A charge, a shell action, a refused charge (requested once, nothing executed), a
    developer-hosted call and a denied one (neither reaches the sink)."""
    return merge([
        {"type": "run", "run_id": R, "t": 0.9, "deadline_t": 100.0, "state": "completed"},
        intent("tc-a", "charge", 3.0), request("tc-a", "charge", 3.01), execution("tc-a", "charge", 3.01),
        intent("tc-b", "shell", 4.0, kind="uninstrumented"),
        request("tc-b", "shell", 4.01, kind="uninstrumented"),
        execution("tc-b", "shell", 4.01, kind="uninstrumented"),
        intent("tc-c", "charge", 5.0, status="failed"), request("tc-c", "charge", 5.01),
        intent("tc-d", "lookup_customer", 6.0, kind="developer_hosted", status="requested"),
        intent("tc-e", "send_email", 7.0, status="denied"),
    ])


JOURNAL_CHECKERS = (ck.no_side_effect_repeated, ck.no_execution_without_intent)


@pytest.mark.req("R-Q-5")
@pytest.mark.parametrize("checker", JOURNAL_CHECKERS)
def test_good_history_passes(checker) -> None:  # type: ignore[no-untyped-def]
    result = checker(good())
    assert result.ok is True, result.detail


@pytest.mark.req("R-Q-5")
@pytest.mark.parametrize("checker", JOURNAL_CHECKERS)
def test_a_history_without_a_sink_passes(checker) -> None:  # type: ignore[no-untyped-def]
    history = [e for e in good() if not e["type"].startswith("sink_")]
    assert checker(history).ok is True
    assert checker([e for e in history if e["type"] != "tool_invocation"]).ok is True


@pytest.mark.req("R-Q-5")
def test_journal_checkers_run_over_every_scenario() -> None:
    assert set(JOURNAL_CHECKERS) <= set(ck.GENERIC_CHECKERS)
    assert all(c.ok is True for c in ck.run_checks(good(), JOURNAL_CHECKERS))


@pytest.mark.req("R-Q-5")
def test_catches_an_instrumented_call_requested_twice() -> None:
    # the sink deduplicated it (one execution), but the call was asked again: a repeat
    h = merge(good(), [request("tc-a", "charge", 8.0, attempt=2, repeat=True)])
    result = ck.no_side_effect_repeated(h)
    assert result.ok is False and "tc-a" in result.detail and "2 times" in result.detail
    assert "tc-b" not in result.detail


@pytest.mark.req("R-Q-5")
def test_catches_an_uninstrumented_action_executed_twice() -> None:
    h = merge(good(), [request("tc-b", "shell", 8.0, kind="uninstrumented", repeat=True),
                       execution("tc-b", "shell", 8.0, kind="uninstrumented")])
    result = ck.no_side_effect_repeated(h)
    assert result.ok is False and "tc-b" in result.detail and "executed 2 times" in result.detail


@pytest.mark.req("R-Q-5")
def test_names_every_offender_in_the_detail() -> None:
    h = merge(good(), [request("tc-a", "charge", 8.0), request("tc-c", "charge", 8.1)])
    result = ck.no_side_effect_repeated(h)
    assert result.ok is False and "tc-a" in result.detail and "tc-c" in result.detail


@pytest.mark.req("R-TOOL-1")
def test_catches_an_execution_with_no_intent() -> None:
    h = merge(good(), [request("tc-x", "charge", 9.0), execution("tc-x", "charge", 9.0)])
    result = ck.no_execution_without_intent(h)
    assert result.ok is False and "tc-x" in result.detail and "no intent" in result.detail


@pytest.mark.req("R-TOOL-1")
def test_catches_an_uninstrumented_action_with_no_intent() -> None:
    h = [e for e in good() if not (e["type"] == "tool_invocation" and e["call_id"] == "tc-b")]
    result = ck.no_execution_without_intent(h)
    assert result.ok is False and "tc-b" in result.detail


@pytest.mark.req("R-TOOL-1")
def test_catches_an_intent_for_another_tool() -> None:
    h = [intent("tc-a", "refund", 3.0) if e.get("call_id") == "tc-a" and e["type"] == "tool_invocation"
         else e for e in good()]
    result = ck.no_execution_without_intent(h)
    assert result.ok is False and "tc-a" in result.detail and "refund" in result.detail


@pytest.mark.req("R-TOOL-1")
def test_catches_an_intent_of_another_run() -> None:
    h = [intent("tc-a", "charge", 3.0, run="run-2") if e.get("call_id") == "tc-a"
         and e["type"] == "tool_invocation" else e for e in good()]
    assert ck.no_execution_without_intent(h).ok is False


@pytest.mark.req("R-TOOL-5")
def test_catches_a_denied_or_developer_hosted_call_that_reached_the_sink() -> None:
    for call, tool in (("tc-e", "send_email"), ("tc-d", "lookup_customer")):
        h = merge(good(), [request(call, tool, 9.0)])
        result = ck.no_execution_without_intent(h)
        assert result.ok is False and call in result.detail


@pytest.mark.req("R-TOOL-1")
def test_catches_a_call_made_before_its_intent_was_committed() -> None:
    late = [intent("tc-a", "charge", 3.5) if e.get("call_id") == "tc-a" and e["type"] == "tool_invocation"
            else e for e in good()]
    result = ck.no_execution_without_intent(late)
    assert result.ok is False and "before its intent" in result.detail
    # within the clocks' slack it is not a violation
    close = [intent("tc-a", "charge", 3.01 + ck.SINK_CLOCK_SLACK_S / 2)
             if e.get("call_id") == "tc-a" and e["type"] == "tool_invocation" else e for e in good()]
    assert ck.no_execution_without_intent(close).ok is True


@pytest.mark.req("R-TOOL-1")
def test_a_call_made_before_its_intent_committed_is_caught_on_one_clock() -> None:
    """With the intent's commit time and a reading of the database's clock, the commit is
    compared with the request on the host's clock, allowing only the reading's
    uncertainty: a millisecond is enough to tell, where the fixed slack hid 50 ms."""
    clock = {"type": "db_clock", "t": 10.0, "offset_s": 2.0, "uncertainty_s": 0.0002}

    def committed(at_db: float) -> list[dict[str, Any]]:
        return [{**e, "intent_commit_t": at_db} if e.get("call_id") == "tc-a" and e["type"] == "tool_invocation"
                else e for e in good()] + [clock]

    # the request at 3.01 on the host's clock = 5.01 on the database's
    assert ck.no_execution_without_intent(committed(5.0095)).ok is True
    late = ck.no_execution_without_intent(committed(5.0115))
    assert late.ok is False and "1.5 ms before its intent committed" in late.detail
    # within the reading's uncertainty it is not a violation
    assert ck.no_execution_without_intent(committed(5.0101)).ok is True
    # without the reading, the insert time and the fixed slack decide, as before
    assert ck.no_execution_without_intent(committed(5.0115)[:-1]).ok is True


@pytest.mark.req("R-TOOL-1")
def test_the_sink_runs_the_journaled_arguments_and_the_intent_digests_them() -> None:
    import hashlib
    import json

    args = {"amount": 3}
    digest = hashlib.sha256(json.dumps({"tool": "charge", "arguments": args}, sort_keys=True,
                                       separators=(",", ":")).encode()).hexdigest()

    def with_args(sent: dict[str, Any], journaled: dict[str, Any], dig: str) -> list[dict[str, Any]]:
        out = []
        for e in good():
            if e.get("call_id") == "tc-a" and e["type"] == "tool_invocation":
                e = {**e, "arguments": journaled, "arguments_digest": dig}
            elif e.get("call_id") == "tc-a" and e["type"] == "sink_request":
                e = {**e, "arguments": sent}
            out.append(e)
        return out

    assert ck.no_execution_without_intent(with_args(args, args, digest)).ok is True
    other = ck.no_execution_without_intent(with_args({"amount": 4}, args, digest))
    assert other.ok is False and "the sink ran arguments {'amount': 4}" in other.detail
    wrong = ck.no_execution_without_intent(with_args(args, args, "0" * 64))
    assert wrong.ok is False and "digest is not its arguments'" in wrong.detail


@pytest.mark.req("R-TOOL-5", "R-Q-5")
def test_unapproved_finalising_effect_is_caught() -> None:
    from qualify.checkers import no_unapproved_effect

    journal = {"type": "tool_invocation", "run_id": "r", "call_id": "c1", "tool": "merge_pull_request",
               "approval_id": "ap-1", "t": 1.0}
    request = {"type": "sink_request", "run_id": "r", "call_id": "c1", "tool": "merge_pull_request",
               "t": 2.0}
    decision = {"type": "approval_decision", "run_id": "r", "approval_id": "ap-1", "approved": True, "t": 0.5}
    assert no_unapproved_effect([journal, request, decision]).ok
    assert no_unapproved_effect([]).ok
    denied = no_unapproved_effect([journal, request, {**decision, "approved": False}])
    assert not denied.ok and "c1" in denied.detail
    unapproved = no_unapproved_effect([{**journal, "approval_id": None}, request])
    assert not unapproved.ok
    twice = no_unapproved_effect([journal, {**journal, "call_id": "c2"}, request,
                                  {**request, "call_id": "c2"}, decision])
    assert not twice.ok and "used by 2 calls" in twice.detail


@pytest.mark.req("R-TOOL-2", "R-TOOL-3")
def test_a_provider_fed_another_result_than_the_journal_s_is_caught() -> None:
    from qualify.digests import canonical_sha256 as result_digest

    row = {**intent("tc-a", "charge", 3.0), "result": {"receipt": "tc-a"}}
    fed = {"call_id": "tc-a", "status": "succeeded", "result_sha256": result_digest({"receipt": "tc-a"})}
    step = {"type": "provider_call", "run_id": R, "step": 3, "attempt": 1, "generation": 1, "t": 5.0,
            "fed": [fed]}
    good_one = ck.provider_fed_the_journal([row, step])
    assert good_one.ok is True and good_one.judged == 1
    lost = ck.provider_fed_the_journal([row, {**step, "fed": [{**fed, "result_sha256": result_digest(None)}]}])
    assert lost.ok is False and "another result than the journal's" in lost.detail
    status = ck.provider_fed_the_journal([row, {**step, "fed": [{**fed, "status": "failed"}]}])
    assert status.ok is False and "as failed, journaled succeeded" in status.detail
    stranger = ck.provider_fed_the_journal([{**row, "run_id": "run-9"}, step])
    assert stranger.ok is False and "not in the run's journal" in stranger.detail
    unsettled = ck.provider_fed_the_journal([{**row, "status": "intent"}, {**step, "fed": [{**fed, "status": "intent"}]}])
    assert unsettled.ok is False
    assert ck.provider_fed_the_journal([row, {**step, "fed": []}]).judged == 0


@pytest.mark.req("R-EXEC-4", "R-READ-2")
def test_a_completed_run_with_another_answer_than_its_script_s_is_caught() -> None:
    import hashlib
    import json

    from qualify.checkers.answers import completed_with_the_scripted_answer

    def md5(text: str) -> str:
        return hashlib.md5(text.encode()).hexdigest()

    prompt = json.dumps({"steps": 3, "answer": "done", "tools": {"1": [{"tool": "charge"}]}})
    run = {"type": "run", "run_id": R, "state": "completed", "prompt": prompt, "t": 1.0,
           "answer_md5": md5("done [charge:succeeded]"), "answer_chars": 23}
    call = {"type": "provider_call", "run_id": R, "step": 3, "attempt": 2, "generation": 1, "t": 2.0}
    row = intent("tc-a", "charge", 1.5)
    assert completed_with_the_scripted_answer([run, call, row]).ok is True
    wrong = completed_with_the_scripted_answer([{**run, "answer_md5": md5("wrong")}, call, row])
    assert wrong.ok is False and "'done [charge:succeeded]'" in wrong.detail
    # another provider's run (no synthetic record of it) is not judged
    assert completed_with_the_scripted_answer([{**run, "answer_md5": md5("wrong")}, row]).judged == 0


@pytest.mark.req("R-EXEC-4", "R-READ-2")
def test_a_run_parked_for_an_approval_with_another_answer_of_the_same_length_is_caught() -> None:
    import hashlib
    import json

    from qualify.checkers.answers import completed_with_the_scripted_answer

    def md5(text: str) -> str:
        return hashlib.md5(text.encode()).hexdigest()

    prompt = json.dumps({"steps": 3, "answer": "sent", "park": {"step": 1, "kind": "approval"}})
    good = "sent (tool ran: send_email)"
    run = {"type": "run", "run_id": R, "state": "completed", "prompt": prompt, "t": 1.0,
           "answer_md5": md5(good), "answer_chars": len(good)}
    call = {"type": "provider_call", "run_id": R, "step": 3, "attempt": 1, "generation": 2, "t": 2.0}
    row = {**intent("approved-a1", "send_email", 1.5), "status": "succeeded"}
    assert completed_with_the_scripted_answer([run, call, row]).ok is True
    swapped = completed_with_the_scripted_answer([{**run, "answer_md5": md5(good.swapcase())}, call, row])
    assert swapped.ok is False and "none of the 1 answers" in swapped.detail
    # denied until the provider gave up: it journaled nothing
    gave_up = {**run, "answer_md5": md5("denied: nothing ran"), "answer_chars": 19}
    assert completed_with_the_scripted_answer([gave_up, call]).ok is True
    assert completed_with_the_scripted_answer([gave_up, call, row]).ok is False


@pytest.mark.req("R-EXEC-6")
def test_a_stack_trace_without_its_traceback_header_is_caught() -> None:
    from qualify.runner import clean_logs

    framed = '{"msg": "provider step failed:\\n  File \\"/srv/qimpl/a.py\\", line 421, in _ask\\n    x()\\n"}\n'
    assert clean_logs({"worker-1.log": framed}).ok is False
    assert clean_logs({"worker-1.log": '  File "/srv/qimpl/a.py", line 4, in f\n'}).ok is False
    assert clean_logs({"worker-1.log": 'Stack (most recent call last):\n'}).ok is False
    assert clean_logs({"worker-1.log": '{"msg": "read line 4, in step 2"}\n'}).ok is True


@pytest.mark.req("R-Q-2")
def test_a_descendant_that_left_its_process_group_is_a_stray_and_is_killed(tmp_path: Any) -> None:
    import os
    import subprocess
    import time

    from qualify.runner import all_reaped, stray_processes

    mark = str(tmp_path / "control")
    import psutil

    subprocess.run(["setsid", "-f", "sleep", "30"], env={**os.environ, "QIMPL_CONTROL_DIR": mark}, check=True)

    def execed() -> bool:  # the detached child has become sleep (before that it is named setsid)
        for proc in psutil.process_iter(["name"]):
            try:
                if proc.info["name"] == "sleep" and proc.environ().get("QIMPL_CONTROL_DIR") == mark:
                    return True
            except psutil.Error:
                continue
        return False

    for _ in range(100):
        if execed():
            break
        time.sleep(0.05)
    strays = stray_processes(mark)
    assert strays and "sleep" in strays[0]
    check = all_reaped([], strays)
    assert check.ok is False and "a descendant left running" in check.detail
    time.sleep(0.2)
    assert stray_processes(mark) == []  # killed the first time
    assert all_reaped([]).ok is True
