"""Sharding a selection and merging the shards' reports (R-Q-10)."""

from __future__ import annotations

from typing import Any

import pytest

from qualify.errors import UsageError
from qualify.merge import merge_shards
from qualify.scenarios.base import Scenario
from qualify.session import parse_shard, shard_of

IDS = [f"random-{i}" for i in range(7)]


def _sc(sid: str) -> Scenario:
    return Scenario(sid, sid, (), lambda ctx: None)


def _summary(k: int, n: int, ids: list[str], *, seed: int = 7, status: str = "pass",
             selection: list[str] = IDS) -> dict[str, Any]:
    return {"seed": seed, "git_sha": "abc", "verdict": status, "duration_s": 1.0,
            "shard": {"index": k, "count": n, "whole_selection": False, "selection": selection},
            "scenarios": [{"id": i, "status": status} for i in ids], "refused": []}


@pytest.mark.req("R-Q-10")
@pytest.mark.parametrize("n", [1, 2, 3, 7, 9])
def test_the_shards_partition_the_selection(n: int) -> None:
    scenarios = [_sc(i) for i in IDS]
    parts = [[sc.id for sc in shard_of(scenarios, (k, n))] for k in range(1, n + 1)]
    assert sorted(i for part in parts for i in part) == sorted(IDS)
    assert all(len(set(a) & set(b)) == 0 for i, a in enumerate(parts) for b in parts[i + 1:])


@pytest.mark.req("R-Q-10")
@pytest.mark.parametrize("text", ["0/2", "3/2", "2", "a/b", "1/0", "-1/2"])
def test_a_bad_shard_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError):
        parse_shard(text)


@pytest.mark.req("R-Q-10")
def test_merged_shards_come_back_in_selection_order() -> None:
    scenarios = [_sc(i) for i in IDS]
    summaries = [_summary(k, 3, [sc.id for sc in shard_of(scenarios, (k, 3))]) for k in (2, 3, 1)]
    docs, problems = merge_shards(summaries)
    assert problems == []
    assert [d["id"] for d in docs] == IDS


@pytest.mark.req("R-Q-10")
@pytest.mark.parametrize(("summaries", "problem"), [
    ([_summary(1, 2, IDS[0::2])], "missing shard(s) 2/2"),
    ([_summary(1, 2, IDS[0::2]), _summary(1, 2, IDS[0::2])], "given twice"),
    ([_summary(1, 2, IDS[0::2]), _summary(2, 2, IDS[1::2], seed=8)], "seed"),
    ([_summary(1, 2, IDS[0::2]), _summary(2, 2, IDS[1::2], selection=IDS[:3])], "selection"),
    ([_summary(1, 2, IDS[0::2]), _summary(2, 2, IDS[1:4:2])], "reported by no shard: random-5"),
    ([_summary(1, 2, IDS[0::2]), _summary(2, 3, IDS[1::2])], "shard count"),
    ([{**_summary(1, 1, IDS), "shard": None}], "--shard K/N"),
])
def test_shards_that_are_not_one_session_are_refused(summaries: list[dict[str, Any]], problem: str) -> None:
    _, problems = merge_shards(summaries)
    assert any(problem in p for p in problems), problems


@pytest.mark.req("R-Q-10")
@pytest.mark.parametrize(("docs", "twice", "says"), [
    ([{"seed": 1, "scenarios": []}], False, "not the report of a shard"),
    ([{"seed": 1, "scenarios": [], "shard": {"index": 1, "count": 2, "selection": ["a"]}}], True,
     "given more than once"),
])
def test_merging_what_is_not_a_set_of_shards_is_a_usage_error_and_writes_nothing(
        tmp_path: Any, docs: list[dict[str, Any]], twice: bool, says: str) -> None:
    """A tester merged a plain run's report, and one report twice: that was a crashed
    verdict, exit 2 ("the harness broke") and a new report. Now exit 64's UsageError, and
    no report directory."""
    import json

    from qualify.merge import merge_reports

    dirs = []
    for i, doc in enumerate(docs):
        d = tmp_path / f"r{i}"
        d.mkdir()
        (d / "summary.json").write_text(json.dumps(doc))
        dirs.append(d)
    out = tmp_path / "reports"
    with pytest.raises(UsageError, match=says):
        merge_reports(dirs * 2 if twice else dirs, out)
    assert not out.exists()


@pytest.mark.parametrize(("text", "says"), [
    ('{"shard": ', "not a readable summary.json"),           # a shard's artifact cut short
    ("[1]", "not a qualify summary"),
    ('{"seed": 1, "scenarios": [], "shard": {"index": 1}}', "not the report of a shard"),
    ('{"seed": 1, "shard": {"index": 1, "count": 1, "selection": []}}', "not a qualify summary"),
])
def test_a_summary_that_cannot_be_read_is_a_usage_error_not_a_traceback(tmp_path: Any, text: str, says: str) -> None:
    """A new user's finding: ``qualify merge`` of a shard whose summary.json was cut short
    (an upload interrupted, a full disk) printed a JSONDecodeError traceback and exited 1,
    the code of a ``fail`` verdict; so did a summary without a shard's fields (KeyError).
    It is a usage error (exit 64) naming the file, and nothing is written."""
    from qualify.merge import merge_reports

    d = tmp_path / "r0"
    d.mkdir()
    (d / "summary.json").write_text(text)
    out = tmp_path / "reports"
    with pytest.raises(UsageError, match=says):
        merge_reports([d], out)
    assert not out.exists()
