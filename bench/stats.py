"""Pure arithmetic of the benchmark: percentiles, ratios, the figure table and the targets.

No I/O and no clock: every function takes measured numbers and returns numbers or rows,
so the unit tests (``tests/unit/test_bench_stats.py``) need no service.

Figures are one flat mapping ``key -> value`` (``None``: not measured in this run).
Every duration is in **seconds**, every rate in **per second** (``random_per_h``: per
hour), memory in **MiB**, bytes in **bytes**. ``FIGURES`` says, for each key, its label,
unit and the figure it is compared with (its *reference*: the floor or the peer);
``TARGETS`` are the issue's goals as pure predicates over the same mapping.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["CONCURRENCY", "FIGURES", "MODEL_BOUND_SHAPES", "MODEL_BOUND_TARGETS", "TARGETS",
           "FigureRow", "FigureSpec", "ModelBoundRatio", "Summary", "Target", "TargetResult",
           "evaluate", "format_value", "mb_prefix", "mb_prefixes", "mb_processes", "mb_qimpl_phases", "mb_ratios",
           "mb_systems", "mb_table", "percentile", "ratio", "rows", "summarize"]

#: Concurrency levels of the throughput figures (runs in flight at once).
CONCURRENCY: tuple[int, ...] = (1, 10, 100, 500)

#: The model-bound section's default shapes (runs, steps, ms each step waits on the
#: provider): the ones the figure table and the targets name (issue 55, item 1).
MODEL_BOUND_SHAPES: tuple[tuple[int, int, int], ...] = ((200, 3, 1000), (1000, 3, 1000))

#: Issue 55's model-bound targets: qimpl's runs/s at least this share of the floor's and
#: of DBOS's, and the worker's peak PostgreSQL sessions at most this many.
MODEL_BOUND_TARGETS = {"floor": 0.8, "dbos": 0.5, "worker_sessions": 30.0}

Figures = Mapping[str, float | None]


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0 <= q <= 100) by linear interpolation between closest
    ranks (numpy's default). Raises ValueError for no samples or q out of range."""
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} out of 0..100")
    xs = sorted(samples)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Summary:
    """Order statistics of samples, in the samples' unit."""

    n: int
    p50: float
    p95: float
    mean: float
    min: float
    max: float


def summarize(samples: Sequence[float]) -> Summary:
    """``Summary`` of ``samples``; ValueError when empty."""
    if not samples:
        raise ValueError("summary of no samples")
    return Summary(n=len(samples), p50=percentile(samples, 50), p95=percentile(samples, 95),
                   mean=sum(samples) / len(samples), min=min(samples), max=max(samples))


def ratio(value: float | None, reference: float | None) -> float | None:
    """``value / reference``; None when either is missing or the reference is not > 0."""
    if value is None or reference is None or reference <= 0:
        return None
    return value / reference


# -- the figure table -------------------------------------------------------------------

@dataclass(frozen=True)
class FigureSpec:
    key: str
    section: str
    label: str
    unit: str  # "s", "/s", "/h", "MiB", "B", "rows"
    #: The figure this one is compared with (floor or peer); "" for none.
    ref: str = ""


def _specs() -> tuple[FigureSpec, ...]:
    s: list[FigureSpec] = [
        FigureSpec("floor.wf_p50_s", "floor", "bare workflow + 1 no-op activity, end-to-end p50 (client: start + result poll)", "s"),
        FigureSpec("floor.wf_server_p50_s", "floor", "  the same, server clock: start event -> close event p50", "s",
                   "floor.wf_p50_s"),
        FigureSpec("floor.wf_p95_s", "floor", "bare workflow + 1 no-op activity, end-to-end p95", "s"),
        FigureSpec("floor.start_p50_s", "floor", "raw Temporal start (start_workflow) p50", "s"),
        FigureSpec("floor.commit_p50_s", "floor", "bare one-row UPDATE commit p50", "s"),
    ]
    s += [FigureSpec(f"floor.tput_c{c}", "floor", f"workflows/s, 1 worker, concurrency {c}", "/s")
          for c in CONCURRENCY]
    s += [
        FigureSpec("qimpl.accept_p50_s", "qimpl", "acceptance POST -> 202 p50", "s", "floor.accept_budget_s"),
        FigureSpec("qimpl.accept_p95_s", "qimpl", "acceptance POST -> 202 p95", "s", "floor.accept_budget_s"),
        FigureSpec("qimpl.accept_to_insert_p50_s", "qimpl", "  of which POST sent -> run committed p50", "s",
                   "qimpl.accept_p50_s"),
        FigureSpec("qimpl.accept_dispatch_p50_s", "qimpl", "  of which committed -> dispatch confirmed p50", "s",
                   "qimpl.accept_p50_s"),
        FigureSpec("qimpl.accept_after_confirm_p50_s", "qimpl", "  of which confirmed -> 202 received p50", "s",
                   "qimpl.accept_p50_s"),
        FigureSpec("qimpl.e2e_p50_s", "qimpl", "run end-to-end (accepted_at -> completed_at) p50", "s",
                   "floor.e2e_budget_s"),
        FigureSpec("qimpl.e2e_to_claim_p50_s", "qimpl", "  of which accepted -> claimed (started_at) p50", "s",
                   "qimpl.e2e_p50_s"),
        FigureSpec("qimpl.e2e_claim_to_done_p50_s", "qimpl", "  of which claimed -> completed p50", "s",
                   "qimpl.e2e_p50_s"),
        FigureSpec("qimpl.e2e_p95_s", "qimpl", "run end-to-end (accepted_at -> completed_at) p95", "s",
                   "dbos.e2e_p95_s"),
        FigureSpec("qimpl.checkpoint_p50_s", "qimpl", "one checkpoint commit (RunOwner.checkpoint) p50", "s",
                   "floor.commit_p50_s"),
    ]
    s += [FigureSpec(f"qimpl.tput_c{c}", "qimpl", f"runs/s, 1 worker, concurrency {c}", "/s",
                     f"floor.tput_c{c}") for c in CONCURRENCY]
    s += [
        FigureSpec("dbos.e2e_p50_s", "peer", "DBOS 3-step workflow end-to-end p50", "s"),
        FigureSpec("dbos.e2e_p95_s", "peer", "DBOS 3-step workflow end-to-end p95", "s"),
        FigureSpec("dbos.resume_after_kill_s", "peer", "DBOS SIGKILL -> restarted process ran the next step", "s"),
    ]
    s += [FigureSpec(f"dbos.tput_c{c}", "peer", f"DBOS workflows/s, 1 process, concurrency {c}", "/s")
          for c in CONCURRENCY]
    s += [FigureSpec("qimpl.e2e_vs_dbos_p50_s", "peer", "qimpl end-to-end p50 vs DBOS", "s", "dbos.e2e_p50_s")]
    s += [FigureSpec(f"qimpl.tput_vs_dbos_c{c}", "peer", f"qimpl runs/s at concurrency {c} vs DBOS", "/s",
                     f"dbos.tput_c{c}") for c in CONCURRENCY]
    s += _sharded_specs()
    s += _model_bound_specs()
    s += [
        FigureSpec("recovery.lease_s", "recovery", "ownership lease L (qimpl default)", "s"),
        FigureSpec("recovery.heartbeat_timeout_s", "recovery", "heartbeat timeout H (qimpl default, above L)", "s"),
        FigureSpec("recovery.sigkill_p50_s", "recovery", "worker SIGKILL -> next checkpoint by a survivor p50", "s",
                   "dbos.resume_after_kill_s"),
        FigureSpec("recovery.sigkill_p95_s", "recovery", "worker SIGKILL -> next checkpoint by a survivor p95", "s",
                   "dbos.resume_after_kill_s"),
        FigureSpec("recovery.sigkill_retry_started_p50_s", "recovery",
                   "  of which SIGKILL -> Temporal started the retried attempt, p50", "s",
                   "recovery.sigkill_p50_s"),
        FigureSpec("recovery.sigkill_lease1_p50_s", "recovery",
                   "worker SIGKILL -> next checkpoint p50, lease 1 s (not default)", "s", "recovery.sigkill_p50_s"),
        FigureSpec("recovery.sigkill_lease1_retry_started_p50_s", "recovery",
                   "  of which SIGKILL -> Temporal started the retried attempt, lease 1 s", "s",
                   "recovery.sigkill_lease1_p50_s"),
        FigureSpec("recovery.sigstop_s", "recovery", "owner SIGSTOP -> takeover (median of trials)", "s",
                   "recovery.lease_s"),
        FigureSpec("recovery.in_txn_s", "recovery", "owner paused inside its transaction -> takeover", "s",
                   "recovery.lease_s"),
        FigureSpec("recovery.cancel_s", "recovery", "cancel commit -> running step stopped", "s"),
        FigureSpec("tuned.sigkill_p50_s", "recovery",
                   "  tuned server (timer shift 20 ms; not what users run): SIGKILL -> next checkpoint p50",
                   "s", "recovery.sigkill_p50_s"),
        FigureSpec("tuned.sigkill_p95_s", "recovery", "  tuned server: SIGKILL -> next checkpoint p95", "s",
                   "recovery.sigkill_p95_s"),
        FigureSpec("tuned.sigstop_s", "recovery", "  tuned server: owner SIGSTOP -> takeover", "s",
                   "recovery.sigstop_s"),
        FigureSpec("tuned.in_txn_s", "recovery", "  tuned server: owner paused inside its transaction -> takeover",
                   "s", "recovery.in_txn_s"),
        FigureSpec("qual.boot_p50_s", "qualification", "stack boot p50", "s"),
        FigureSpec("qual.run_n1_s", "qualification", "full `qualify run -n 1` wall time", "s"),
        FigureSpec("qual.run_nauto_s", "qualification", "full `qualify run -n auto` wall time", "s"),
        FigureSpec("qual.random_per_h", "qualification", "random schedules per hour (one stack)", "/h"),
        FigureSpec("res.api_rss_mib", "resources", "API peak RSS at the top concurrency (500 in a full run)", "MiB"),
        FigureSpec("res.worker_rss_mib", "resources", "worker peak RSS at the top concurrency (500 in a full run)", "MiB"),
        FigureSpec("res.rows_per_run", "resources", "database rows inserted per run", "rows"),
        FigureSpec("res.wal_bytes_per_run", "resources", "WAL bytes written per run", "B"),
    ]
    return tuple(s)


def _sharded_specs() -> list[FigureSpec]:
    """The ``sharded`` section's rows: the floor and qimpl on a dev server that reads its
    one history shard at a cluster's rate (``bench.sharded``), each compared with the same
    reference as its default-server row."""
    tag = "sharded server (shard reader 1,000/s, as a cluster's many shards; not the dev server's default)"
    s = [
        FigureSpec("sharded.floor.wf_p50_s", "sharded", f"{tag}: bare workflow + 1 no-op activity, end-to-end p50",
                   "s", "floor.wf_p50_s"),
        FigureSpec("sharded.floor.wf_server_p50_s", "sharded", "  the same, server clock: start event -> close event p50",
                   "s", "floor.wf_server_p50_s"),
    ]
    s += [FigureSpec(f"sharded.floor.tput_c{c}", "sharded", f"  floor workflows/s, concurrency {c}", "/s",
                     f"floor.tput_c{c}") for c in CONCURRENCY]
    s += [
        FigureSpec("sharded.qimpl.accept_p50_s", "sharded", "  qimpl acceptance POST -> 202 p50", "s",
                   "sharded.floor.accept_budget_s"),
        FigureSpec("sharded.qimpl.e2e_p50_s", "sharded", "  qimpl run end-to-end p50", "s",
                   "sharded.floor.e2e_budget_s"),
        FigureSpec("sharded.qimpl.e2e_to_claim_p50_s", "sharded", "    of which accepted -> claimed p50", "s",
                   "sharded.qimpl.e2e_p50_s"),
        FigureSpec("sharded.qimpl.e2e_claim_to_done_p50_s", "sharded", "    of which claimed -> completed p50", "s",
                   "sharded.qimpl.e2e_p50_s"),
        FigureSpec("sharded.qimpl.e2e_vs_dbos_p50_s", "sharded", "  qimpl end-to-end p50 vs DBOS", "s",
                   "dbos.e2e_p50_s"),
    ]
    s += [FigureSpec(f"sharded.qimpl.tput_c{c}", "sharded", f"  qimpl runs/s, concurrency {c}", "/s",
                     f"sharded.floor.tput_c{c}") for c in CONCURRENCY]
    s += [FigureSpec(f"sharded.qimpl.tput_vs_dbos_c{c}", "sharded", f"  qimpl runs/s at concurrency {c} vs DBOS",
                     "/s", f"dbos.tput_c{c}") for c in CONCURRENCY]
    return s


def mb_prefix(runs: int, steps: int, delay_ms: int) -> str:
    """The key prefix of one model-bound shape: ``mb.<runs>x<steps>x<delay_ms>``; a
    system's figures are ``<prefix>.<system>.<metric>`` (``bench.model_bound``)."""
    return f"mb.{runs}x{steps}x{delay_ms}"


def _model_bound_specs() -> list[FigureSpec]:
    """The ``model_bound`` section's rows for its default shapes; other shapes are in
    the results file and in the section's own tables (``mb_table``)."""
    s: list[FigureSpec] = []
    for runs, steps, delay_ms in MODEL_BOUND_SHAPES:
        p = mb_prefix(runs, steps, delay_ms)
        tag = f"{runs:,} runs x {steps} steps x {delay_ms:,} ms on the provider, all started at once"
        s += [
            FigureSpec(f"{p}.floor.runs_per_s", "model-bound", f"{tag}: floor (bare Temporal, SDK defaults) runs/s", "/s"),
            FigureSpec(f"{p}.dbos.runs_per_s", "model-bound", "  DBOS (1 process, async steps) runs/s", "/s"),
            FigureSpec(f"{p}.qimpl.runs_per_s", "model-bound", "  qimpl (defaults, 1 worker) runs/s", "/s",
                       f"{p}.floor.runs_per_s"),
            FigureSpec(f"{p}.qimpl.runs_per_s_vs_dbos", "model-bound", "  qimpl runs/s vs DBOS", "/s",
                       f"{p}.dbos.runs_per_s"),
            FigureSpec(f"{p}.floor.p50_s", "model-bound", "  floor completion latency p50", "s"),
            FigureSpec(f"{p}.floor.p95_s", "model-bound", "  floor completion latency p95", "s"),
            FigureSpec(f"{p}.dbos.p50_s", "model-bound", "  DBOS completion latency p50", "s"),
            FigureSpec(f"{p}.qimpl.p50_s", "model-bound", "  qimpl completion latency p50", "s", f"{p}.floor.p50_s"),
            FigureSpec(f"{p}.qimpl.p95_s", "model-bound", "  qimpl completion latency p95", "s", f"{p}.floor.p95_s"),
            FigureSpec(f"{p}.qimpl.pg_worker_peak", "model-bound", "  qimpl worker's peak PostgreSQL sessions",
                       "sessions"),
            FigureSpec(f"{p}.qimpl.pg_server_peak", "model-bound", "  whole server's peak client sessions (qimpl)",
                       "sessions"),
        ]
    return s


FIGURES: tuple[FigureSpec, ...] = _specs()


def derived(values: Figures) -> dict[str, float | None]:
    """The reference budgets the issue defines from floor figures (seconds):
    ``floor.e2e_budget_s`` = floor workflow p50 on the server's clock (the client-side p50
    in results older than that figure) + 4 x floor commit p50 (the issue's
    budget for a 3-step run: a workflow plus about four commits), and
    ``floor.accept_budget_s`` = floor commit p50 + raw Temporal start p50 (the same two
    under ``sharded.``, from that section's own floor); plus
    qimpl's end-to-end p50 and throughput copied under the keys compared with DBOS."""
    out: dict[str, float | None] = {}
    for prefix in ("", "sharded."):
        wf = values.get(f"{prefix}floor.wf_server_p50_s", values.get(f"{prefix}floor.wf_p50_s"))
        commit, start = values.get(f"{prefix}floor.commit_p50_s"), values.get(f"{prefix}floor.start_p50_s")
        out[f"{prefix}floor.e2e_budget_s"] = None if wf is None or commit is None else wf + 4 * commit
        out[f"{prefix}floor.accept_budget_s"] = None if start is None or commit is None else commit + start
        out[f"{prefix}qimpl.e2e_vs_dbos_p50_s"] = values.get(f"{prefix}qimpl.e2e_p50_s")
        for c in CONCURRENCY:
            out[f"{prefix}qimpl.tput_vs_dbos_c{c}"] = values.get(f"{prefix}qimpl.tput_c{c}")
    for shape in MODEL_BOUND_SHAPES:
        p = mb_prefix(*shape)
        out[f"{p}.qimpl.runs_per_s_vs_dbos"] = values.get(f"{p}.qimpl.runs_per_s")
    return out


@dataclass(frozen=True)
class FigureRow:
    spec: FigureSpec
    value: float | None
    ratio: float | None
    #: "measured", "not measured in this run", or "last known (<file>)".
    status: str


def rows(values: Figures, *, previous: Figures | None = None,
         previous_label: str = "") -> list[FigureRow]:
    """One row per ``FIGURES`` entry with its ratio to its reference. A figure missing
    from ``values`` but present in ``previous`` is shown with that value, labelled
    ``last known (<previous_label>)``."""
    full = {**values, **derived(values)}
    out = []
    for spec in FIGURES:
        value, status = full.get(spec.key), "measured"
        if value is None and previous and previous.get(spec.key) is not None:
            value, status = previous[spec.key], f"last known ({previous_label})"
        elif value is None:
            status = "not measured in this run"
        ref = full.get(spec.ref) if spec.ref else None
        out.append(FigureRow(spec, value, ratio(value, ref) if status == "measured" else None, status))
    return out


def format_value(value: float | None, unit: str) -> str:
    """Human form: seconds below 1 as ms, rates with one decimal, bytes and rows whole."""
    if value is None:
        return "-"
    if unit == "s":
        return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"
    if unit in ("/s", "/h"):
        return f"{value:,.1f}{unit}"
    if unit == "MiB":
        return f"{value:.0f} MiB"
    return f"{value:,.0f} {unit}"


# -- targets -------------------------------------------------------------------------------

@dataclass(frozen=True)
class TargetResult:
    target: str
    #: True met, False missed, None not measured.
    met: bool | None
    value: float | None
    limit: float | None
    detail: str


@dataclass(frozen=True)
class Target:
    id: str
    text: str
    #: (value, limit) from the figures; either None means "not measured".
    measure: Callable[[Mapping[str, float | None]], tuple[float | None, float | None]]
    #: True: met when value <= limit; False: met when value >= limit.
    at_most: bool = True


def _key(k: str) -> Callable[[Mapping[str, float | None]], float | None]:
    return lambda v: v.get(k)


def _const(x: float) -> Callable[[Mapping[str, float | None]], float | None]:
    return lambda v: x


def _scaled(k: str, factor: float) -> Callable[[Mapping[str, float | None]], float | None]:
    return lambda v: None if v.get(k) is None else factor * float(v[k])  # type: ignore[arg-type]


def _plus(k: str, extra: float) -> Callable[[Mapping[str, float | None]], float | None]:
    return lambda v: None if v.get(k) is None else float(v[k]) + extra  # type: ignore[arg-type]


def _pair(value: Callable[[Mapping[str, float | None]], float | None],
          limit: Callable[[Mapping[str, float | None]], float | None]
          ) -> Callable[[Mapping[str, float | None]], tuple[float | None, float | None]]:
    return lambda v: (value(v), limit(v))


def _best_run(v: Mapping[str, float | None]) -> float | None:
    runs = [x for x in (v.get("qual.run_n1_s"), v.get("qual.run_nauto_s")) if x is not None]
    return min(runs) if runs else None


def _targets() -> tuple[Target, ...]:
    t = [
        # Judged against the lease, which is below H: stricter than the H + 0.5 s.
        Target("sigkill-p50", "worker SIGKILL -> next checkpoint by a survivor p50 <= L + 0.5 s (default server; L < H)",
               _pair(_key("recovery.sigkill_p50_s"), _plus("recovery.lease_s", 0.5))),
        Target("sigkill-p95", "worker SIGKILL -> next checkpoint by a survivor p95 <= L + 1 s (default server; L < H)",
               _pair(_key("recovery.sigkill_p95_s"), _plus("recovery.lease_s", 1.0))),
        Target("sigstop-takeover", "SIGSTOPped owner -> takeover p50 <= lease + 1.5 s (default server)",
               _pair(_key("recovery.sigstop_s"), _plus("recovery.lease_s", 1.5))),
        Target("in-txn-takeover", "owner paused inside its transaction -> takeover p50 <= lease + 1.5 s (default server)",
               _pair(_key("recovery.in_txn_s"), _plus("recovery.lease_s", 1.5))),
        Target("cancel", "cancel -> running step stopped <= 1 s",
               _pair(_key("recovery.cancel_s"), _const(1.0))),
        Target("e2e", "qimpl end-to-end p50 <= 1.5 x (floor workflow p50 + 4 x floor commit p50)",
               _pair(_key("qimpl.e2e_p50_s"), _scaled("floor.e2e_budget_s", 1.5))),
        Target("accept", "acceptance p50 <= 1.5 x (one commit + one raw Temporal start)",
               _pair(_key("qimpl.accept_p50_s"), _scaled("floor.accept_budget_s", 1.5))),
    ]
    t += [Target("e2e-dbos", "qimpl end-to-end p50 <= 2 x DBOS (default dev server)",
                 _pair(_key("qimpl.e2e_p50_s"), _scaled("dbos.e2e_p50_s", 2.0))),
          Target("e2e-dbos-sharded", "qimpl end-to-end p50 <= 2 x DBOS (sharded server)",
                 _pair(_key("sharded.qimpl.e2e_p50_s"), _scaled("dbos.e2e_p50_s", 2.0)))]
    for prefix, suffix, where in (("", "", ""), ("sharded.", "-sharded", " (sharded server)")):
        for c in CONCURRENCY:
            qimpl = _key(f"{prefix}qimpl.tput_c{c}")
            t.append(Target(f"tput-floor-c{c}{suffix}", f"qimpl throughput >= 0.5 x floor at concurrency {c}{where}",
                            _pair(qimpl, _scaled(f"{prefix}floor.tput_c{c}", 0.5)), at_most=False))
            t.append(Target(f"tput-dbos-c{c}{suffix}", f"qimpl throughput >= 0.5 x DBOS at concurrency {c}{where}",
                            _pair(qimpl, _scaled(f"dbos.tput_c{c}", 0.5)), at_most=False))
    t += [
        Target("qualify-run", "full `qualify run` <= 60 s on 2 cores (best of -n 1 and -n auto)",
               _pair(_best_run, _const(60.0))),
        Target("random-rate", "random schedules >= 1,000 an hour",
               _pair(_key("qual.random_per_h"), _const(1000.0)), at_most=False),
        Target("boot", "stack boot <= 0.5 s p50", _pair(_key("qual.boot_p50_s"), _const(0.5))),
    ]
    mb = MODEL_BOUND_TARGETS
    for runs, steps, delay_ms in MODEL_BOUND_SHAPES:
        p, tag = mb_prefix(runs, steps, delay_ms), f"{runs}x{steps}x{delay_ms}"
        qimpl = _key(f"{p}.qimpl.runs_per_s")
        t += [
            Target(f"mb-floor-{tag}", f"model-bound {tag}: qimpl runs/s >= {mb['floor']} x floor",
                   _pair(qimpl, _scaled(f"{p}.floor.runs_per_s", mb["floor"])), at_most=False),
            Target(f"mb-dbos-{tag}", f"model-bound {tag}: qimpl runs/s >= {mb['dbos']} x DBOS",
                   _pair(qimpl, _scaled(f"{p}.dbos.runs_per_s", mb["dbos"])), at_most=False),
            Target(f"mb-sessions-{tag}", f"model-bound {tag}: qimpl worker's peak PostgreSQL sessions "
                   f"<= {mb['worker_sessions']:.0f}",
                   _pair(_key(f"{p}.qimpl.pg_worker_peak"), _const(mb["worker_sessions"]))),
        ]
    return tuple(t)


TARGETS: tuple[Target, ...] = _targets()


def evaluate(values: Figures, targets: Sequence[Target] = TARGETS) -> list[TargetResult]:
    """Judge every target against ``values`` (derived budgets included): met, missed,
    or not measured (None) when its figure or its limit is missing."""
    full = {**values, **derived(values)}
    out = []
    for tgt in targets:
        value, limit = tgt.measure(full)
        if value is None or limit is None:
            out.append(TargetResult(tgt.id, None, value, limit, "not measured in this run"))
            continue
        met = value <= limit if tgt.at_most else value >= limit
        op = "<=" if tgt.at_most else ">="
        out.append(TargetResult(tgt.id, met, value, limit,
                                f"{value:.4g} {op} {limit:.4g}: {'met' if met else 'missed'}"))
    return out


# -- the model-bound section's own tables ----------------------------------------------

def mb_systems(values: Mapping[str, object], prefix: str) -> list[str]:
    """The systems measured at ``prefix`` (those with a ``runs_per_s``), in the order they
    are shown: qimpl at its defaults, qimpl with other activity slots (``qimpl_slots<K>``,
    by K), the floor, DBOS."""
    found = {k[len(prefix) + 1:-len(".runs_per_s")] for k in values
             if k.startswith(prefix + ".") and k.endswith(".runs_per_s") and "." not in k[len(prefix) + 1:-len(".runs_per_s")]}

    def order(name: str) -> tuple[int, int, str]:
        if name == "qimpl":
            return (0, 0, name)
        if name.startswith("qimpl_slots") and name[len("qimpl_slots"):].isdigit():
            return (1, int(name[len("qimpl_slots"):]), name)
        return ({"floor": 2, "dbos": 3}.get(name, 4), 0, name)

    return sorted(found, key=order)


def _system_label(values: Mapping[str, object], prefix: str, system: str) -> str:
    slots = values.get(f"{prefix}.{system}.slots")
    if system == "qimpl":
        return f"qimpl, defaults ({slots} activity slots)" if slots is not None else "qimpl, defaults"
    if system.startswith("qimpl"):
        return f"qimpl, {slots} activity slots" if slots is not None else system
    return {"floor": "floor: bare Temporal (SDK defaults)", "dbos": "DBOS (1 process)"}.get(system, system)


def _num(values: Mapping[str, object], key: str) -> float | None:
    v = values.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _cell(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "s":
        return f"{value:.2f} s"
    if unit == "/s":
        return f"{value:,.1f}"
    if unit == "MiB":
        return f"{value:,.0f} MiB"
    if unit == "cpu":
        return f"{value:,.1f} s"
    return f"{value:,.0f}"


def mb_table(values: Mapping[str, object], prefix: str) -> tuple[list[str], list[list[str]]]:
    """(header, one row per system) of a model-bound shape: completed runs, runs/s,
    completion latency p50/p95, the whole server's and the worker's peak PostgreSQL
    sessions, the PostgreSQL processes' peak memory (PSS or RSS, as measured) and CPU
    seconds. Missing figures are ``-``."""
    header = ["system", "completed", "runs/s", "p50", "p95", "PG sessions peak (server)",
              "worker's PG sessions peak", "PG backends memory peak", "PG CPU"]
    out = []
    for system in mb_systems(values, prefix):
        k = f"{prefix}.{system}."
        done, runs = _num(values, k + "completed"), _num(values, k + "runs")
        kind = values.get(k + "pg_mem_kind")
        mem = _cell(_num(values, k + "pg_mem_mib"), "MiB")
        out.append([_system_label(values, prefix, system),
                    "-" if done is None else (f"{done:,.0f}" + ("" if runs is None else f"/{runs:,.0f}")),
                    _cell(_num(values, k + "runs_per_s"), "/s"), _cell(_num(values, k + "p50_s"), "s"),
                    _cell(_num(values, k + "p95_s"), "s"), _cell(_num(values, k + "pg_server_peak"), "n"),
                    _cell(_num(values, k + "pg_worker_peak"), "n"),
                    mem if mem == "-" or not kind else f"{mem} ({kind})",
                    _cell(_num(values, k + "pg_cpu_s"), "cpu")])
    return header, out


def mb_processes(values: Mapping[str, object], prefix: str) -> tuple[list[str], list[list[str]]]:
    """(header, one row per system and process): each process's peak RSS and CPU seconds
    over the measured window (``<system>.rss_mib.<process>``, ``<system>.cpu_s.<process>``)."""
    header = ["system", "process", "peak RSS", "CPU"]
    out = []
    for system in mb_systems(values, prefix):
        k = f"{prefix}.{system}."
        procs = sorted({key[len(k + "rss_mib."):] for key in values if key.startswith(k + "rss_mib.")}
                       | {key[len(k + "cpu_s."):] for key in values if key.startswith(k + "cpu_s.")})
        for proc in procs:
            out.append([_system_label(values, prefix, system), proc,
                        _cell(_num(values, f"{k}rss_mib.{proc}"), "MiB"),
                        _cell(_num(values, f"{k}cpu_s.{proc}"), "cpu")])
    return header, out


def mb_qimpl_phases(values: Mapping[str, object], prefix: str) -> tuple[list[str], list[list[str]]]:
    """(header, one row per qimpl configuration): where its runs' time went, by the
    database's timestamps: the API's span from the first to the last acceptance,
    accepted -> claimed (dispatch and the wait for an activity slot) p50/p95, claimed ->
    completed p50."""
    header = ["qimpl", "all accepted in", "accepted -> claimed p50", "p95", "claimed -> completed p50"]
    out = []
    for system in mb_systems(values, prefix):
        if not system.startswith("qimpl"):
            continue
        k = f"{prefix}.{system}."
        out.append([_system_label(values, prefix, system), *(
            _cell(_num(values, k + m), "s") for m in ("accept_span_s", "to_claim_p50_s", "to_claim_p95_s",
                                                     "claim_to_done_p50_s"))])
    return header, out


@dataclass(frozen=True)
class ModelBoundRatio:
    """One of issue 55's model-bound figures for one qimpl configuration: ``value``
    against ``limit`` (``at_most``: met when value <= limit; else when value >= limit);
    ``met`` None when either is missing."""

    system: str
    label: str
    value: float | None
    limit: float
    at_most: bool

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        return self.value <= self.limit if self.at_most else self.value >= self.limit

    def text(self) -> str:
        op = "<=" if self.at_most else ">="
        shown = "-" if self.value is None else (f"{self.value:.2f}" if not self.at_most else f"{self.value:.0f}")
        verdict = {True: "met", False: "missed", None: "not measured"}[self.met]
        limit = f"{self.limit:.2f}" if not self.at_most else f"{self.limit:.0f}"
        return f"{shown} (target {op} {limit}): {verdict}"


def mb_ratios(values: Mapping[str, object], prefix: str) -> list[ModelBoundRatio]:
    """For each qimpl configuration measured at ``prefix``: its runs/s / the floor's
    (target >= 0.8), / DBOS's (>= 0.5), and its worker's peak PostgreSQL sessions (<= 30)."""
    floor = _num(values, f"{prefix}.floor.runs_per_s")
    dbos = _num(values, f"{prefix}.dbos.runs_per_s")
    out = []
    for system in mb_systems(values, prefix):
        if not system.startswith("qimpl"):
            continue
        mine = _num(values, f"{prefix}.{system}.runs_per_s")
        label = _system_label(values, prefix, system)
        out += [
            ModelBoundRatio(system, f"{label}: runs/s / floor's", ratio(mine, floor),
                            MODEL_BOUND_TARGETS["floor"], at_most=False),
            ModelBoundRatio(system, f"{label}: runs/s / DBOS's", ratio(mine, dbos),
                            MODEL_BOUND_TARGETS["dbos"], at_most=False),
            ModelBoundRatio(system, f"{label}: worker's peak PG sessions",
                            _num(values, f"{prefix}.{system}.pg_worker_peak"),
                            MODEL_BOUND_TARGETS["worker_sessions"], at_most=True),
        ]
    return out


def mb_prefixes(values: Mapping[str, object]) -> list[str]:
    """Every model-bound shape in ``values`` (``mb.<runs>x<steps>x<delay_ms>``), by runs."""
    found = {".".join(k.split(".")[:2]) for k in values if k.startswith("mb.") and k.count(".") >= 3}

    def runs(p: str) -> tuple[int, str]:
        head = p.split(".")[1].split("x")[0]
        return (int(head) if head.isdigit() else 0, p)

    return sorted(found, key=runs)
