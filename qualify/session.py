"""One qualification session: boot a stack, run the selected scenarios, write the report."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from qualify.errors import HarnessError
from qualify.provenance import provenance, utc_stamp
from qualify.report import build_summary, write_report
from qualify.runner import ScenarioResult, run_scenario
from qualify.scenarios import REGISTRY, Scenario
from qualify.stack import EmbeddedStack
from qualify.verdict import EXIT_CODES, Verdict

__all__ = ["crash_point_catalog", "new_report_dir", "run_session", "select"]


def crash_point_catalog() -> dict[str, str]:
    """Every crash point declared in ``qimpl`` (importing the modules declares them)."""
    import qimpl.api.app
    import qimpl.workflows.activities  # noqa: F401
    from qimpl.crashpoints import CATALOG

    return {name: p.doc for name, p in sorted(CATALOG.items())}


def select(ids: Sequence[str]) -> list[Scenario]:
    """The scenarios named by ``ids`` (all, in registration order, when empty)."""
    unknown = [i for i in ids if i not in REGISTRY]
    if unknown:
        raise HarnessError(f"unknown scenario(s): {', '.join(unknown)}; see `qualify list`")
    return [REGISTRY[i] for i in ids] if ids else list(REGISTRY.values())


def new_report_dir(root: Path, sha: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    base = f"{utc_stamp()}-{sha}"
    for n in range(1000):
        path = root / (base if n == 0 else f"{base}.{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise HarnessError("could not create a report directory")


def run_session(
    *,
    scenario_ids: Sequence[str] = (),
    seed: int | None = None,
    stack_kind: str = "embedded",
    reports_root: Path = Path("reports"),
    on_event: Callable[[str, Any], None] = lambda kind, data: None,
) -> tuple[dict[str, Any], Path, int]:
    """Run a session; returns (summary, report directory, exit code). Always tears down.

    With no ``scenario_ids`` (a full run) every declared crash point must be struck by
    some scenario, or the verdict is ``fail`` with "uncovered crash point"."""
    seed = seed if seed is not None else secrets.randbits(32)
    on_event("seed", seed)
    scenarios = select(scenario_ids)
    prov = provenance()
    report_dir = new_report_dir(reports_root, prov["git_sha"])
    on_event("report_dir", report_dir)
    t0 = time.monotonic()
    results: list[ScenarioResult] = []
    stack_doc: dict[str, Any] = {"kind": stack_kind}
    crashed = ""
    stack = EmbeddedStack(kind=stack_kind)
    try:
        info = stack.start()
        stack_doc = {k: v for k, v in asdict(info).items() if k not in ("pg_dsn",)}
        on_event("stack", info)
        for sc in scenarios:
            on_event("scenario_start", sc)
            result = run_scenario(stack, sc, seed=seed, out_dir=report_dir / "scenarios" / sc.id)
            results.append(result)
            on_event("scenario_end", result)
    except HarnessError as exc:
        crashed = str(exc)
    finally:
        stack.stop()
    summary = build_summary(results=results, seed=seed, duration_s=time.monotonic() - t0,
                            stack=stack_doc, provenance=prov, report_dir=report_dir,
                            crash_catalog=list(crash_point_catalog()))
    if crashed:
        summary["verdict"] = str(Verdict.CRASHED)
        summary["error"] = crashed
    elif not scenario_ids:
        # A full run must strike every crash point declared in qimpl (R-Q-4).
        uncovered = [p for p, by in summary["crash_points"].items() if not by]
        summary["uncovered_crash_points"] = uncovered
        if uncovered:
            summary["verdict"] = str(Verdict.FAIL)
            summary["error"] = "uncovered crash point: " + ", ".join(uncovered)
    write_report(report_dir, summary)
    return summary, report_dir, EXIT_CODES[Verdict(summary["verdict"])]
