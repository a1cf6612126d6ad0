"""The benchmark's pure arithmetic: percentiles, ratios, the table's rows, the targets."""

from __future__ import annotations

import pytest

from bench.stats import (
    CONCURRENCY,
    FIGURES,
    TARGETS,
    derived,
    evaluate,
    format_value,
    percentile,
    ratio,
    rows,
    summarize,
)


def test_percentile_interpolates_between_closest_ranks() -> None:
    xs = [4.0, 1.0, 3.0, 2.0]  # unsorted on purpose
    assert percentile(xs, 0) == 1.0
    assert percentile(xs, 100) == 4.0
    assert percentile(xs, 50) == pytest.approx(2.5)
    assert percentile(list(range(1, 101)), 95) == pytest.approx(95.05)
    assert percentile([7.0], 95) == 7.0


@pytest.mark.parametrize(("xs", "q"), [([], 50), ([1.0], -1), ([1.0], 101)])
def test_percentile_refuses_nonsense(xs: list[float], q: float) -> None:
    with pytest.raises(ValueError):
        percentile(xs, q)


def test_summarize() -> None:
    s = summarize([0.1, 0.2, 0.3, 0.4, 1.0])
    assert (s.n, s.min, s.max) == (5, 0.1, 1.0)
    assert s.p50 == pytest.approx(0.3)
    assert s.mean == pytest.approx(0.4)
    assert s.p95 == pytest.approx(0.88)
    with pytest.raises(ValueError):
        summarize([])


def test_ratio_is_none_without_a_usable_reference() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None
    assert ratio(3.0, None) is None
    assert ratio(3.0, 0.0) is None


def test_figure_keys_are_unique_and_references_exist() -> None:
    keys = [f.key for f in FIGURES]
    assert len(keys) == len(set(keys))
    known = set(keys) | set(derived({}))
    assert {f.ref for f in FIGURES if f.ref} <= known
    assert len({t.id for t in TARGETS}) == len(TARGETS)


def test_sharded_figures_are_judged_against_their_own_floor_and_dbos() -> None:
    values = {"sharded.floor.tput_c10": 60.0, "sharded.qimpl.tput_c10": 29.0, "dbos.tput_c10": 50.0,
              "sharded.qimpl.e2e_p50_s": 0.030, "dbos.e2e_p50_s": 0.014, "qimpl.e2e_p50_s": 0.09,
              "sharded.floor.wf_server_p50_s": 0.02, "sharded.floor.commit_p50_s": 0.001}
    results = {r.target: r for r in evaluate(values)}
    assert results["tput-floor-c10-sharded"].met is False  # 29 < 0.5 x 60
    assert results["tput-dbos-c10-sharded"].met is True  # 29 >= 0.5 x 50
    assert results["e2e-dbos-sharded"].met is False and results["e2e-dbos-sharded"].limit == pytest.approx(0.028)
    assert results["e2e-dbos"].met is False
    assert results["tput-floor-c10"].met is None  # the default server's figures were not measured
    by_key = {r.spec.key: r for r in rows(values)}
    assert by_key["sharded.qimpl.e2e_p50_s"].ratio == pytest.approx(0.030 / 0.024)


def test_rows_ratio_to_reference_and_missing_figures() -> None:
    values = {"floor.tput_c10": 40.0, "qimpl.tput_c10": 10.0, "floor.wf_p50_s": 0.1,
              "floor.commit_p50_s": 0.01, "qimpl.e2e_p50_s": 0.28}
    by_key = {r.spec.key: r for r in rows(values)}
    assert by_key["qimpl.tput_c10"].ratio == pytest.approx(0.25)
    # the e2e budget is floor workflow p50 + 4 x commit p50 = 0.14 s
    assert by_key["qimpl.e2e_p50_s"].ratio == pytest.approx(2.0)
    missing = by_key["qual.run_n1_s"]
    assert (missing.value, missing.ratio, missing.status) == (None, None, "not measured in this run")


def test_rows_show_last_known_figures_labelled_and_without_ratio() -> None:
    got = {r.spec.key: r for r in rows({"floor.wf_p50_s": 0.1},
                                       previous={"qual.run_n1_s": 420.0}, previous_label="x.json")}
    assert got["qual.run_n1_s"].value == 420.0
    assert got["qual.run_n1_s"].status == "last known (x.json)"
    assert got["qual.run_n1_s"].ratio is None
    assert got["floor.wf_p50_s"].status == "measured"


def test_targets_met_missed_and_not_measured() -> None:
    values = {
        "recovery.sigkill_p50_s": 2.4, "recovery.sigkill_p95_s": 3.1,
        "recovery.lease_s": 2.0, "recovery.sigstop_s": 4.5, "recovery.in_txn_s": 3.4,
        "floor.wf_p50_s": 0.1, "floor.commit_p50_s": 0.01, "qimpl.e2e_p50_s": 0.21,
        "floor.tput_c1": 10.0, "qimpl.tput_c1": 5.0, "dbos.tput_c1": 11.0,
        "qual.run_n1_s": 400.0, "qual.run_nauto_s": 59.0,
    }
    got = {r.target: r for r in evaluate(values)}
    assert got["sigkill-p50"].met is True and got["sigkill-p50"].limit == 2.5  # H + 0.5 s
    assert got["sigkill-p95"].met is False and got["sigkill-p95"].limit == 3.0  # H + 1 s
    assert got["sigstop-takeover"].met is False and got["sigstop-takeover"].limit == 3.5  # lease + 1.5 s
    assert got["in-txn-takeover"].met is True
    assert got["e2e"].met is True and got["e2e"].limit == pytest.approx(0.21)
    assert got["tput-floor-c1"].met is True  # exactly half: >= holds
    assert got["tput-dbos-c1"].met is False
    assert got["qualify-run"].met is True and got["qualify-run"].value == 59.0
    assert got["cancel"].met is None and got["cancel"].detail == "not measured in this run"
    assert got["accept"].met is None
    assert {f"tput-floor-c{c}" for c in CONCURRENCY} <= set(got)


@pytest.mark.parametrize(("value", "unit", "text"), [
    (0.0123, "s", "12.3 ms"), (2.5, "s", "2.50 s"), (12.34, "/s", "12.3/s"),
    (1500.0, "/h", "1,500.0/h"), (123.4, "MiB", "123 MiB"), (2048.0, "B", "2,048 B"),
    (None, "s", "-"),
])
def test_format_value(value: float | None, unit: str, text: str) -> None:
    assert format_value(value, unit) == text


def test_the_e2e_budget_uses_the_floor_on_the_servers_clock() -> None:
    """qimpl's end-to-end figure is two commit times; the floor it is held to must span the
    same (the server's start -> close), not the client's result long poll on top."""
    both = derived({"floor.wf_p50_s": 0.100, "floor.wf_server_p50_s": 0.040, "floor.commit_p50_s": 0.001})
    assert both["floor.e2e_budget_s"] == pytest.approx(0.044)
    old = derived({"floor.wf_p50_s": 0.100, "floor.commit_p50_s": 0.001})
    assert old["floor.e2e_budget_s"] == pytest.approx(0.104)
