"""Receipts compared whole by the scenarios (R-CREATE-2, R-RESUME-1): a replay with
another stream key or deadline is not the original receipt, and no stream key is shown."""

from __future__ import annotations

import pytest

from qualify.scenarios.receipts import RECEIPT_FIELDS, receipt_against_the_run, receipt_diff

RECEIPT = {"agent_id": "agent-1", "run_id": "r-1", "stream_key": "secret-key", "state": "queued",
           "lifecycle_version": 2, "durability": "temporal", "deadline_at": "2026-12-06T10:00:00+00:00"}


@pytest.mark.req("R-CREATE-2")
def test_a_replay_is_the_original_receipt_whole() -> None:
    assert receipt_diff(RECEIPT, {**RECEIPT, "state": "running"}) == {}, "state says where the run is now"
    for field in RECEIPT_FIELDS:
        other = {**RECEIPT, field: "something else"}
        assert set(receipt_diff(RECEIPT, other)) == {field}
    assert "secret-key" not in str(receipt_diff(RECEIPT, {**RECEIPT, "stream_key": "another"}))
    assert set(receipt_diff(RECEIPT, {k: v for k, v in RECEIPT.items() if k != "deadline_at"})) == {"deadline_at"}


@pytest.mark.req("R-CREATE-2", "R-CREATE-3")
def test_a_receipt_says_what_the_database_holds() -> None:
    row = {"run_id": "r-1", "stream_key": "secret-key", "deadline_t": 1796551200.0}
    assert receipt_against_the_run(RECEIPT, row) == {}
    assert set(receipt_against_the_run(RECEIPT, {**row, "deadline_t": 1796551201.0})) == {"deadline_at"}
    wrong = receipt_against_the_run(RECEIPT, {**row, "stream_key": "k-2"})
    assert set(wrong) == {"stream_key"} and "k-2" not in str(wrong) and "secret-key" not in str(wrong)
