"""The history of one scenario: one time-ordered list of events (R-Q-5).

Events are plain dicts with ``t`` (seconds since the epoch) and ``type``:

- ``client``      ``op``, ``phase`` (``invoke`` | ``ok`` | ``fail`` | ``info``), ``run_id``, ...
                  (``info``: the outcome is unknown and is checked as possibly done)
- ``fault``       ``fault``, ``target``, ``evidence`` (proof that it landed), ``landed``
- ``transition``  one row of ``run_transitions``, written by the database's own trigger:
                  ``run_id, row_version, old_state, new_state, generation, owner_attempt,
                  checkpoint_step, id``
- ``run``         one row of ``runs`` at collection: ``run_id, state, deadline_t``,
                  ``lifecycle_version`` (``t`` = accepted)
- ``checkpoint``  one row of ``run_checkpoints``: ``run_id, step, generation, attempt, row_version``
- ``provider_call`` one line of the synthetic provider's own record: ``run_id, step, attempt, pid``
- ``crash_point`` a struck crash point with its context
- ``barrier``     a synthetic-provider barrier that was reached
- ``tool_invocation`` one row of the tool journal ``tool_invocations`` (``t`` = intent,
                  ``outcome_t``), R-TOOL-1
- ``provider_call_record`` one row of ``provider_calls``, the owner's record of a provider
                  call made before the call (``t`` = started, ``ended_t``, ``status``), R-Q34-2
- ``approval_decision`` one row of ``approval_decisions``: ``run_id, approval_id, approved``
- ``sink_request`` / ``sink_execution`` one line of the side-effect sink's own record:
                  ``call_id, run_id, tool, kind`` (every request; the effects it performed)

Rows read from the database carry, where the schema stamps them, the transaction that
wrote them (``xact_id``; ``intent_xact``/``outcome_xact``, ``started_xact``/``ended_xact``):
the evidence that a write's rows committed together (R-EXEC-3).

``HistoryRecorder`` appends harness events to ``history.jsonl`` as they happen, so a
crashed run still leaves evidence; ``collect`` merges in what the database and the
fakes recorded. This module does I/O only in the recorder; ``merge`` is pure.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["Event", "HistoryRecorder", "merge"]

Event = dict[str, Any]


def merge(*streams: Iterable[Event]) -> list[Event]:
    """All events of ``streams`` ordered by time (stable: ties keep stream order).

    Transitions keep the database's own order (their ``id``) even if two share a time.
    """
    events = [e for stream in streams for e in stream]
    return sorted(events, key=lambda e: (e["t"], e.get("id", 0)))


class HistoryRecorder:
    """Appends events to ``path`` (JSON lines) as they happen."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[Event] = []
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "a", encoding="utf-8")

    def record(self, type_: str, **fields: Any) -> Event:
        event: Event = {"t": time.time(), "type": type_, **fields}
        self.events.append(event)
        self._fh.write(json.dumps(event, default=str) + "\n")
        self._fh.flush()
        return event

    def rewrite(self, events: list[Event]) -> None:
        """Replace the file with the merged history (harness events plus collected ones)."""
        self._fh.close()
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            for event in events:
                fh.write(json.dumps(event, default=str) + "\n")
        tmp.replace(self.path)
        self._fh = open(self.path, "a", encoding="utf-8")

    def close(self) -> None:
        self._fh.close()
