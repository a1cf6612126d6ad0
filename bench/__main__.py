"""``python -m bench``: the floor (bare Temporal + PostgreSQL), qimpl and the peer (DBOS
Transact) side by side on one embedded stack, plus recovery, resources and qualification
figures; prints one table, writes ``bench/results/<UTC stamp>.json`` and a chart.

    python -m bench [--quick] [--qualify] [--out DIR] [--section NAME ...] [--publish] [--note TEXT]
                    [--mb-runs N ...] [--mb-steps S] [--mb-delay-ms D] [--mb-slots K ...]

Figures, not pass/fail: the exit code is 0 unless the command itself broke (2) or was
used wrongly (64). Targets are reported as met, missed or not measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bench.env import ROOT, ModelBoundPlan
from bench.run import SECTIONS, run_bench

app = typer.Typer(add_completion=False)


@app.command()
def main(
    quick: Annotated[bool, typer.Option("--quick", help="few iterations (development, smoke test)")] = False,
    full_qualify: Annotated[bool, typer.Option("--qualify", help="also time the full `qualify run` at -n 1 and -n auto (minutes)")] = False,
    out: Annotated[Path, typer.Option("--out", help="where <stamp>.json and <stamp>.png go")] = ROOT / "bench" / "results",
    section: Annotated[list[str] | None, typer.Option("--section", "-s", help=f"only these sections: {', '.join(SECTIONS)}")] = None,
    publish: Annotated[bool, typer.Option("--publish", help="also write bench/RESULTS.md and bench/latest.png (the curated copy the README links)")] = False,
    note: Annotated[str, typer.Option("--note", help="a remark stored with the results (e.g. how the machine was shared)")] = "",
    mb_runs: Annotated[list[int] | None, typer.Option("--mb-runs", help="model_bound: runs started at once, one measurement each (default 200 and 1000; --quick 20)")] = None,
    mb_steps: Annotated[int | None, typer.Option("--mb-steps", help="model_bound: steps per run (default 3; --quick 2)")] = None,
    mb_delay_ms: Annotated[int | None, typer.Option("--mb-delay-ms", help="model_bound: ms each step waits on the provider (default 1000; --quick 200)")] = None,
    mb_slots: Annotated[list[int] | None, typer.Option("--mb-slots", help="model_bound: also qimpl with a worker of this many activity slots (QIMPL_MAX_CONCURRENT_ACTIVITIES), beside its default")] = None,
) -> None:
    """Run the benchmark on one embedded stack and print every figure with its ratio."""
    chosen = section or list(SECTIONS)
    unknown = set(chosen) - set(SECTIONS)
    if unknown:
        typer.echo(f"unknown section(s) {', '.join(sorted(unknown))}; known: {', '.join(SECTIONS)}", err=True)
        raise typer.Exit(64)
    base = ModelBoundPlan.of(quick)
    try:
        plan = ModelBoundPlan(runs=tuple(mb_runs) if mb_runs else base.runs,
                              steps=base.steps if mb_steps is None else mb_steps,
                              delay_ms=base.delay_ms if mb_delay_ms is None else mb_delay_ms,
                              slots=tuple(mb_slots or ()))
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(64) from None
    doc = run_bench(sections=chosen, quick=quick, full_qualify=full_qualify, out=out, publish=publish,
                    note=note, model_bound=plan)
    raise typer.Exit(2 if doc["errors"] else 0)


if __name__ == "__main__":
    app()
