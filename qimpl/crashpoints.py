"""Named crash points (R-Q-4): inert unless the process was started with a directive.

A crash point is declared once, at import time, next to the code it guards::

    AFTER_CHECKPOINT = declare("activity.after_checkpoint_commit", "after a step's checkpoint commits")
    ...
    await AFTER_CHECKPOINT.areach(run_id=run_id, step=step)   # from a coroutine
    AFTER_CHECKPOINT.reach(run_id=run_id, step=step)          # from synchronous code

The directive ``QIMPL_CRASH_POINTS="name:action[@n],..."`` arms points in one process:
``kill`` (SIGKILL self), ``stop`` (SIGSTOP self) or ``hold`` (notify, then wait for the
harness to release; from a coroutine, ``areach`` waits without blocking the event loop, so
a held owner still heartbeats and touches its lease) or ``freeze`` (the same, but the whole
process stalls: no heartbeat, no poll, no lease touch — a stalled, not a stopped, process). ``@n`` strikes on the n-th reach (default 1), so a restarted process
given the same directive is not struck again unless asked. Before striking, the process
appends one JSON line of evidence to ``<control_dir>/crash_points.jsonl``.

``name:action?armed`` arms a point at run time, for one context: it strikes only while the
harness has written ``<control_dir>/crash.<name>.arm`` (a JSON object such as
``{"run_id": "…", "step": 2}``) and only at a reach whose context has those values (compared
as strings); the process that strikes first claims the file (an atomic rename to
``crash.<name>.arm.<pid>``), so the point strikes once in all the processes given the
directive. Without the file such a point is inert (one ``stat`` per reach). A ``hold`` so
struck waits for the release file its evidence names (``release``: one per arming). The
random schedules use it to strike the run a fault is aimed at, in whichever worker owns it
(R-Q-10).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CATALOG", "CrashPoint", "arm_path", "declare", "parse_directive"]

ACTIONS = frozenset({"kill", "stop", "hold", "freeze"})
HOLD_POLL_S = 0.01
HOLD_MAX_S = 600.0


@dataclass(frozen=True)
class Directive:
    point: str
    action: str
    nth: int = 1
    #: Strike only for the context the harness wrote to ``crash.<point>.arm``, once.
    armed: bool = False


def parse_directive(text: str) -> dict[str, Directive]:
    """Parse ``name:action[@n][?armed],...``; raises ValueError on an unknown action, a bad
    count, an unknown option or a count given with ``?armed``."""
    out: dict[str, Directive] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, _, rest = item.partition(":")
        rest, _, option = rest.partition("?")
        action, _, nth = rest.partition("@")
        if action not in ACTIONS:
            raise ValueError(f"crash point {name!r}: unknown action {action!r}")
        if option not in ("", "armed"):
            raise ValueError(f"crash point {name!r}: unknown option {option!r}")
        n = int(nth) if nth else 1
        if n < 1:
            raise ValueError(f"crash point {name!r}: count must be >= 1")
        if option and nth:
            raise ValueError(f"crash point {name!r}: ?armed strikes at the matching reach, not @n")
        out[name] = Directive(name, action, n, armed=bool(option))
    return out


def arm_path(control_dir: Path, point: str) -> Path:
    """Where the harness arms ``point`` for one context (``?armed`` directives)."""
    return Path(control_dir) / f"crash.{point}.arm"


_claims = 0


def _claim_arm(control: str, point: str, context: dict[str, Any]) -> Path | None:
    """The claimed file (``crash.<point>.arm.<pid>.<n>``) when ``crash.<point>.arm`` exists,
    names this reach's context and this process claimed it (renamed it away) before any
    other; else None. A ``hold`` so struck waits for ``<claimed>.release``, so each arming
    is released on its own."""
    global _claims
    if not control:
        return None
    path = arm_path(Path(control), point)
    try:
        wanted = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(wanted, dict) or any(str(context.get(k)) != str(v) for k, v in wanted.items()):
        return None
    _claims += 1
    claimed = path.with_name(f"{path.name}.{os.getpid()}.{_claims}")
    try:
        path.rename(claimed)
    except OSError:
        return None  # another process claimed it first
    return claimed


@dataclass
class CrashPoint:
    name: str
    doc: str
    reached: int = field(default=0, compare=False)

    def reach(self, **context: Any) -> None:
        """Strike here if armed; otherwise a counter increment and nothing else. A ``hold``
        blocks the calling thread: use ``areach`` from a coroutine."""
        release, _ = self._strike(context)
        _wait_blocking(release)

    async def areach(self, **context: Any) -> None:
        """``reach`` for a coroutine: a ``hold`` suspends only the caller, so the process's
        event loop goes on — heartbeats, lease touches, polls and other requests are served
        while one owner waits at the point. A ``freeze`` blocks the whole event loop (a
        process stalled, yet alive and not stopped by a signal)."""
        release, freeze = self._strike(context)
        if freeze:
            _wait_blocking(release)
            return
        deadline = time.monotonic() + HOLD_MAX_S
        while release is not None and not release.exists() and time.monotonic() < deadline:
            await asyncio.sleep(HOLD_POLL_S)

    def _strike(self, context: dict[str, Any]) -> tuple[Path | None, bool]:
        """Count the reach; if armed, write the evidence line and strike (``kill``,
        ``stop``). Returns the release file to wait for on ``hold`` or ``freeze`` (else
        None) and whether the wait must block the thread (``freeze``)."""
        self.reached += 1
        directive = _armed().get(self.name)
        if directive is None:
            return None, False
        control = os.environ.get("QIMPL_CONTROL_DIR", "")
        claimed = None
        if directive.armed:
            claimed = _claim_arm(control, self.name, context)
            if claimed is None:
                return None, False
        elif directive.nth != self.reached:
            return None, False
        evidence = {
            "point": self.name,
            "action": directive.action,
            "pid": os.getpid(),
            "t": time.time(),
            "context": {k: str(v) for k, v in context.items()},
        }
        if claimed is not None:
            evidence["release"] = str(claimed.with_name(claimed.name + ".release"))
        if control:
            with open(Path(control) / "crash_points.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps(evidence) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        if directive.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif directive.action == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif directive.action in ("hold", "freeze") and control:
            release = Path(control) / f"crash.{self.name}.release" if claimed is None else \
                Path(str(evidence["release"]))
            return release, directive.action == "freeze"
        return None, False


def _wait_blocking(release: Path | None) -> None:
    deadline = time.monotonic() + HOLD_MAX_S
    while release is not None and not release.exists() and time.monotonic() < deadline:
        time.sleep(HOLD_POLL_S)


CATALOG: dict[str, CrashPoint] = {}
_directives: dict[str, Directive] | None = None


def _armed() -> dict[str, Directive]:
    global _directives
    if _directives is None:
        _directives = parse_directive(os.environ.get("QIMPL_CRASH_POINTS", ""))
    return _directives


def declare(name: str, doc: str) -> CrashPoint:
    """Register a crash point; names are unique across the code base."""
    if name in CATALOG:
        raise ValueError(f"crash point {name!r} declared twice")
    point = CrashPoint(name, doc)
    CATALOG[name] = point
    return point
