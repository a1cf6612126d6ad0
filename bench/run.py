"""One benchmark run: boot the stack once, measure the chosen sections on it, and write
the results (JSON, chart, and with ``publish`` the curated ``bench/RESULTS.md`` and
``bench/latest.png``). Every process is reaped and the stack torn down, also on failure."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import report
from bench.env import ROOT, BenchEnv, ModelBoundPlan, Plan, SectionFailed
from bench.stats import TARGETS, evaluate, rows
from qualify.provenance import provenance, utc_stamp

__all__ = ["SECTIONS", "run_bench"]

#: Everything in ``bench/RESULTS.md`` from this line on is written by hand (why a target
#: is missed, what it would take) and kept by ``--publish``.
NOTES_MARKER = "<!-- notes below are kept by `python -m bench --publish` -->"

Section = Callable[[BenchEnv], dict[str, Any]]


def _floor(env: BenchEnv) -> dict[str, Any]:
    from bench.floor import measure_floor

    return measure_floor(env)


def _qimpl(env: BenchEnv) -> dict[str, Any]:
    from bench.qimpl_runs import measure_qimpl

    return measure_qimpl(env)


def _peer(env: BenchEnv) -> dict[str, Any]:
    from bench.peer_dbos import measure_dbos

    return measure_dbos(env)


def _sharded(env: BenchEnv) -> dict[str, Any]:
    from bench.sharded import measure_sharded

    return measure_sharded(env)


def _recovery(env: BenchEnv) -> dict[str, Any]:
    from bench.recovery import measure_recovery

    return measure_recovery(env)


def _model_bound(env: BenchEnv) -> dict[str, Any]:
    from bench.model_bound import measure_model_bound

    return measure_model_bound(env)


def _qualification(env: BenchEnv) -> dict[str, Any]:
    from bench.qualification import measure_qualification

    return measure_qualification(env)


#: Sections in the order they run (resources are measured inside ``qimpl``).
SECTIONS: dict[str, Section] = {"floor": _floor, "qimpl": _qimpl, "peer": _peer,
                                "sharded": _sharded, "recovery": _recovery, "model_bound": _model_bound,
                                "qualification": _qualification}

_EXTRA = ("dbos", "matplotlib", "rich", "typer", "httpx")


def run_bench(*, sections: Sequence[str] = tuple(SECTIONS), quick: bool = False,
              full_qualify: bool = False, out: Path = ROOT / "bench" / "results",
              publish: bool = False, note: str = "", model_bound: ModelBoundPlan | None = None,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run ``sections`` on one embedded stack; returns the results document (also written
    to ``out/<UTC stamp>.json``, with the chart beside it as ``.png``). A section that
    raises is recorded under ``errors`` and its figures stay unmeasured; the others run.
    ``full_qualify`` adds the full ``qualify run`` timings (slow); ``note`` (how the
    machine was shared, say) goes into the results and ``RESULTS.md``, with the 1-minute
    load average at the start and the end. ``model_bound``: what that section measures
    (default ``ModelBoundPlan.of(quick)``). ValueError for an unknown section."""
    from qualify.stack import EmbeddedStack

    unknown = set(sections) - set(SECTIONS)
    if unknown:
        raise ValueError(f"unknown sections {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    t0 = time.monotonic()
    load_start = os.getloadavg()[0]
    stamp = utc_stamp()
    prov = provenance()
    for name in _EXTRA:
        try:
            prov["packages"][name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            prov["packages"][name] = None
    figures: dict[str, Any] = {}
    errors: dict[str, str] = {}
    timings: dict[str, float] = {}
    workdir = Path(tempfile.mkdtemp(prefix="bench-"))
    stack = EmbeddedStack()
    try:
        info = stack.start()
        log(f"stack: PostgreSQL {info.postgres_version}, Temporal {info.temporal_version}, "
            f"booted in {info.boot_s:.2f} s")
        env = BenchEnv(stack=stack, plan=Plan.of(quick), workdir=workdir, log=log,
                       full_qualify=full_qualify, keep_dir=out / f"{stamp}-kept",
                       model_bound=model_bound or ModelBoundPlan.of(quick))
        for name in SECTIONS:
            if name not in sections:
                continue
            log(f"section {name} …")
            s0 = time.monotonic()
            try:
                figures.update(SECTIONS[name](env))
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # noqa: BLE001 - one broken section must not hide the rest
                if isinstance(exc, SectionFailed):
                    figures.update(exc.figures)
                errors[name] = "".join(traceback.format_exception(exc))[-3000:]
                log(f"section {name} failed: {type(exc).__name__}: {exc}")
            timings[name] = round(time.monotonic() - s0, 1)
            log(f"section {name}: {timings[name]:.0f} s")
    finally:
        stack.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    json_path = out / f"{stamp}.json"
    previous, previous_name = report.latest_previous(out, exclude=json_path)
    table = rows(figures, previous=previous, previous_label=previous_name)
    targets = evaluate(figures)
    wall = round(time.monotonic() - t0, 1)
    meta = {"finished_at": datetime.now(UTC).isoformat(timespec="seconds"), "mode": "quick" if quick else "full",
            "git_sha": prov["git_sha"], "git_dirty": prov["git_dirty"], "wall_s": wall,
            "cpus": prov["machine"]["cpus"], "note": note,
            "loadavg_1min": [round(load_start, 2), round(os.getloadavg()[0], 2)]}
    doc = {"meta": meta, "provenance": prov, "sections": list(sections), "section_s": timings,
           "figures": figures, "errors": errors,
           "targets": [t.__dict__ for t in targets],
           "table": [{"key": r.spec.key, "value": r.value, "ratio": r.ratio, "ref": r.spec.ref,
                      "status": r.status} for r in table]}
    report.write_json(json_path, doc)
    report.print_table(table, targets)
    if mb := report.model_bound_markdown(figures):
        log(mb)
    png = json_path.with_suffix(".png")
    title = f"git {prov['git_sha']} {meta['mode']} {meta['finished_at']}"
    try:
        report.draw_chart(png, figures, title=title)
    except ImportError:
        log("matplotlib is not installed (pip install -e '.[bench]'): no chart")
    except ValueError as exc:  # nothing plottable: the table and the JSON still stand
        log(f"no chart: {exc}")
    if publish:
        text = {t.id: t.text for t in TARGETS}
        results_md = ROOT / "bench" / "RESULTS.md"
        notes = results_md.read_text() if results_md.exists() else ""
        notes = notes[notes.index(NOTES_MARKER):] if NOTES_MARKER in notes else NOTES_MARKER + "\n"
        results_md.write_text("# Benchmark results (latest curated run)\n\n"
                              + report.markdown(table, targets, meta=meta, target_text=text)
                              + "\n" + notes)
        if png.exists():
            shutil.copyfile(png, ROOT / "bench" / "latest.png")
    log(f"results: {json_path} ({wall:.0f} s)")
    return doc
