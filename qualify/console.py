"""The terminal output of a ``qualify`` session: one line per finished scenario with its
``[k/N elapsed ETA]`` prefix and failed checks, a rich progress bar on a terminal, and the
verdict with each failed scenario's repro command."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape as esc
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from qualify.schedule import SIZE_UNIT

if TYPE_CHECKING:
    from qualify.schedule import Schedule

__all__ = ["STYLE", "TALLY", "Tally", "clock", "console", "eta_s", "finish", "nothing_to_shrink", "progress",
           "shrunk_line"]

console = Console(highlight=False, soft_wrap=True)
STYLE = {"pass": "green", "fail": "bold red", "crashed": "bold magenta", "unknown": "yellow",
          "vacuous": "yellow", "flaky": "yellow"}


class Tally:
    """How far a session is: ``k/N``, elapsed and an ETA (the mean time per finished
    scenario times those left), printed at the start of each result line; on a terminal
    also a rich progress bar under the lines (CI logs, not a terminal, get the lines only)."""

    def __init__(self) -> None:
        self.total = 0
        self.done = 0
        self.t0 = time.monotonic()
        self.bar: Progress | None = None
        self.task: Any = None
        #: The session's expected wall seconds (``qualify.timing.expected_wall_s``), or None.
        self.expected_s: float | None = None

    def plan(self, total: int, expected_s: float | None = None) -> None:
        self.total, self.done, self.t0 = total, 0, time.monotonic()
        self.expected_s = expected_s
        if console.is_terminal and total > 1:
            self.bar = Progress(TextColumn("qualify"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                console=console, transient=True)
            self.task = self.bar.add_task("scenarios", total=total)
            self.bar.start()

    def finished(self) -> str:
        """Count one finished scenario; its ``[k/N mm:ss ETA mm:ss]`` prefix."""
        self.done += 1
        if self.bar is not None:
            self.bar.advance(self.task)
        elapsed = time.monotonic() - self.t0
        if not self.total:
            return ""
        left = eta_s(elapsed, self.done, self.total, self.expected_s)
        return f"[{self.done}/{self.total} {clock(elapsed)} ETA {clock(left)}] "

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def eta_s(elapsed: float, done: int, total: int, expected_s: float | None) -> float:
    """Seconds left (pure): the mean time per finished scenario times those left, blended,
    when the session's expected wall seconds are known, with what is left of them, in
    proportion to the scenarios finished. The parallel slices finish their short scenarios
    first while the long ones run, so the mean alone starts far too high (23 min for a
    1 min 42 s run) and the plan alone cannot see a slow machine."""
    if done <= 0 or total <= 0:
        return max((expected_s or 0.0) - elapsed, 0.0)
    mean_left = elapsed / done * max(total - done, 0)
    if expected_s is None:
        return mean_left
    w = min(done / total, 1.0)
    return (1 - w) * max(expected_s - elapsed, 0.0) + w * mean_left


def clock(seconds: float) -> str:
    """``seconds`` as ``m:ss``."""
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}:{secs:02d}"


TALLY = Tally()


def progress(kind: str, data: Any) -> None:
    """Print one event of a session (``run_session``'s ``on_event``): its seed, plan,
    stack, slices and each scenario's result line with its failed checks."""
    if kind == "seed":
        console.print(f"seed {data}")
    elif kind == "plan":
        TALLY.plan(int(data["total"]), data.get("expected_s"))
    elif kind == "stack":
        console.print(f"stack {data.kind}: PostgreSQL {data.postgres_version}, "
                      f"Temporal {data.temporal_version}, booted in {data.boot_s:.2f} s"
                      + (f"; timers tuned ({', '.join(f'{k}={v}' for k, v in data.temporal_config.items())}),"
                         " but for the scenarios that run on a second server with the defaults"
                         if data.temporal_config else ""))
    elif kind == "slice":
        ids = data["scenarios"]
        shown = ", ".join(ids) if len(ids) <= 12 else f"{', '.join(ids[:3])}, … {ids[-1]} ({len(ids)} scenarios)"
        console.print(f"slice {data['index']}: {shown}")
    elif kind == "refused":
        console.print(f"  {esc(data.id)} [yellow]refused[/]: it restarts PostgreSQL or Temporal, "
                      "which this stack did not start")
    elif kind == "scenario_start":
        pass  # the line is printed whole when the scenario ends (a live bar would tear a half line)
    elif kind == "scenario_end":
        v = data["status"]
        rate = f", reproduced {data['reproduction']}" if data.get("reproduction") else ""
        console.print(f"  {TALLY.finished()}{esc(data['id'])} … [{STYLE.get(v, 'white')}]{v}[/]"
                      f" ({data['duration_s']:.1f} s{rate})")
        for c in data["checks"]:
            if c["ok"] is not True:
                console.print(f"    [red]✗[/] {esc(c['name'])}: {esc(c['detail'])}")
        if data["error"]:
            console.print(f"    [magenta]{esc(data['error'].splitlines()[-1])}[/]")
    elif kind == "keep":
        console.print("[yellow]--keep: the stack stays up; Ctrl-C to tear it down[/]")
        console.print(f"  psql {data['pg_dsn']}    (databases: {data['databases']})")
        console.print(f"  temporal workflow list --address {data['temporal_address']}")
        console.print("  attach an API and a worker to a scenario's database (<db> from psql's \\l):")
        for role, command in (("qimpl_worker", "python -m qimpl.workflows.worker"),
                              ("qimpl_api", "uvicorn --factory qimpl.api.app:create_app --port 8000")):
            dsn = data["pg_dsn"].split("://", 1)[1].split("@", 1)[-1].rsplit("/", 1)[0]
            console.print(f"    QIMPL_DATABASE_URL=postgresql://{role}@{dsn}/<db> QIMPL_TEMPORAL_ADDRESS="
                          f"{data['temporal_address']} QIMPL_TASK_QUEUE=<queue> {command}")
    elif kind == "shrink_try":
        console.print(f"  shrink: tried {esc(data['shape'])} (size {data['size']}): {data['verdict']}")
    elif kind == "shrunk":
        console.print(f"  shrink: still fails at {esc(data['shape'])} (size {data['size']})")


def finish(summary: dict[str, Any], report_dir: Path, code: int) -> int:
    """Print the verdict, each failed scenario's repro and the report; returns ``code``."""
    TALLY.stop()
    v = summary["verdict"]
    console.print(f"verdict [{STYLE.get(v, 'white')}]{v.upper()}[/] in {summary['duration_s']:.1f} s "
                  f"({len(summary['scenarios'])} scenario{'' if len(summary['scenarios']) == 1 else 's'}, "
                  f"{summary.get('scenarios_per_hour', 0)} an hour)")
    if summary.get("error"):
        console.print(f"  [red]{esc(summary['error'])}[/]")
    if summary.get("full_run") is False:
        from qualify.report import selection_words

        console.print(f"  [yellow]{selection_words(summary)}: not a release sign-off[/]")
    for s in summary["scenarios"]:
        if s["status"] != "pass":
            console.print(f"  repro: {s['repro']}")
    console.print(f"report: {report_dir}  ({report_dir / 'report.html'})")
    return code


def shrunk_line(minimal: Schedule, start: Schedule, tried: int) -> str:
    """``qualify repro --shrink``'s result, its size in words and its unit."""
    if minimal.size == start.size:
        return (f"no smaller schedule fails: {minimal.shape} (size {minimal.size}, counting "
                f"{SIZE_UNIT}; {tried} replays)")
    return (f"minimal failing schedule: {minimal.shape} (size {minimal.size}, from {start.size}, counting "
            f"{SIZE_UNIT}; was {start.shape}; {tried} replays)")


def nothing_to_shrink(scenarios: list[dict[str, Any]]) -> str:
    """What ``qualify repro --shrink`` says when no scenario failed: shrinking keeps a
    schedule only while it fails, so a schedule that did not fail has nothing to shrink."""
    ended = ", ".join(f"{s['id']} {'passed' if s['status'] == 'pass' else 'ended ' + s['status']}"
                      for s in scenarios) or "no scenario ran"
    return f"--shrink: nothing to shrink ({ended}); a schedule is shrunk only while it fails"
