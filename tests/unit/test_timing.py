"""The scenario time ledger (issue 24, item 1): nested spans count once, other threads
not at all, and the kinds add up to the wall time."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from qualify.procs import wait_until
from qualify.timing import (
    KINDS,
    Ledger,
    bind,
    cpu_seconds,
    slice_load,
    slices_for,
    spends,
    spent,
    sum_by_kind,
)


def _busy(s: float) -> None:
    end = time.monotonic() + s
    while time.monotonic() < end:
        time.sleep(0.002)


def test_an_inner_span_is_its_kind_alone_and_other_is_the_rest() -> None:
    with bind(Ledger()) as ledger:
        with spent("teardown"):
            _busy(0.05)
            with spent("checks"):
                _busy(0.1)
        _busy(0.05)
    out = ledger.close()
    assert 0.09 <= out["checks"] < 0.2
    assert 0.04 <= out["teardown"] < 0.09, out  # without the inner 0.1 s
    assert 0.04 <= out["other"] < 0.15, out
    assert abs(sum(out.values()) - ledger.total_s) < 0.01
    assert set(out) <= set(KINDS)


def test_spans_outside_a_bound_thread_are_not_counted() -> None:
    @spends("wait_run")
    def wait() -> None:
        _busy(0.05)

    with bind(Ledger()) as ledger:
        t = threading.Thread(target=wait)
        t.start()
        t.join()
    assert "wait_run" not in ledger.close()
    wait()  # no ledger bound at all: a no-op span


def test_wait_until_counts_its_kind() -> None:
    start = time.monotonic()
    with bind(Ledger()) as ledger:
        wait_until(lambda: time.monotonic() - start > 0.05, timeout_s=5, what="t", kind="wait_sweep")
    assert ledger.close()["wait_sweep"] >= 0.04


def test_sum_by_kind_keeps_the_kinds_order() -> None:
    docs = [{"time_by_kind": {"other": 1.0, "database": 0.5}}, {"time_by_kind": {"database": 0.25}}, {}]
    assert list(sum_by_kind(docs).items()) == [("database", 0.75), ("other", 1.0)]


@pytest.mark.req("R-Q-7")
def test_slice_load_is_cores_busy_per_slice() -> None:
    load = slice_load(cpu_s=295.4, wall_s=264.6, slices=2, cpus=2)
    assert load["cores_busy"] == pytest.approx(1.116, abs=1e-3)
    assert load["cpu_per_slice"] == pytest.approx(0.558, abs=1e-3)
    assert load["cpu_share"] == pytest.approx(0.558, abs=1e-3)
    with pytest.raises(ValueError):
        slice_load(cpu_s=1.0, wall_s=0.0, slices=1, cpus=2)


@pytest.mark.req("R-Q-7")
def test_auto_fills_the_cpus_with_slices_by_their_measured_load() -> None:
    assert slices_for(2, 0.558) == 4          # 2 / 0.558 = 3.6
    assert slices_for(2, 1.0) == 2            # a slice that keeps a core busy: one per CPU
    assert slices_for(4, 0.3) == 10           # 13.3, at most two and a half per CPU
    assert slices_for(2, 0.392) == 5          # 5.1: the catalog's load at four slices (2026-12-05)
    assert slices_for(2, 0.2) == 5            # 10, at most 5 on 2 CPUs
    assert slices_for(1, 5.0) == 1            # never fewer than one
    assert slices_for(3, None) >= 1           # the measured file (or one per CPU without it)
    assert slices_for(2, 0.0) == 2            # no measurement: one per CPU


def test_cpu_seconds_counts_a_reaped_child() -> None:
    import subprocess
    import sys

    before = cpu_seconds()
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)
    assert cpu_seconds() - before > 0.05


def test_expected_wall_is_the_expected_seconds_over_the_slices_when_every_one_is_known() -> None:
    from qualify.timing import expected_wall_s

    seconds = {"a": 10.0, "b": 20.0, "c": 30.0}
    assert expected_wall_s(["a", "b", "c"], 3, seconds) == 20.0
    assert expected_wall_s(["a", "b"], 5, seconds) == 15.0  # no more slices than scenarios
    assert expected_wall_s(["a", "random-1"], 2, seconds) is None
    assert expected_wall_s([], 2, seconds) is None


def test_the_eta_starts_from_the_plan_and_ends_on_the_measured_mean() -> None:
    """A full run on 2 cores: 96 scenarios, 92 s expected; the first short scenario ends
    after 15 s. The mean alone said 23 minutes (a new user's first line read
    'ETA 23:02' for a 1 min 42 s run)."""
    from qualify.console import eta_s

    first = eta_s(15.0, 1, 96, 92.0)
    assert 60 < first < 120, first
    assert eta_s(15.0, 1, 96, None) == 15.0 * 95  # no plan: the mean, as before
    assert eta_s(100.0, 96, 96, 92.0) == 0.0
    late = eta_s(90.0, 90, 96, 92.0)  # near the end the measured mean dominates
    assert abs(late - (0.0625 * 2.0 + 0.9375 * 6.0)) < 1e-9
    assert eta_s(0.0, 0, 96, 92.0) == 92.0


def test_every_catalog_scenario_has_an_expected_duration() -> None:
    """Without one the whole plan is unknown (``expected_wall_s`` is None) and the ETA is
    the mean of the first scenarios alone: a tester's first line read ``[1/98 0:24 ETA
    39:01]`` for a 3-minute run, ``owner-paused-mid-run`` lacking. Add a new scenario's
    seconds (``python -m qualify.timing SUMMARY`` of a full run) with the scenario."""
    from qualify.scenarios import REGISTRY
    from qualify.timing import expected_seconds

    seconds = expected_seconds()
    assert sorted(set(REGISTRY) - set(seconds)) == []


def test_the_command_answers_a_bad_command_line_with_usage_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m qualify.timing --help`` read ``--help`` as a file name and raised
    FileNotFoundError; no argument raised IndexError. Now: help, and usage errors (64)."""
    from qualify.timing import main

    with pytest.raises(SystemExit) as helped:
        main(["--help"])
    assert helped.value.code == 0 and "SUMMARY" in capsys.readouterr().out
    for argv in ([], ["--load"], [str(tmp_path / "missing.json")], ["--load", str(tmp_path)]):
        with pytest.raises(SystemExit) as refused:
            main(argv)
        assert refused.value.code == 64, argv
        assert "Traceback" not in capsys.readouterr().err
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"git_sha": "abc", "load": {"slices": 5},
                                   "scenarios": [{"id": "a", "duration_s": 1.24}]}))
    assert main([str(summary)]) == 0
    assert json.loads(capsys.readouterr().out) == {"a": 1.2}
    assert main(["--load", str(summary)]) == 0
    assert json.loads(capsys.readouterr().out) == {"slices": 5, "git_sha": "abc"}
