"""A scenario's history drawn as an SVG timeline (pure): one lane per event type, one
mark per event with a tooltip. Capped at ``MAX_EVENTS`` marks, and it says so."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from qualify.history import Event

__all__ = ["LANES", "MAX_EVENTS", "svg_timeline"]

MAX_EVENTS = 600
LANES = ("client", "fault", "barrier", "crash_point", "provider_call", "checkpoint", "transition")
_COLOURS = {"client": "#2563eb", "fault": "#dc2626", "barrier": "#9333ea", "crash_point": "#ea580c",
            "provider_call": "#0891b2", "checkpoint": "#16a34a", "transition": "#4b5563"}
WIDTH, LANE_H, LEFT = 900, 22, 110


def _label(e: Event) -> str:
    keys = ("op", "phase", "status", "fault", "target", "name", "point", "step", "attempt",
            "old_state", "new_state", "row_version", "run_id")
    parts = [f"{k}={e[k]}" for k in keys if e.get(k) is not None]
    return f"{e['type']} " + " ".join(str(p) for p in parts)[:300]


def svg_timeline(events: Sequence[Event]) -> tuple[str, bool]:
    """(SVG markup, capped?) for ``events`` (any order; only known lanes are drawn)."""
    drawn = sorted((e for e in events if e.get("type") in LANES), key=lambda e: e["t"])
    capped = len(drawn) > MAX_EVENTS
    drawn = drawn[:MAX_EVENTS]
    height = LANE_H * len(LANES) + 30
    if not drawn:
        return f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="30"></svg>', False
    t0, t1 = drawn[0]["t"], drawn[-1]["t"]
    span = max(t1 - t0, 1e-6)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           'font-family="sans-serif" font-size="11" role="img">']
    for i, lane in enumerate(LANES):
        y = 15 + i * LANE_H
        out.append(f'<text x="4" y="{y + 4}" fill="#111">{lane}</text>'
                   f'<line x1="{LEFT}" y1="{y}" x2="{WIDTH - 10}" y2="{y}" stroke="#e5e7eb"/>')
    for e in drawn:
        x = LEFT + (WIDTH - LEFT - 10) * (e["t"] - t0) / span
        y = 15 + LANES.index(e["type"]) * LANE_H
        r = 6 if e["type"] == "fault" else 3.5
        out.append(f'<circle cx="{x:.1f}" cy="{y}" r="{r}" fill="{_COLOURS[e["type"]]}">'
                   f'<title>+{e["t"] - t0:.3f} s {escape(_label(e))}</title></circle>')
    y = height - 6
    out.append(f'<text x="{LEFT}" y="{y}" fill="#6b7280">0 s</text>'
               f'<text x="{WIDTH - 60}" y="{y}" fill="#6b7280">{span:.2f} s</text></svg>')
    return "".join(out), capped
