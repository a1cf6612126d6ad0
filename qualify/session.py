"""One qualification session: boot a stack, run scenarios (in parallel slices if asked),
re-run failures to measure how often they reproduce, write the report."""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from qualify import interrupt
from qualify.coverage import gate, unreachable_waivers
from qualify.errors import HarnessError, UsageError
from qualify.forkserver import ENTRY_POINTS, SPAWN_MODES, SpawnPolicy
from qualify.procs import kill_tree, spawn
from qualify.provenance import provenance, utc_stamp
from qualify.report import build_summary, scenario_doc, write_report
from qualify.runner import run_scenario
from qualify.scenarios import REGISTRY, Scenario
from qualify.spec_ids import REQUIREMENTS
from qualify.stack import TIMER_MODES, make_stack
from qualify.timing import cpu_seconds, expected_wall_s, longest_first, slice_load, slices_for
from qualify.verdict import EXIT_CODES, Verdict, merge

__all__ = ["SessionOptions", "crash_point_catalog", "new_report_dir", "resolve", "run_session", "saved_seed",
           "session_seed"]

Events = Callable[[str, Any], None]


def crash_point_catalog() -> dict[str, str]:
    """Every crash point declared in ``qimpl`` (importing the modules declares them)."""
    import qimpl.api.app
    import qimpl.reconciler
    import qimpl.workflows.activities  # noqa: F401
    from qimpl.crashpoints import CATALOG

    return {name: p.doc for name, p in sorted(CATALOG.items())}


def resolve(ids: Sequence[str], *, seed: int, random_n: int = 0, schedule_path: Path | None = None) -> list[Scenario]:
    """Scenarios by id (registered ones, ``random-<i>`` of this seed), ``random_n`` random
    ones, or one saved schedule; all registered scenarios when nothing is named."""
    from qualify.scenarios.random_mix import random_scenario, schedule_scenario
    from qualify.schedule import Schedule

    out: list[Scenario] = []
    ids = list(dict.fromkeys(ids))  # a scenario named twice runs once: one report folder each
    if schedule_path is not None:
        try:
            doc = json.loads(schedule_path.read_text())
            saved = Schedule.from_json(json.dumps(doc.get("schedule", doc)))
            name = str(doc.get("scenario", "schedule"))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            # A report's summary.json given for its repro.json, a file cut short, ...
            raise UsageError(f"{schedule_path}: not a saved schedule (qualify repro --shrink's repro.json): "
                             f"{type(exc).__name__}") from None
        out.append(schedule_scenario(saved, name, schedule_file=str(schedule_path.absolute())))
    for i in ids:
        if i in REGISTRY:
            out.append(REGISTRY[i])
        elif i.startswith("random-") and i.removeprefix("random-").isdigit():
            out.append(random_scenario(int(i.removeprefix("random-")), seed))
        else:
            raise UsageError(f"unknown scenario {i!r}; see `qualify list`")
    out += [random_scenario(i, seed) for i in range(random_n)]
    return out if (out or schedule_path) else list(REGISTRY.values())


def saved_seed(schedule_path: Path | None) -> int | None:
    """The session seed a saved schedule was found with (``repro.json``'s ``seed``), which
    a replay without ``--seed`` runs it under; None without one (or a file ``resolve``
    refuses)."""
    if schedule_path is None:
        return None
    try:
        seed = json.loads(schedule_path.read_text()).get("seed")
    except (OSError, ValueError, AttributeError):
        return None
    return seed if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0 else None


def session_seed(opts: SessionOptions) -> int:
    """The session's root seed: ``--seed``, else the one a saved schedule was found with,
    else a fresh one (printed first, and in every repro line)."""
    if opts.seed is not None:
        return opts.seed
    saved = saved_seed(opts.schedule_path)
    return saved if saved is not None else secrets.randbits(32)


STACK_KINDS = ("embedded", "system", "existing", "testcontainers")


def new_report_dir(root: Path, sha: str) -> Path:
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the reports directory {root}: {exc.strerror}") from exc
    base = f"{utc_stamp()}-{sha}"
    for n in range(1000):
        path = root / (base if n == 0 else f"{base}.{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
        except OSError as exc:
            raise UsageError(f"cannot write reports under {root}: {exc.strerror}") from exc
    raise HarnessError("could not create a report directory")


@dataclass(kw_only=True)
class SessionOptions:
    scenario_ids: list[str] = field(default_factory=list)
    random_n: int = 0
    schedule_path: Path | None = None
    seed: int | None = None
    stack_kind: str = "embedded"
    pg_dsn: str = ""
    temporal_address: str = ""
    reports_root: Path = Path("reports")
    #: Re-run a failing scenario this many times to measure its reproduction rate.
    reruns: int = 1
    #: Leave the stack up after a failure until Ctrl-C, and say how to connect.
    keep: bool = False
    #: Parallel slices, each with its own stack (1 = in this process).
    parallel: int = 1
    #: ``(k, n)``: run only the k-th of n shards (1-based) of the selection (R-Q-10); the
    #: shards' reports are merged by ``qualify merge`` into one report and one verdict.
    shard: tuple[int, int] | None = None
    #: How API and worker processes start (``qualify.forkserver.SPAWN_MODES``): ``auto``
    #: execs those of the named exec set (``Scenario.exec_because``) and forks the rest
    #: from a preloaded server.
    spawn: str = "auto"
    #: The Temporal dev server's timers (``qualify.stack.TIMER_MODES``): ``tuned`` shortens
    #: them (``TUNED_DYNAMIC_CONFIG``) except for the ``default_timers`` scenarios.
    temporal_timers: str = "tuned"

    @property
    def whole_selection(self) -> bool:
        """Nothing selected: the selection is every registered scenario."""
        return not self.scenario_ids and not self.random_n and self.schedule_path is None

    @property
    def full(self) -> bool:
        """A full run (nothing selected, not a shard): every crash point must be struck."""
        return self.whole_selection and self.shard is None


def auto_slices(cpus: int) -> int:
    """``-n auto``: the number of slices whose measured CPU demand fills ``cpus``
    (``qualify.timing.slices_for`` over ``qualify/data/slice_load.json``, the load of a
    full run). Measured on 2 cores (issue 24, tuned timers, forked processes but the exec
    set; 2026-12-05): a slice of the 95-scenario catalog kept 0.39 of a core busy at four
    slices, so auto is 5 (at most 2.5 per CPU); the catalog took 125 s at four slices and
    113-116 s at five. Since the slices load no other pytest plugin, a slice of the
    96-scenario catalog keeps 0.34 busy at five (102-105 s; 111 s at six), and the cap
    keeps auto at 5."""
    return slices_for(cpus)


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` as ``(k, n)`` with ``1 <= k <= n``; UsageError otherwise."""
    k, sep, n = text.partition("/")
    if not (sep and k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise UsageError(f"--shard takes K/N with 1 <= K <= N, got {text!r}")
    return int(k), int(n)


def shard_of(scenarios: Sequence[Scenario], shard: tuple[int, int] | None) -> list[Scenario]:
    """The scenarios of shard ``(k, n)``: every n-th one from position k - 1 (pure; the
    same selection and seed give every machine the same partition)."""
    if shard is None:
        return list(scenarios)
    k, n = shard
    return [sc for i, sc in enumerate(scenarios) if i % n == k - 1]


#: Why a scenario was refused: the one reason ``run_session`` refuses (``needs_platform``).
REFUSED_BECAUSE = ("refused on a stack the harness did not boot (it restarts or stops PostgreSQL "
                   "or Temporal)")


#: The process kinds whose real entry points (``python -m qimpl.api``-style, a fresh
#: interpreter) a full run must exec at least once, in a passing scenario.
ENTRY_POINT_KINDS = ENTRY_POINTS


def entry_points_execd(docs: Sequence[dict[str, Any]]) -> dict[str, list[str]]:
    """``{kind: [passing scenarios that exec'd it]}`` for each of ``ENTRY_POINT_KINDS``
    (pure; ``docs``: the summary's scenario documents)."""
    return {kind: [d["id"] for d in docs if d.get("status") == "pass" and kind in d.get("execd", [])]
            for kind in ENTRY_POINT_KINDS}


def mark_selection(summary: dict[str, Any], docs: Sequence[dict[str, Any]]) -> None:
    """What every summary starts as, in place: a selection of the catalog (``full_run``
    False, ``catalog_size``) whose requirement gate is judged but not applied
    (``requirement_gate["applied"]`` False), so that the page and the JSON agree on what
    a selection covers. ``full_run_gates`` replaces them for a full run."""
    summary["full_run"] = False
    summary["catalog_size"] = len(REGISTRY)
    summary["requirement_gate"] = {**gate(docs, REQUIREMENTS), "applied": False}


def full_run_gates(summary: dict[str, Any], docs: Sequence[dict[str, Any]],
                   refused: Sequence[Scenario] = ()) -> None:
    """Apply a full run's gates to ``summary`` in place: every declared crash point struck
    (R-Q-4), every requirement with a passing check that covers it (R-Q-8, R-Q-12) and,
    unless the run forked everything (``summary["spawn"] == "fork"``), each entry point
    of ``ENTRY_POINT_KINDS`` exec'd by a passing scenario; a miss makes the verdict
    ``fail`` and is named in ``error``.

    A run that refused scenarios (a staging run on ``--stack existing``) is gated too
    (R-Q-12): a crash point or requirement that only the refused scenarios would have
    struck or covered is ``waived`` with the reason and their ids
    (``waived_crash_points``, ``requirement_gate["waived"]``), never silently skipped;
    anything else uncovered fails the run as in any full run."""
    reason = REFUSED_BECAUSE
    summary["full_run"] = True
    uncovered = [p for p, by in summary["crash_points"].items() if not by]
    waived_points = {p: f"{reason}: {', '.join(sc.id for sc in refused if p in sc.crash_points)}"
                     for p in uncovered if any(p in sc.crash_points for sc in refused)}
    uncovered = [p for p in uncovered if p not in waived_points]
    summary["uncovered_crash_points"] = uncovered
    summary["waived_crash_points"] = waived_points
    problems = ["uncovered crash point: " + ", ".join(uncovered)] if uncovered else []
    summary["requirement_gate"] = {**gate(
        docs, REQUIREMENTS, unreachable=unreachable_waivers(((sc.id, sc.requirements) for sc in refused), reason)),
        "applied": True}
    missing = summary["requirement_gate"]["uncovered"]
    if missing:
        problems.append("requirement without a passing check: " + ", ".join(missing))
    summary["entry_points_execd"] = execd = entry_points_execd(docs)
    if summary.get("spawn", "auto") != "fork":
        never = [kind for kind, by in execd.items() if not by]
        if never:
            problems.append("entry point never exec'd by a passing scenario: " + ", ".join(never))
    if problems:
        summary["verdict"] = str(merge([Verdict(summary["verdict"]), Verdict.FAIL]))
        summary["error"] = "; ".join(problems)


def _run_one(stack: Any, sc: Scenario, *, seed: int, report_dir: Path, reruns: int,
             stack_kind: str, spawn_policy: SpawnPolicy | None = None) -> dict[str, Any]:
    policy = spawn_policy or SpawnPolicy("exec")
    launcher, exec_kinds = policy.spawn_for(sc.exec_only)
    result = run_scenario(stack, sc, seed=seed, out_dir=report_dir / "scenarios" / sc.id,
                          launcher=launcher, exec_kinds=exec_kinds)
    if result.verdict is Verdict.FAIL and reruns > 0:
        failed = 1
        for i in range(reruns):
            launcher, exec_kinds = policy.spawn_for(sc.exec_only)  # a fork server that died is restarted
            again = run_scenario(stack, sc, seed=seed, out_dir=report_dir / "scenarios" / sc.id / f"rerun-{i + 1}",
                                 launcher=launcher, exec_kinds=exec_kinds)
            failed += again.verdict is Verdict.FAIL
        result.reproduction = f"{failed}/{reruns + 1}"
        if failed < reruns + 1:
            result.verdict = Verdict.FLAKY
    return scenario_doc(result, report_dir=report_dir, stack_kind=stack_kind)


def _run_parallel(opts: SessionOptions, seed: int, scenarios: list[Scenario], report_dir: Path,
                  on_event: Events) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Spread the scenarios over ``opts.parallel`` pytest-xdist workers, each booting its
    own stack (``qualify/xdist_run.py``), and merge the documents they write."""
    # Found by name, not imported: qualify.xdist_run imports this module.
    xdist_module = importlib.util.find_spec("qualify.xdist_run")
    assert xdist_module is not None and xdist_module.origin is not None

    schedule_ids = [sc.id for sc in scenarios if sc.schedule is not None and not sc.id.startswith("random-")]
    spec = {"ids": longest_first([sc.id for sc in scenarios]), "seed": seed, "stack_kind": opts.stack_kind,
            "pg_dsn": opts.pg_dsn, "temporal_address": opts.temporal_address, "reruns": opts.reruns,
            "report_dir": str(report_dir),
            "schedule": str(opts.schedule_path) if opts.schedule_path else None,
            "schedule_id": schedule_ids[0] if schedule_ids else None, "spawn": opts.spawn,
            "timers": opts.temporal_timers}
    ini = report_dir / ".pytest.ini"
    ini.write_text("[pytest]\n")  # none of the project's options: this is not its test suite
    on_event("slice", {"index": f"xdist x{opts.parallel}", "scenarios": spec["ids"]})
    log = report_dir / "xdist.log"
    # Only the plugin the slices need: the environment's other pytest plugins (schemathesis
    # pulls in hypothesis) cost each slice about 3 s of CPU to import, and the slices'
    # file has no asserts to rewrite (a scenario judges with ``ScenarioContext.expect``).
    proc = spawn([sys.executable, "-m", "pytest", "-q", "-c", str(ini), "--rootdir", str(report_dir),
                  "-p", "xdist.plugin", "-p", "no:cacheprovider", "--assert=plain",
                  "-n", str(opts.parallel), "--dist", "load", xdist_module.origin],
                 log_path=log, env={**os.environ, "QUALIFY_XDIST_SPEC": json.dumps(spec),
                                    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
                 death_signal=signal.SIGTERM)
    shown: set[str] = set()
    try:
        # Each scenario's result is reported as its slice writes it: a soak of an hour
        # shows its progress, not one burst at the end.
        while proc.poll() is None:
            _report_new_docs(report_dir, shown, on_event)
            time.sleep(0.5)
        _report_new_docs(report_dir, shown, on_event)
    finally:
        kill_tree(proc, first=signal.SIGTERM, grace_s=30)
        # A slice stopped before its stack did (a Ctrl-C reaches the slices too, and they
        # are killed) leaves the stack's directory on the tmpfs: its owner is gone now.
        from qualify.stack._embedded import sweep_stale_stacks

        sweep_stale_stacks()
    docs = []
    for sc in scenarios:
        path = report_dir / ".docs" / f"{sc.id}.json"
        if not path.exists():
            raise HarnessError(f"parallel run produced no result for {sc.id}; see {log}")
        docs.append(json.loads(path.read_text()))
    stacks = sorted((report_dir / ".stacks").glob("*.json"))
    stack_doc = {**(json.loads(stacks[0].read_text()) if stacks else {"kind": opts.stack_kind}),
                 "parallel_stacks": len(stacks)}
    return docs, stack_doc


def _report_new_docs(report_dir: Path, shown: set[str], on_event: Events) -> None:
    """``scenario_end`` for each scenario document the slices wrote since the last call."""
    for path in sorted((report_dir / ".docs").glob("*.json")):
        if path.stem in shown:
            continue
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being written: next time
        shown.add(path.stem)
        on_event("scenario_end", {**doc, "prefix": True})


def run_session(opts: SessionOptions, on_event: Events = lambda kind, data: None
                ) -> tuple[dict[str, Any], Path, int]:
    """Run a session; returns (summary, report directory, exit code). Always tears down.

    A full run must strike every declared crash point, or the verdict is ``fail`` with
    "uncovered crash point". Scenarios that need to restart PostgreSQL or Temporal are
    refused (listed, not run) on a stack the harness did not boot."""
    if opts.stack_kind not in STACK_KINDS:
        raise UsageError(f"unknown stack {opts.stack_kind!r}: {', '.join(STACK_KINDS)}")
    if opts.schedule_path is not None and not opts.schedule_path.is_file():
        raise UsageError(f"no schedule file at {opts.schedule_path}")
    if opts.spawn not in SPAWN_MODES:
        raise UsageError(f"unknown spawn mode {opts.spawn!r}: {', '.join(SPAWN_MODES)}")
    if opts.temporal_timers not in TIMER_MODES:
        raise UsageError(f"unknown temporal timers {opts.temporal_timers!r}: {', '.join(TIMER_MODES)}")
    seed = session_seed(opts)
    # Scenario names first, then the stack (built, not started): a usage error leaves
    # nothing behind, not even an empty stack directory, and comes before any report.
    selection = resolve(opts.scenario_ids, seed=seed, random_n=opts.random_n,
                        schedule_path=opts.schedule_path)
    scenarios = shard_of(selection, opts.shard)
    # No more slices than scenarios; one slice runs in this process (and ``--keep`` needs it).
    opts = replace(opts, parallel=1 if opts.keep else max(1, min(opts.parallel, len(scenarios))))
    stack = None if opts.parallel > 1 else make_stack(
        opts.stack_kind, pg_dsn=opts.pg_dsn, temporal_address=opts.temporal_address,
        timers=opts.temporal_timers)
    on_event("seed", seed)
    on_event("plan", {"total": len(scenarios),
                      "expected_s": expected_wall_s([sc.id for sc in scenarios], opts.parallel)})
    prov = provenance()
    report_dir = new_report_dir(opts.reports_root, prov["git_sha"])
    on_event("report_dir", report_dir)
    t0, cpu0 = time.monotonic(), cpu_seconds()
    docs: list[dict[str, Any]] = []
    stack_doc: dict[str, Any] = {"kind": opts.stack_kind}
    crashed = ""
    refused: list[str] = []
    if stack is None:
        try:
            docs, stack_doc = _run_parallel(opts, seed, scenarios, report_dir, on_event)
        except HarnessError as exc:
            crashed = str(exc)
    else:
        policy = SpawnPolicy(opts.spawn)
        try:
            info = stack.start()
            stack_doc = {k: v for k, v in asdict(info).items() if k not in ("pg_dsn",)}
            on_event("stack", info)
            for sc in scenarios:
                interrupt.check()
                if sc.needs_platform and not stack.controls_platform:
                    refused.append(sc.id)
                    on_event("refused", sc)
                    continue
                on_event("scenario_start", sc)
                docs.append(_run_one(stack, sc, seed=seed, report_dir=report_dir, reruns=opts.reruns,
                                     stack_kind=opts.stack_kind, spawn_policy=policy))
                on_event("scenario_end", docs[-1])
            if opts.keep and any(d["status"] != "pass" for d in docs):
                on_event("keep", {"pg_dsn": info.pg_dsn, "temporal_address": info.temporal_address,
                                  "databases": "one per scenario, named s_<hash>"})
                _wait_for_interrupt()
        except HarnessError as exc:
            crashed = str(exc)
        finally:
            with interrupt.deferred():
                try:
                    policy.stop()
                    stack.stop()
                except HarnessError as exc:
                    crashed = crashed or str(exc)
    interrupt.check()
    summary = build_summary(scenarios=docs, seed=seed, duration_s=time.monotonic() - t0,
                            stack=stack_doc, provenance=prov, report_dir=report_dir,
                            crash_catalog=list(crash_point_catalog()))
    summary["refused"] = refused
    mark_selection(summary, docs)  # full_run_gates says otherwise when they apply
    summary["spawn"] = opts.spawn
    summary["temporal_timers"] = opts.temporal_timers
    summary["load"] = slice_load(cpu_s=cpu_seconds() - cpu0, wall_s=max(summary["duration_s"], 1e-3),
                                 slices=opts.parallel, cpus=os.cpu_count() or 1)
    if opts.shard is not None:
        summary["shard"] = {"index": opts.shard[0], "count": opts.shard[1],
                            "whole_selection": opts.whole_selection,
                            "selection": [sc.id for sc in selection]}
    if crashed:
        summary["verdict"] = str(Verdict.CRASHED)
        summary["error"] = crashed
    elif opts.full:
        full_run_gates(summary, docs, refused=[REGISTRY[i] for i in refused])
    write_report(report_dir, summary)
    return summary, report_dir, EXIT_CODES[Verdict(summary["verdict"])]


def _wait_for_interrupt() -> None:
    """``--keep``: hold the stack up until Ctrl-C, which then means "tear down and report"."""
    try:
        while True:
            time.sleep(1)
            interrupt.check()
    except KeyboardInterrupt:
        interrupt.consume()


