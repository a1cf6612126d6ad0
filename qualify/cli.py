"""The ``qualify`` command: ``run``, ``repro``, ``list``, and ``up`` (a running service).

Exit codes (``run`` and ``repro``): 0 pass, 1 fail, 2 crashed, 3 unknown, 4 vacuous,
5 flaky, 64 usage error (bad option, unknown scenario or stack), 130 interrupted.
"""

from __future__ import annotations

import inspect
import json
import os
import secrets
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape as esc

from qualify import interrupt
from qualify.console import TALLY, console, finish, nothing_to_shrink, progress, shrunk_line
from qualify.errors import HarnessError, UsageError
from qualify.up import TOOLS_SAID, UpOptions

#: Exit code of a wrong command line (EX_USAGE), distinct from every verdict's.
EXIT_USAGE = 64

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Fault-injection qualification of durable agent runs.")
#: What the ``up`` loop waits on between checks of its children (never set: a pause that
#: a signal still interrupts at once, as the handler raises in the main thread).
_PAUSE = threading.Event()
#: ``qualify up``: an API or worker that exits again this soon (seconds) after its restart
#: stops everything (a crash loop is a finding, not something to hide).
RESTART_AFTER_S = 10.0
CORPUS = Path(__file__).resolve().parents[1] / "tests" / "corpus.jsonl"


StackOpt = Annotated[str, typer.Option("--stack", help="embedded | system | existing | testcontainers")]
ReportsOpt = Annotated[Path, typer.Option("--reports-dir", help="where reports are written")]
PgDsnOpt = Annotated[str, typer.Option("--pg-dsn", help="--stack existing: PostgreSQL DSN that may create databases")]
TemporalOpt = Annotated[str, typer.Option("--temporal-address", help="--stack existing: host:port")]


@app.command()
def run(
    scenario: Annotated[list[str] | None, typer.Option("--scenario", "-s", help="scenario id (repeatable); default all")] = None,
    random_n: Annotated[int, typer.Option("--random", min=0, help="generate N random scenarios (workload + faults) from the seed")] = 0,
    seed: Annotated[int | None, typer.Option(min=0, help="root seed (>= 0); random when omitted")] = None,
    stack: StackOpt = "embedded",
    pg_dsn: PgDsnOpt = "",
    temporal_address: TemporalOpt = "",
    reports_dir: ReportsOpt = Path("reports"),
    reruns: Annotated[int, typer.Option(min=0, help="re-run a failing scenario N times to measure flakiness")] = 1,
    parallel: Annotated[str, typer.Option("-n", "--parallel", help="parallel slices, each with its own stack; 'auto' = as many as the measured load of a full run fills the CPUs with (at most 2.5 per CPU; 5 on 2 CPUs) on an embedded or system stack (never more than the scenarios), else one")] = "auto",
    determinism_check: Annotated[bool, typer.Option("--determinism-check", help="measure how reproducible the harness is, and exit")] = False,
    shard: Annotated[str | None, typer.Option("--shard", help="K/N: run only the K-th of N shards of the selection (merge the shards' reports with qualify merge)")] = None,
    spawn: Annotated[str, typer.Option("--spawn", help="how API and worker processes start: auto (the named exec set execs its entry points, every other scenario forks from a preloaded server), fork or exec")] = "auto",
    temporal_timers: Annotated[str, typer.Option("--temporal-timers", help="tuned: the dev server's timer shift at 20 ms (the named default-timer scenarios still run on a server's defaults); default: every scenario on the defaults users run")] = "tuned",
) -> None:
    """Boot a disposable stack, run the scenarios, write a sign-off report."""
    from qualify.session import SessionOptions, auto_slices, parse_shard, run_session

    interrupt.install()
    if determinism_check:
        raise typer.Exit(_determinism(seed, stack, reports_dir))
    if parallel != "auto" and not (parallel.isdigit() and int(parallel) >= 1):
        raise typer.BadParameter("-n takes a number of workers (1 or more) or 'auto'")
    # Slices boot stacks of their own: on a stack the harness does not boot, auto is one.
    n = (auto_slices(os.cpu_count() or 1) if stack in ("embedded", "system") else 1) if parallel == "auto" \
        else int(parallel)
    opts = SessionOptions(scenario_ids=scenario or [], random_n=random_n, seed=seed, stack_kind=stack,
                          pg_dsn=pg_dsn, temporal_address=temporal_address, reports_root=reports_dir,
                          reruns=reruns, parallel=max(1, n), spawn=spawn, temporal_timers=temporal_timers)

    def session() -> int:
        opts.shard = parse_shard(shard) if shard is not None else None
        return finish(*run_session(opts, progress))

    raise typer.Exit(_guarded(session))


@app.command()
def merge(
    shard_dirs: Annotated[list[Path], typer.Argument(help="the report directories of qualify run --shard K/N, one per shard")],
    reports_dir: ReportsOpt = Path("reports"),
) -> None:
    """Merge shard reports into one report with one verdict (the full-run gates apply when
    the shards together are the whole selection)."""
    from qualify.merge import merge_reports

    raise typer.Exit(_guarded(lambda: finish(*merge_reports(shard_dirs, reports_dir))))


@app.command()
def diff(
    old: Annotated[Path, typer.Argument(help="the earlier sign-off: its report directory or summary.json")],
    new: Annotated[Path, typer.Argument(help="this one")],
    markdown: Annotated[bool, typer.Option("--markdown", help="print markdown (for a pull request or a ticket) instead of the terminal rendering")] = False,
) -> None:
    """What changed since the last sign-off: scenarios added or removed, checks that
    appeared, disappeared, changed result or now judge nothing, requirements that lost
    coverage; every figure that changed, and scenario durations that changed by more than
    1 s and 25 %. Exit code 1 when NEW judges less than OLD (a requirement lost coverage, a
    scenario or check disappeared, a check now judges nothing or fails), else 0."""
    from rich.console import Console

    from qualify.diff import diff_summaries, load_summary, print_diff, render_diff

    def body() -> int:
        d = diff_summaries(load_summary(old), load_summary(new))
        if markdown:
            print(render_diff(d), end="")
        else:
            # Wrapped to the terminal (80 columns, or $COLUMNS, when not one), styled only on one.
            print_diff(d, Console(highlight=False))
        return 1 if d["regressions"] else 0

    raise typer.Exit(_guarded(body))


def _guarded(body: Any) -> int:
    try:
        return int(body())
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: every process was stopped[/]")
        return 130
    except UsageError as exc:
        console.print(f"[red]usage:[/] {esc(str(exc))}")
        return EXIT_USAGE
    except HarnessError as exc:
        console.print(f"[magenta]harness error:[/] {esc(str(exc))}")
        return 2
    finally:
        TALLY.stop()


def _determinism(seed: int | None, stack: str, reports_dir: Path) -> int:
    from qualify.determinism import run_check
    from qualify.provenance import git_sha
    from qualify.session import new_report_dir

    seed = seed if seed is not None else secrets.randbits(32)
    console.print(f"seed {seed}")
    import random

    seeds = [random.Random(seed).getrandbits(32) for _ in range(5)]
    out = new_report_dir(reports_dir, git_sha()[0])

    def body() -> int:
        result = run_check(seeds=seeds, sample=2, stack_kind=stack, out_dir=out / "determinism")
        (out / "determinism.json").write_text(json.dumps(result, indent=2, default=str))
        console.print(f"schedules identical: {result['schedules_identical']}; "
                      f"executions identical: {result['executions_identical']}")
        console.print(f"report: {out / 'determinism.json'}")
        same, total = map(int, result["schedules_identical"].split("/"))
        return 0 if same == total else 1

    return _guarded(body)


@app.command()
def repro(
    scenario_id: Annotated[str | None, typer.Argument(help="the scenario to re-run (from the report)")] = None,
    seed: Annotated[int | None, typer.Option(min=0, help="the seed from the report (with --schedule: by default the one the file was saved with)")] = None,
    schedule: Annotated[Path | None, typer.Option("--schedule", help="replay a saved schedule (repro.json)")] = None,
    shrink: Annotated[bool, typer.Option("--shrink", help="delta-debug a failing random schedule to a minimal one")] = False,
    runs: Annotated[int, typer.Option(help="--shrink: replays per candidate")] = 2,
    keep: Annotated[bool, typer.Option("--keep", help="on failure leave the stack up and print how to connect")] = False,
    save_corpus: Annotated[bool, typer.Option("--save-corpus", help="append a failing case to tests/corpus.jsonl")] = False,
    reruns: Annotated[int, typer.Option(min=0, help="re-run a failure N times to measure flakiness")] = 2,
    stack: StackOpt = "embedded",
    pg_dsn: PgDsnOpt = "",
    temporal_address: TemporalOpt = "",
    reports_dir: ReportsOpt = Path("reports"),
) -> None:
    """Re-run one scenario with the seed a report printed (or a saved schedule)."""
    from qualify.session import SessionOptions, run_session

    interrupt.install()
    if scenario_id is None and schedule is None:
        raise typer.BadParameter("name a scenario (with --seed) or give --schedule")
    if scenario_id is not None and seed is None:
        raise typer.BadParameter("--seed is required with a scenario id")
    opts = SessionOptions(scenario_ids=[scenario_id] if scenario_id else [], schedule_path=schedule,
                          seed=seed, stack_kind=stack, pg_dsn=pg_dsn,
                          temporal_address=temporal_address, reports_root=reports_dir, reruns=reruns,
                          keep=keep and not shrink)

    def body() -> int:
        summary, report_dir, code = run_session(opts, progress)
        failed = [s for s in summary["scenarios"] if s["status"] in ("fail", "flaky")]
        if failed and save_corpus:
            _save_corpus(failed[0], summary["seed"])
        if failed and shrink:
            return _shrink(failed[0], summary, report_dir, runs, stack)
        if shrink:
            console.print(f"[yellow]{esc(nothing_to_shrink(summary['scenarios']))}[/]")
        return finish(summary, report_dir, code)

    raise typer.Exit(_guarded(body))


def _save_corpus(doc: dict[str, Any], seed: int) -> None:
    entry = {"scenario": doc["id"], "seed": seed, **({"schedule": doc["schedule"]} if "schedule" in doc else {})}
    with open(CORPUS, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry, sort_keys=True) + "\n")
    console.print(f"appended to {CORPUS}")


def _shrink(doc: dict[str, Any], summary: dict[str, Any], report_dir: Path, runs: int, stack_kind: str) -> int:
    from qualify.schedule import Schedule
    from qualify.shrink import shrink as do_shrink
    from qualify.stack import make_stack

    if "schedule" not in doc:
        console.print("[yellow]--shrink works on random scenarios (a schedule); this one is fixed[/]")
        return 1
    start = Schedule.from_json(json.dumps(doc["schedule"]))
    stack = make_stack(stack_kind)
    try:
        stack.start()
        minimal, tried = do_shrink(stack, start, seed=summary["seed"], out_dir=report_dir / "shrink",
                                   runs=runs, on_event=progress)
    finally:
        stack.stop()
    path = report_dir / "repro.json"
    path.write_text(json.dumps({"scenario": doc["id"], "seed": summary["seed"],
                                "schedule": json.loads(minimal.to_json())}, indent=2))
    console.print(f"{esc(shrunk_line(minimal, start, tried))}: {path}")
    console.print(f"  repro: qualify repro --schedule {path}")
    return 1


@app.command()
def selftest(
    mutant: Annotated[list[str] | None, typer.Option("--mutant", "-m", help="mutant name (repeatable); default the whole catalog")] = None,
    ci: Annotated[bool, typer.Option("--ci", help="only the catalog's CI subset")] = False,
    seed: Annotated[int, typer.Option(min=0, help="seed of every mutant's scenario")] = 3,
    seeds: Annotated[int, typer.Option(min=1, max=10, help="run each mutant (and the baseline) with this many seeds from --seed on; caught only if caught on each")] = 1,
    reports_dir: ReportsOpt = Path("reports"),
) -> None:
    """Break each mechanism of qimpl in a temporary copy and check that qualification fails
    with the expected check (R-Q-9); writes selftest.json and selftest.md with the kill rate."""
    from qualify.mutants import CI_SUBSET
    from qualify.selftest import run_selftest

    interrupt.install()

    def shown(r: dict[str, Any]) -> None:
        mark = "[green]caught[/]" if r["caught"] else ("[red]MISSED[/]" if r["proven"] else "[yellow]UNPROVEN[/]")
        console.print(f"  {esc(r['name'])} … {mark} ({r['duration_s']} s): {esc(r['expected_check'] if r['caught'] else ', '.join(r['failed_checks']) or r['verdict'])}")

    def body() -> int:
        names = list(mutant or []) or (list(CI_SUBSET) if ci else [])
        summary, out, code = run_selftest(names, reports_root=reports_dir, seed=seed, seeds=seeds, progress=shown)
        if summary["unproven_scenarios"]:
            console.print(f"[yellow]baseline[/]: {len(summary['unproven_scenarios'])} scenario(s) fail unmutated: "
                          + esc(", ".join(summary["unproven_scenarios"])))
        console.print(f"kill rate {summary['caught']}/{summary['total']} (baseline: "
                      f"{len(summary['baseline']) - len(summary['unproven_scenarios'])}/{len(summary['baseline'])} "
                      f"scenarios pass unmutated); report: {out}")
        return code

    raise typer.Exit(_guarded(body))


@app.command()
def up(
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="keep the database, Temporal's file, the key and the logs here between runs (default: a temporary directory removed at exit)")] = None,
    provider: Annotated[str, typer.Option("--provider", help="synthetic | echo | a plugin module:factory (set on both the API and the worker)")] = "synthetic",
    provider_config: Annotated[str, typer.Option("--provider-config", help="JSON object for the provider factory")] = "{}",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="the API's port (0: a free one)")] = 0,
    tenant: Annotated[str, typer.Option(help="the tenant of the printed key (and the worker's reconciler assignment)")] = "acme",
    principal: Annotated[str, typer.Option(help="the principal of the printed key")] = "alice",
    workspace: Annotated[str, typer.Option(help="the workspace the principal is granted")] = "default",
    tools: Annotated[bool, typer.Option("--tools", help=f"start the side-effect sink and give the API and the worker its tools ({TOOLS_SAID}), to try the tool journal by hand")] = False,
    settings: Annotated[list[str] | None, typer.Option("--set", metavar="QIMPL_NAME=VALUE", help="a setting of docs/operations.md for both the API and the worker (repeatable), e.g. --set QIMPL_CORS_ORIGINS='[\"http://localhost:8000\"]'; the environment's QIMPL_* are not passed on")] = None,
) -> None:
    """Start PostgreSQL, Temporal, the API and a worker, and print how to call them; Ctrl-C stops everything."""
    interrupt.install()
    try:
        config = json.loads(provider_config)
    except ValueError:
        raise typer.BadParameter("--provider-config must be a JSON object") from None
    if not isinstance(config, dict):
        raise typer.BadParameter("--provider-config must be a JSON object")
    from qimpl.scripts import not_utf8
    from qimpl.settings import tenant_problem
    from qualify.up import parse_settings

    if problem := tenant_problem(tenant):  # as api_keys: a stream token must carry it
        raise typer.BadParameter(f"--tenant {problem}")
    for option, value in (("--principal", principal), ("--workspace", workspace)):
        if not_utf8(value):  # bytes that were not UTF-8: nothing could store them
            raise typer.BadParameter(f"{option} is not valid UTF-8")
    try:
        given = parse_settings(settings or [])
    except UsageError as exc:
        raise typer.BadParameter(str(exc)) from None
    opts = UpOptions(data_dir=data_dir, provider=provider, provider_config=config, port=port,
                     tenant=tenant, principal=principal, workspace=workspace, tools=tools,
                     settings=given)
    raise typer.Exit(_guarded(lambda: _up(opts)))


def _up(opts: UpOptions) -> int:
    from qualify.stack.temporal import temporal_binary
    from qualify.up import UpEnvironment, curl_command

    env = UpEnvironment(opts)
    try:
        ready = env.start()
        # The machine-readable line first (tests and scripts wait for it), then the human one.
        print(f"ready {ready.as_json()}", flush=True)
        console.print(f"[green]qimpl is up[/] in {ready.boot_s:.1f} s "
                      f"({'kept in' if ready.persistent else 'temporary,'} {esc(ready.data_dir)})")
        console.print(f"  API        {ready.base_url}   (OpenAPI: {ready.base_url}/docs)")
        if ready.replaced_key:
            console.print(f"  [yellow]the kept key {ready.replaced_key} was disabled or has expired (it answers 401): "
                          "a new key was created in its place[/]")
        console.print(f"  API key    {ready.api_key}   (tenant {esc(ready.tenant)}, principal "
                      f"{esc(ready.principal)}, workspace {esc(ready.workspace)})")
        console.print(f"  provider   {esc(ready.provider)}   (API and worker)")
        console.print(f"  database   psql {ready.owner_dsn}   (the schema owner, a superuser: development only)")
        console.print(f"  temporal   {ready.temporal_address}   (task queue {ready.task_queue})")
        console.print(f"  logs       {esc(ready.logs_dir)}   (the API's has one access line per request)")
        if ready.sink_url:
            console.print(f"  tools      {TOOLS_SAID} -> "
                          f"the side-effect sink at {ready.sink_url} (its record: {esc(ready.data_dir)}/control/sink)")
        console.print("create a run:")
        print(f"  {curl_command(ready)}", flush=True)
        print(f"then read it: curl -sS -H 'Authorization: Bearer {ready.api_key}' "
              f"{ready.base_url}/v1/agents/{ready.agent}/runs/<run_id>", flush=True)
        print("an operator key (GET /v1/operator/runs to find stuck runs, the tool journal's "
              "reconciliation routes, /metrics):\n"
              f"  QIMPL_ADMIN_DATABASE_URL={ready.owner_dsn} {sys.executable} -m qimpl.scripts.api_keys create"
              f" --tenant {ready.tenant} --principal ops --role operator", flush=True)
        temporal = shlex.quote(str(temporal_binary()))
        print("its workflows in Temporal, by tenant and outcome (search attributes, docs/operations.md):\n"
              f"  {temporal} workflow list --address {ready.temporal_address} --query "
              f"\"QimplTenant = '{ready.tenant}' AND QimplRunState = 'failed'\"", flush=True)
        if ready.persistent:
            console.print("[yellow]development only:[/] this PostgreSQL runs with fsync off")
        console.print("[yellow]Ctrl-C stops everything[/]; an API or worker that exits is started again")
        restarted: dict[str, float] = {}
        while True:
            dead = env.dead()
            if dead is not None:
                code = dead.proc.poll() if dead.proc else "?"
                if time.monotonic() - restarted.get(dead.name, -RESTART_AFTER_S) < RESTART_AFTER_S:
                    console.print(f"[magenta]{dead.name} exited with {code} again within {RESTART_AFTER_S:g} s"
                                  f" of its restart; stopping (see {esc(str(dead.log_path))})[/]")
                    return 2
                console.print(f"[magenta]{dead.name} exited with {code}; starting it again[/]"
                              f" (its log: {esc(str(dead.log_path))})")
                try:  # the same command, settings and port, as a supervisor would
                    dead.start()
                except HarnessError as exc:
                    console.print(f"[magenta]{dead.name} did not start again: {esc(str(exc))}; stopping[/]")
                    return 2
                restarted[dead.name] = time.monotonic()
                console.print(f"{dead.name} ready again (pid {dead.pid})")
                continue
            server = env.servers_dead()
            if server is not None:
                console.print(f"[magenta]{server} exited; see {esc(str(env.logs_dir))}[/]")
                return 2
            interrupt.check()
            _PAUSE.wait(0.25)
    except KeyboardInterrupt:
        console.print("stopping …")
        env.stop()
        console.print("stopped: every process is gone")
        return 0
    finally:
        env.stop()


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
    console.print("random-<i>\tgenerated from the seed with --random N: runs + faults at barriers")


def _unwrap_help() -> None:
    """Each command's help from its docstring with the source's line breaks taken out (a
    paragraph stays a paragraph): the help boxes wrap it to the terminal themselves, and a
    break kept from the source showed as a short line in the middle of a sentence."""
    for info in app.registered_commands:
        doc = inspect.getdoc(info.callback) if info.callback is not None else None
        if info.help is None and doc:
            info.help = "\n\n".join(" ".join(p.split()) for p in doc.split("\n\n"))


_unwrap_help()


def main() -> None:
    """Console entry point: usage errors exit 64 (the CLI library's default 2 is "crashed"
    here). Typer vendors its own click, so its exception classes are taken from typer."""
    usage_error: type[Exception] = typer.BadParameter.__mro__[1]  # typer's UsageError
    try:
        # Without standalone mode a typer.Exit's code is *returned*, not raised.
        code = app(standalone_mode=False)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except usage_error as exc:
        exc.show()  # type: ignore[attr-defined]
        sys.exit(EXIT_USAGE)
    except (KeyboardInterrupt, typer.Abort):
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)

if __name__ == "__main__":
    main()
