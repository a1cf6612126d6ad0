"""The benchmark's outputs: one table (terminal and Markdown), the JSON results file and
the latency/throughput chart. Formatting only: the numbers come from ``bench.stats``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.stats import (
    CONCURRENCY,
    FigureRow,
    TargetResult,
    format_value,
    mb_prefixes,
    mb_processes,
    mb_qimpl_phases,
    mb_ratios,
    mb_table,
)

__all__ = ["console_table", "draw_chart", "latest_previous", "markdown", "model_bound_markdown", "write_json"]


def _ratio(row: FigureRow) -> str:
    if row.ratio is None:
        return "-"
    return f"{row.ratio:.2f}x {row.spec.ref}"


def console_table(rows: Sequence[FigureRow], targets: Sequence[TargetResult]) -> Table:
    """A rich table of every figure (value, ratio to its reference, status) and the targets."""
    table = Table(title="python -m bench", show_lines=False)
    for col in ("section", "figure", "value", "ratio to", "status"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.spec.section, r.spec.label, format_value(r.value, r.spec.unit), _ratio(r),
                      "" if r.status == "measured" else r.status)
    for t in targets:
        mark = {True: "[green]met[/]", False: "[red]missed[/]", None: "[yellow]not measured[/]"}[t.met]
        table.add_row("target", t.target, mark, "", t.detail)
    return table


def print_table(rows: Sequence[FigureRow], targets: Sequence[TargetResult]) -> None:
    Console(highlight=False, width=160).print(console_table(rows, targets))


def markdown(rows: Sequence[FigureRow], targets: Sequence[TargetResult], *, meta: Mapping[str, Any],
             target_text: Mapping[str, str]) -> str:
    """The table and the targets as Markdown (``bench/RESULTS.md``)."""
    out = [f"Measured {meta.get('finished_at', '?')} at git {meta.get('git_sha', '?')}"
           f"{' (dirty)' if meta.get('git_dirty') else ''}, mode `{meta.get('mode', '?')}`, "
           f"bench wall time {meta.get('wall_s', 0):.0f} s, {meta.get('cpus', '?')} CPUs, "
           f"1-minute load average {meta.get('loadavg_1min', '?')} (start, end)."
           + (f" {meta['note']}" if meta.get("note") else ""), "",
           "| section | figure | value | ratio to | status |", "|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.spec.section} | {r.spec.label} | {format_value(r.value, r.spec.unit)} | "
                   f"{_ratio(r)} | {'' if r.status == 'measured' else r.status} |")
    out += ["", "| target | result | detail |", "|---|---|---|"]
    for t in targets:
        res = {True: "met", False: "**missed**", None: "not measured"}[t.met]
        out.append(f"| {target_text.get(t.target, t.target)} | {res} | {t.detail} |")
    return "\n".join(out) + "\n"


def _md_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in body)]


def model_bound_markdown(values: Mapping[str, Any], prefix: str | None = None) -> str:
    """The model-bound section's tables as Markdown, for ``prefix`` (one shape,
    ``mb.<runs>x<steps>x<delay_ms>``) or every shape in ``values``: one row per system,
    one per process (peak RSS, CPU seconds), where qimpl's runs spent their time, and issue
    55's ratios with their targets.
    "" when no shape was measured."""
    out: list[str] = []
    for p in [prefix] if prefix else mb_prefixes(values):
        header, body = mb_table(values, p)
        if not body:
            continue
        runs, steps, delay_ms = p.split(".", 1)[1].split("x")
        out += ["", f"Model-bound load: {int(runs):,} runs x {steps} steps x {int(delay_ms):,} ms on the provider, "
                "all started at once", ""]
        out += _md_table(header, body)
        out += [""]
        out += _md_table(*mb_processes(values, p))
        out += ["", *_md_table(*mb_qimpl_phases(values, p))]
        out += ["", *_md_table(["issue 55", "value"], [[r.label, r.text()] for r in mb_ratios(values, p)])]
    return "\n".join(out).lstrip("\n") + ("\n" if out else "")


def write_json(path: Path, doc: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")


def latest_previous(results_dir: Path, exclude: Path | None = None) -> tuple[dict[str, Any], str]:
    """Figures of the newest ``<timestamp>.json`` in ``results_dir`` (not ``exclude``) and
    its file name; ({}, "") when there is none."""
    files = sorted(p for p in results_dir.glob("*.json") if p != exclude)
    for path in reversed(files):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        figures = doc.get("figures")
        if isinstance(figures, dict):
            return figures, path.name
    return {}, ""


def draw_chart(path: Path, figures: Mapping[str, float | None], *, title: str) -> None:
    """Throughput (left) and end-to-end p50 latency (right) against concurrency for
    qimpl, the floor and DBOS, as a PNG at ``path`` (``<prefix>.lat_c<C>_p50_s``: the p50
    of one operation's latency under that closed-loop load)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, prefix, style in (("floor (bare Temporal)", "floor", "s--"), ("qimpl", "qimpl", "o-"),
                                ("DBOS Transact", "dbos", "^:")):
        xs = [c for c in CONCURRENCY if figures.get(f"{prefix}.tput_c{c}") is not None]
        if xs:
            left.plot(xs, [figures[f"{prefix}.tput_c{c}"] for c in xs], style, label=name)
    if left.lines:
        left.set_xscale("log")
    left.set_xlabel("concurrency (in flight)")
    left.set_ylabel("completed per second (1 worker process)")
    left.set_title("throughput")
    if left.lines:
        left.legend()
    for name, prefix, style in (("floor (bare Temporal)", "floor", "s--"), ("qimpl", "qimpl", "o-"),
                                ("DBOS Transact", "dbos", "^:")):
        xs = [c for c in CONCURRENCY if figures.get(f"{prefix}.lat_c{c}_p50_s") is not None]
        if xs:
            right.plot(xs, [1000 * float(figures[f"{prefix}.lat_c{c}_p50_s"] or 0) for c in xs], style,
                   label=name)
    if right.lines:
        right.set_xscale("log")
        right.set_yscale("log")
    right.set_xlabel("concurrency (in flight)")
    right.set_ylabel("end-to-end p50, ms")
    right.set_title("latency under load")
    if right.lines:
        right.legend()
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    for ax in (left, right):
        if ax.lines:
            shown = sorted({int(x) for line in ax.lines for x in line.get_xdata()})
            ax.set_xticks(shown, [str(c) for c in shown])
            ax.yaxis.set_major_formatter(ScalarFormatter())
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.xaxis.set_minor_formatter(NullFormatter())
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
