"""The model-bound section's pure parts: its keys, the order of its systems, its tables,
issue 55's ratios and targets, and its plan (``bench.stats``, ``bench.report``, ``bench.env``)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.env import ModelBoundPlan
from bench.report import model_bound_markdown
from bench.stats import (
    FIGURES,
    evaluate,
    mb_prefix,
    mb_prefixes,
    mb_processes,
    mb_qimpl_phases,
    mb_ratios,
    mb_systems,
    mb_table,
    rows,
)

P = mb_prefix(200, 3, 1000)


def _values() -> dict[str, Any]:
    v: dict[str, Any] = {
        f"{P}.qimpl.runs_per_s": 6.0, f"{P}.qimpl.slots": 20, f"{P}.qimpl.pg_worker_peak": 27,
        f"{P}.qimpl.completed": 200, f"{P}.qimpl.runs": 200, f"{P}.qimpl.p50_s": 17.25, f"{P}.qimpl.p95_s": 31.0,
        f"{P}.qimpl.pg_server_peak": 40, f"{P}.qimpl.pg_mem_mib": 150.4, f"{P}.qimpl.pg_mem_kind": "pss",
        f"{P}.qimpl.pg_cpu_s": 3.25, f"{P}.qimpl.rss_mib.worker": 120.0, f"{P}.qimpl.cpu_s.worker": 9.5,
        f"{P}.qimpl.rss_mib.api": 110.0, f"{P}.qimpl.cpu_s.api": 2.0,
        f"{P}.qimpl.accept_span_s": 4.5, f"{P}.qimpl.to_claim_p50_s": 15.0, f"{P}.qimpl.to_claim_p95_s": 28.0,
        f"{P}.qimpl.claim_to_done_p50_s": 3.1,
        f"{P}.qimpl_slots200.runs_per_s": 17.0, f"{P}.qimpl_slots200.slots": 200,
        f"{P}.qimpl_slots200.pg_worker_peak": 139,
        f"{P}.qimpl_slots40.runs_per_s": 9.0, f"{P}.qimpl_slots40.slots": 40,
        f"{P}.floor.runs_per_s": 20.0, f"{P}.floor.pg_worker_peak": 0,
        f"{P}.dbos.runs_per_s": 48.0, f"{P}.dbos.pg_worker_peak": 21,
    }
    return v


def test_prefix_names_the_shape() -> None:
    assert mb_prefix(1000, 3, 1000) == "mb.1000x3x1000"
    assert mb_prefixes({"mb.1000x3x1000.floor.runs_per_s": 1.0, "mb.20x2x200.dbos.runs_per_s": 2.0,
                        "qimpl.tput_c1": 3.0}) == ["mb.20x2x200", "mb.1000x3x1000"]


def test_systems_in_display_order_slots_by_number() -> None:
    assert mb_systems(_values(), P) == ["qimpl", "qimpl_slots40", "qimpl_slots200", "floor", "dbos"]
    assert mb_systems(_values(), mb_prefix(20, 2, 200)) == []
    # a per-process key is no system of its own
    assert mb_systems({f"{P}.qimpl.rss_mib.runs_per_s": 1.0}, P) == []


def test_ratios_against_the_floor_and_dbos_and_the_session_cap() -> None:
    got = {(r.system, r.label.split(": ", 1)[1]): r for r in mb_ratios(_values(), P)}
    floor = got[("qimpl", "runs/s / floor's")]
    assert floor.value == pytest.approx(0.3) and floor.limit == 0.8 and floor.met is False
    assert floor.text() == "0.30 (target >= 0.80): missed"
    dbos = got[("qimpl_slots200", "runs/s / DBOS's")]
    assert dbos.value == pytest.approx(17 / 48) and dbos.met is False
    sessions = got[("qimpl", "worker's peak PG sessions")]
    assert sessions.value == 27 and sessions.met is True and sessions.text() == "27 (target <= 30): met"
    assert got[("qimpl_slots200", "worker's peak PG sessions")].met is False
    assert got[("qimpl_slots200", "runs/s / floor's")].met is True  # 0.85 >= 0.8
    # the floor and DBOS are references, not judged
    assert {s for s, _ in got} == {"qimpl", "qimpl_slots40", "qimpl_slots200"}


def test_ratio_without_its_reference_is_not_measured() -> None:
    values = {k: v for k, v in _values().items() if not k.startswith(f"{P}.dbos.")}
    r = next(r for r in mb_ratios(values, P) if r.system == "qimpl" and "DBOS" in r.label)
    assert r.value is None and r.met is None and r.text().endswith("not measured")


def test_system_table_cells() -> None:
    header, body = mb_table(_values(), P)
    assert len(header) == len(body[0]) == 9
    qimpl = dict(zip(header, body[0], strict=True))
    assert qimpl["system"] == "qimpl, defaults (20 activity slots)"
    assert qimpl["completed"] == "200/200"
    assert qimpl["runs/s"] == "6.0" and qimpl["p50"] == "17.25 s" and qimpl["p95"] == "31.00 s"
    assert qimpl["worker's PG sessions peak"] == "27" and qimpl["PG sessions peak (server)"] == "40"
    assert qimpl["PG backends memory peak"] == "150 MiB (pss)" and qimpl["PG CPU"] == "3.2 s"
    floor = dict(zip(header, body[3], strict=True))
    assert floor["system"].startswith("floor") and floor["p50"] == "-" and floor["PG backends memory peak"] == "-"
    assert body[1][0] == "qimpl, 40 activity slots"


def test_process_table_lists_each_process_of_each_system() -> None:
    header, body = mb_processes(_values(), P)
    assert header == ["system", "process", "peak RSS", "CPU"]
    assert body == [["qimpl, defaults (20 activity slots)", "api", "110 MiB", "2.0 s"],
                    ["qimpl, defaults (20 activity slots)", "worker", "120 MiB", "9.5 s"]]


def test_qimpl_phase_table_only_for_qimpl() -> None:
    header, body = mb_qimpl_phases(_values(), P)
    assert len(header) == 5 and [r[0] for r in body] == ["qimpl, defaults (20 activity slots)",
                                                         "qimpl, 40 activity slots", "qimpl, 200 activity slots"]
    assert body[0][1:] == ["4.50 s", "15.00 s", "28.00 s", "3.10 s"]
    assert body[1][1:] == ["-"] * 4


def test_markdown_has_the_four_tables_per_shape() -> None:
    text = model_bound_markdown(_values())
    assert text.startswith("Model-bound load: 200 runs x 3 steps x 1,000 ms")
    table_rows = [ln for ln in text.splitlines() if ln.startswith("| ")
                  and not ln.startswith(("| system |", "| issue 55 |", "| qimpl |"))]
    # systems, processes, qimpl's phases, 3 ratios x 3 qimpl configurations
    assert len(table_rows) == 5 + 2 + 3 + 9
    assert "| qimpl, defaults (20 activity slots): runs/s / floor's | 0.30 (target >= 0.80): missed |" in text
    assert model_bound_markdown({"qimpl.tput_c1": 1.0}) == ""


def test_targets_and_figure_rows_of_the_default_shapes() -> None:
    results = {r.target: r for r in evaluate(_values())}
    assert results["mb-floor-200x3x1000"].met is False  # 6 < 0.8 x 20
    assert results["mb-floor-200x3x1000"].limit == pytest.approx(16.0)
    assert results["mb-dbos-200x3x1000"].met is False  # 6 < 0.5 x 48
    assert results["mb-sessions-200x3x1000"].met is True  # 27 <= 30
    assert results["mb-floor-1000x3x1000"].met is None
    table = {r.spec.key: r for r in rows(_values())}
    assert table[f"{P}.qimpl.runs_per_s"].ratio == pytest.approx(0.3)
    assert table[f"{P}.qimpl.runs_per_s_vs_dbos"].ratio == pytest.approx(6 / 48)
    assert {f.key for f in FIGURES if f.key.startswith("mb.1000x3x1000.")}


def test_model_bound_plan() -> None:
    assert ModelBoundPlan.of(False) == ModelBoundPlan(runs=(200, 1000), steps=3, delay_ms=1000)
    assert ModelBoundPlan.of(True).runs == (20,)
    for bad in ({"runs": ()}, {"runs": (0,)}, {"steps": 0}, {"delay_ms": -1}, {"slots": (0,)}):
        with pytest.raises(ValueError):
            ModelBoundPlan(**bad)  # type: ignore[arg-type]
