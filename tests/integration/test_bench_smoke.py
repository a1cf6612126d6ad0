"""The benchmark's quick mode on the floor section only: the command runs end to end on
the embedded stack and its results have the expected shape. No timed assertion: speed
figures live in ``bench/``, and here they only have to be measured (positive)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from bench.run import run_bench
from bench.stats import FIGURES, TARGETS


def test_quick_floor_section_writes_a_well_formed_result(tmp_path: Path) -> None:
    doc = run_bench(sections=["floor"], quick=True, out=tmp_path, log=lambda _: None)
    assert doc["errors"] == {}
    written = sorted(tmp_path.glob("*.json"))
    assert len(written) == 1 and json.loads(written[0].read_text())["figures"] == doc["figures"]
    if importlib.util.find_spec("matplotlib") is not None:  # the 'bench' extra draws the chart
        assert written[0].with_suffix(".png").stat().st_size > 0
    figures = doc["figures"]
    expected = {"floor.wf_p50_s", "floor.wf_p95_s", "floor.start_p50_s", "floor.commit_p50_s",
                "floor.tput_c1", "floor.tput_c10"}
    assert expected <= set(figures)
    assert all(figures[k] > 0 for k in expected), figures
    assert figures["floor.wf_p95_s"] >= figures["floor.wf_p50_s"]
    # One row per declared figure; those of sections not run are marked, not invented.
    table = {r["key"]: r for r in doc["table"]}
    assert set(table) == {f.key for f in FIGURES}
    assert table["floor.tput_c1"]["status"] == "measured"
    assert table["qimpl.e2e_p50_s"]["status"] == "not measured in this run"
    assert table["qimpl.e2e_p50_s"]["value"] is None
    assert {t["target"] for t in doc["targets"]} == {t.id for t in TARGETS}
    assert doc["provenance"]["git_sha"] and doc["meta"]["mode"] == "quick"


def test_model_bound_section_measures_three_systems(tmp_path: Path) -> None:
    """The model-bound section at a tiny shape (4 runs x 1 step x 50 ms, qimpl also with 2
    slots): every system's runs complete and every figure the tables read is there."""
    pytest.importorskip("dbos")
    from bench.env import ModelBoundPlan
    from bench.model_bound import DEFAULT_SLOTS
    from bench.report import model_bound_markdown
    from bench.stats import mb_prefix

    plan = ModelBoundPlan(runs=(4,), steps=1, delay_ms=50, slots=(2,))
    doc = run_bench(sections=["model_bound"], quick=True, out=tmp_path, model_bound=plan, log=lambda _: None)
    assert doc["errors"] == {}
    figures, p = doc["figures"], mb_prefix(4, 1, 50)
    for system in ("qimpl", "qimpl_slots2", "floor", "dbos"):
        assert figures[f"{p}.{system}.completed"] == 4, system
        assert figures[f"{p}.{system}.runs_per_s"] > 0
        assert figures[f"{p}.{system}.p95_s"] >= figures[f"{p}.{system}.p50_s"] >= 0.05
        assert figures[f"{p}.{system}.pg_mem_mib"] > 0 and figures[f"{p}.{system}.rss_mib.temporal"] > 0
    assert figures[f"{p}.qimpl.slots"] == DEFAULT_SLOTS and figures[f"{p}.qimpl_slots2.slots"] == 2
    assert figures[f"{p}.qimpl.pg_worker_peak"] >= 1 and figures[f"{p}.dbos.pg_worker_peak"] >= 1
    assert figures[f"{p}.floor.pg_worker_peak"] == 0
    assert figures[f"{p}.qimpl.cpu_s.worker"] > 0 and figures[f"{p}.dbos.cpu_s.dbos"] > 0
    assert "qimpl, 2 activity slots: runs/s / floor's" in model_bound_markdown(figures)
