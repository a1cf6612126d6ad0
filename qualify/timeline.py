"""A scenario's history drawn as an SVG timeline (pure; issue 25, item 3): what a reader
would rather look at than read.

- **Faults** are red lines across the whole picture, each labelled with its kind.
- **One band per run** (up to ``MAX_RUNS``): the run's state from each transition to the
  next, at the transition's **commit time on the database's clock** (``commit_t``), the
  owner attempt written in each span it owned (``a3``), a black bar where ownership
  passed to another attempt (a takeover), a white tick at each committed checkpoint.
- **Harness lanes** below: client requests, crash points, barriers and provider calls,
  one dot each (up to ``MAX_EVENTS``).

Harness events carry the harness's clock and database rows the database's; both run on
this host, so they share one axis (the picture says so). Every mark has a tooltip.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from qualify.history import Event

__all__ = ["LANES", "MAX_EVENTS", "MAX_RUNS", "STATE_COLOURS", "svg_timeline"]

MAX_EVENTS = 600
MAX_RUNS = 10
#: The harness lanes under the run bands, in order.
LANES = ("client", "crash_point", "barrier", "provider_call")
_DOT = {"client": "#2563eb", "crash_point": "#ea580c", "barrier": "#9333ea", "provider_call": "#0891b2"}
STATE_COLOURS = {
    "accepted": "#d1d5db", "queued": "#93c5fd", "running": "#4ade80",
    "awaiting_input": "#fde047", "awaiting_approval": "#facc15", "awaiting_reconciliation": "#fb923c",
    "completed": "#15803d", "failed": "#dc2626", "expired": "#c2410c", "cancelled": "#7c3aed",
}
_TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
WIDTH, LEFT, RIGHT, BAND_H, LANE_H, TOP = 900, 110, 14, 18, 18, 34


def _label(e: Event) -> str:
    keys = ("op", "phase", "status", "fault", "target", "name", "point", "step", "attempt",
            "old_state", "new_state", "owner_attempt", "checkpoint_step", "row_version", "run_id")
    parts = [f"{k}={e[k]}" for k in keys if e.get(k) is not None]
    return f"{e['type']} " + " ".join(str(p) for p in parts)[:300]


def _when(e: Event) -> float:
    """A row's commit time on the database's clock where it has one, else its ``t``."""
    return float(e.get("commit_t") or e["t"])


def _step(span: float) -> float:
    """A round tick interval giving about 8 ticks over ``span`` seconds."""
    raw = span / 8
    base = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    return next(m * base for m in (1, 2, 5, 10) if m * base >= raw)


def svg_timeline(events: Sequence[Event]) -> tuple[str, bool]:
    """(SVG markup, capped?) for ``events`` (any order; unknown kinds are ignored).
    Capped: more than ``MAX_RUNS`` runs or ``MAX_EVENTS`` dots; the picture says how many
    were left out."""
    transitions = sorted((e for e in events if e.get("type") == "transition" and e.get("run_id")),
                         key=lambda e: (_when(e), e.get("id", 0)))
    faults = sorted((e for e in events if e.get("type") == "fault"), key=lambda e: e["t"])
    dots = sorted((e for e in events if e.get("type") in LANES), key=lambda e: e["t"])
    runs: dict[str, list[Event]] = {}
    for e in transitions:
        runs.setdefault(str(e["run_id"]), []).append(e)
    drawn_runs = list(runs)[:MAX_RUNS]
    capped = len(runs) > MAX_RUNS or len(dots) > MAX_EVENTS
    dots = dots[:MAX_EVENTS]
    times = [_when(e) for e in transitions] + [e["t"] for e in faults] + [e["t"] for e in dots]
    if not times:
        return f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="30"></svg>', False
    t0, t1 = min(times), max(times)
    span = max(t1 - t0, 1e-3)
    plot_w = WIDTH - LEFT - RIGHT

    def x(t: float) -> float:
        return LEFT + plot_w * (t - t0) / span

    bands_y = TOP
    lanes_y = bands_y + BAND_H * len(drawn_runs) + (14 if drawn_runs else 0)
    axis_y = lanes_y + LANE_H * len(LANES) + 4
    height = axis_y + 48
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" '
           'font-family="sans-serif" font-size="11" role="img">',
           '<text x="4" y="12" fill="#374151">runs: state at each transition\'s commit on the '
           'database\'s clock, owner attempt aN, | takeover, ▪ checkpoint; red: faults</text>']
    # Run bands.
    for i, run_id in enumerate(drawn_runs):
        y = bands_y + i * BAND_H
        out.append(f'<text x="4" y="{y + 12}" fill="#111"><title>{escape(run_id)}</title>'
                   f'run {escape(run_id[:8])}</text>')
        rows = runs[run_id]
        for j, row in enumerate(rows):
            start = x(_when(row))
            state = str(row.get("new_state"))
            end = x(_when(rows[j + 1])) if j + 1 < len(rows) else (
                start + 4 if state in _TERMINAL else x(t1))
            w = max(end - start, 1.5)
            owner = row.get("owner_attempt")
            out.append(f'<rect x="{start:.1f}" y="{y + 2}" width="{w:.1f}" height="{BAND_H - 4}" '
                       f'fill="{STATE_COLOURS.get(state, "#9ca3af")}"><title>+{_when(row) - t0:.3f} s '
                       f'{escape(_label(row))}</title></rect>')
            if owner is not None and state == "running" and w > 18:
                out.append(f'<text x="{start + 3:.1f}" y="{y + 12}" fill="#052e16" font-size="9">'
                           f'a{escape(str(owner))}</text>')
            prev = rows[j - 1] if j else None
            if prev is not None and owner is not None and prev.get("owner_attempt") not in (None, owner):
                out.append(f'<rect x="{start - 1:.1f}" y="{y}" width="2" height="{BAND_H}" fill="#111">'
                           f'<title>takeover: attempt {escape(str(prev.get("owner_attempt")))} → '
                           f'{escape(str(owner))}</title></rect>')
            if prev is not None and (row.get("checkpoint_step") or 0) > (prev.get("checkpoint_step") or 0):
                out.append(f'<rect x="{start + 1:.1f}" y="{y + BAND_H - 7}" width="4" height="4" '
                           f'fill="#fff" stroke="#14532d" stroke-width="0.8"><title>checkpoint step {escape(str(row["checkpoint_step"]))}'
                           '</title></rect>')
    if len(runs) > MAX_RUNS:
        out.append(f'<text x="{LEFT}" y="{lanes_y - 3}" fill="#6b7280">… and {len(runs) - MAX_RUNS} '
                   'more runs, not drawn</text>')
    # Harness lanes.
    for i, lane in enumerate(LANES):
        y = lanes_y + i * LANE_H + LANE_H // 2
        out.append(f'<text x="4" y="{y + 4}" fill="#111">{lane.replace("_", " ")}</text>'
                   f'<line x1="{LEFT}" y1="{y}" x2="{WIDTH - RIGHT}" y2="{y}" stroke="#e5e7eb"/>')
    for e in dots:
        y = lanes_y + LANES.index(e["type"]) * LANE_H + LANE_H // 2
        out.append(f'<circle cx="{x(e["t"]):.1f}" cy="{y}" r="3.5" fill="{_DOT[e["type"]]}">'
                   f'<title>+{e["t"] - t0:.3f} s {escape(_label(e))}</title></circle>')
    # Faults across everything, labelled at the top.
    for e in faults:
        fx = x(e["t"])
        kind = str(e.get("fault", "fault")).split(":")[-1]
        out.append(f'<line x1="{fx:.1f}" y1="{TOP - 8}" x2="{fx:.1f}" y2="{axis_y}" stroke="#dc2626" '
                   f'stroke-width="1.5" stroke-dasharray="3,2"><title>+{e["t"] - t0:.3f} s '
                   f'{escape(_label(e))}</title></line>'
                   f'<text x="{fx + 2:.1f}" y="{TOP - 9}" fill="#dc2626" font-size="9">{escape(kind[:12])}</text>')
    # Axis: round ticks in seconds from the first mark.
    step = _step(span)
    out.append(f'<line x1="{LEFT}" y1="{axis_y}" x2="{WIDTH - RIGHT}" y2="{axis_y}" stroke="#6b7280"/>')
    tick = 0.0
    while tick <= span + 1e-9:
        tx = x(t0 + tick)
        out.append(f'<line x1="{tx:.1f}" y1="{axis_y}" x2="{tx:.1f}" y2="{axis_y + 4}" stroke="#6b7280"/>'
                   f'<text x="{tx:.1f}" y="{axis_y + 15}" fill="#6b7280" text-anchor="middle">'
                   f'{tick:g} s</text>')
        tick += step
    # Legend: the states that appear.
    seen = [s for s in STATE_COLOURS if any(r.get("new_state") == s for r in transitions)]
    lx = LEFT
    for state in seen:
        out.append(f'<rect x="{lx}" y="{axis_y + 24}" width="10" height="10" fill="{STATE_COLOURS[state]}"/>'
                   f'<text x="{lx + 13}" y="{axis_y + 33}" fill="#374151">{state}</text>')
        lx += 24 + 7 * len(state)
    if len(dots) == MAX_EVENTS and capped:
        out.append(f'<text x="{WIDTH - 260}" y="{axis_y + 33}" fill="#6b7280">dots capped at '
                   f'{MAX_EVENTS}</text>')
    out.append("</svg>")
    return "".join(out), capped
