"""The ``qualify`` command: ``run``, ``list``, ``repro``.

Exit codes (``qualify run`` / ``repro``): 0 pass, 1 fail, 2 crashed, 3 unknown,
4 vacuous, 5 flaky, 130 interrupted.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from qualify.errors import HarnessError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Fault-injection qualification of durable agent runs.")
console = Console(highlight=False, soft_wrap=True)

_STYLE = {"pass": "green", "fail": "bold red", "crashed": "bold magenta", "unknown": "yellow",
          "vacuous": "yellow", "flaky": "yellow"}


def _progress(kind: str, data: Any) -> None:
    if kind == "seed":
        console.print(f"seed {data}")
    elif kind == "stack":
        console.print(f"stack {data.kind}: PostgreSQL {data.postgres_version}, "
                      f"Temporal {data.temporal_version}, booted in {data.boot_s:.2f} s")
    elif kind == "scenario_start":
        console.print(f"  {data.id} …", end="")
    elif kind == "scenario_end":
        v = str(data.verdict)
        console.print(f" [{_STYLE.get(v, 'white')}]{v}[/] ({data.duration_s:.1f} s)")
        for c in data.checks:
            if c.ok is not True:
                console.print(f"    [red]✗[/] {c.name}: {c.detail}")
        if data.error:
            console.print(f"    [magenta]{data.error.splitlines()[-1]}[/]")


def _session(scenario_ids: list[str], seed: int | None, stack: str, reports: Path) -> int:
    from qualify.session import run_session

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        summary, report_dir, code = run_session(scenario_ids=scenario_ids, seed=seed,
                                                stack_kind=stack, reports_root=reports,
                                                on_event=_progress)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: every process was stopped[/]")
        return 130
    except HarnessError as exc:
        console.print(f"[magenta]harness error:[/] {exc}")
        return 2
    v = summary["verdict"]
    console.print(f"verdict [{_STYLE.get(v, 'white')}]{v.upper()}[/] in {summary['duration_s']:.1f} s")
    if summary.get("error"):
        console.print(f"  [red]{summary['error']}[/]")
    for s in summary["scenarios"]:
        if s["status"] != "pass":
            console.print(f"  repro: {s['repro']}")
    console.print(f"report: {report_dir}")
    return code


StackOpt = Annotated[str, typer.Option("--stack", help="embedded (wheel binaries) or system")]
ReportsOpt = Annotated[Path, typer.Option("--reports-dir", help="where reports are written")]


@app.command()
def run(
    scenario: Annotated[list[str] | None, typer.Option("--scenario", "-s", help="scenario id (repeatable); default all")] = None,
    seed: Annotated[int | None, typer.Option(help="root seed; random when omitted")] = None,
    stack: StackOpt = "embedded",
    reports_dir: ReportsOpt = Path("reports"),
) -> None:
    """Boot a disposable stack, run the scenarios, write a sign-off report."""
    raise typer.Exit(_session(scenario or [], seed, stack, reports_dir))


@app.command()
def repro(
    scenario_id: Annotated[str, typer.Argument(help="the scenario to re-run")],
    seed: Annotated[int, typer.Option(help="the seed from the report")],
    stack: StackOpt = "embedded",
    reports_dir: ReportsOpt = Path("reports"),
) -> None:
    """Re-run one scenario with the seed a report printed."""
    raise typer.Exit(_session([scenario_id], seed, stack, reports_dir))


@app.command("list")
def list_(
    crash_points: Annotated[bool, typer.Option("--crash-points", help="list the crash points declared in qimpl")] = False,
) -> None:
    """List the scenarios (or the crash points)."""
    if crash_points:
        from qualify.session import crash_point_catalog

        for name, doc in crash_point_catalog().items():
            console.print(f"{name}\t{doc}")
        return
    from qualify.scenarios import REGISTRY

    for sc in REGISTRY.values():
        console.print(f"{sc.id}\t{sc.title}\t[{' '.join(sc.requirements)}]")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
