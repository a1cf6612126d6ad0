"""The benchmark's report: the Markdown table and the previous results it falls back to."""

from __future__ import annotations

import json
from pathlib import Path

from bench.report import latest_previous, markdown
from bench.stats import FIGURES, TARGETS, evaluate, rows


def test_markdown_has_a_row_per_figure_and_per_target() -> None:
    values = {"floor.tput_c1": 10.0, "qimpl.tput_c1": 4.0}
    text = markdown(rows(values), evaluate(values), meta={"git_sha": "abc", "mode": "full", "wall_s": 600},
                    target_text={t.id: t.text for t in TARGETS})
    lines = text.splitlines()
    assert "git abc" in lines[0] and "600 s" in lines[0]
    assert sum(1 for ln in lines if ln.startswith("| ") and " | " in ln) == len(FIGURES) + len(TARGETS) + 2
    assert "| 0.40x floor.tput_c1 |" in text
    assert "**missed**" in text  # 4 < 0.5 x 10
    assert "not measured in this run" in text


def test_latest_previous_takes_the_newest_file_with_figures(tmp_path: Path) -> None:
    (tmp_path / "20260101T000000Z.json").write_text(json.dumps({"figures": {"qual.run_n1_s": 400.0}}))
    (tmp_path / "20260102T000000Z.json").write_text(json.dumps({"figures": {"qual.run_n1_s": 420.0}}))
    (tmp_path / "20260103T000000Z.json").write_text("{not json")
    current = tmp_path / "20260104T000000Z.json"
    current.write_text(json.dumps({"figures": {"qual.run_n1_s": 1.0}}))
    assert latest_previous(tmp_path, exclude=current) == ({"qual.run_n1_s": 420.0}, "20260102T000000Z.json")
    assert latest_previous(tmp_path / "missing") == ({}, "")
