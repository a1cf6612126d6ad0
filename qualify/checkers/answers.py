"""The answer a completed run holds is the one its script asked for (R-EXEC-4, R-READ-2):
a run completed by a later attempt, from restored checkpoints, must not end with another
answer than the synthetic provider's script gives (pure)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from qualify.checkers._base import SETTLED, Check, _of, _summary
from qualify.history import Event

if TYPE_CHECKING:
    from qualify.fakes.synthetic import Script

__all__ = ["approval_answers", "completed_with_the_scripted_answer", "scripted_answer"]


def _md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def _script(prompt: str) -> Script | None:
    """The synthetic script ``prompt`` carries; None for a prompt that is not one."""
    from qualify.fakes.synthetic import Script

    try:
        doc = json.loads(prompt)
        return Script(doc) if isinstance(doc, dict) else None
    except ValueError:
        return None


def scripted_answer(script: Script, journal: Sequence[Event]) -> str | None:
    """The answer the synthetic provider gives a completed run of ``script`` whose tool
    journal is ``journal``: the script's answer, then the tool results it was fed
    (`` [tool:status ...]``, in the order asked). None after a park for an approval, where
    the provider says how the tool went or gives up when denied (judged by prefix)."""
    if script.park and script.park.get("kind") == "approval":
        return None
    settled = sorted((e for e in journal if e.get("status") in SETTLED),
                     key=lambda e: (int(e.get("step") or 0), int(e.get("position") or 0)))
    digest = (" [" + " ".join(f"{e.get('tool')}:{e.get('status')}" for e in settled) + "]") if settled else ""
    return script.answer + digest


def approval_answers(script: Script, journal: Sequence[Event]) -> set[str]:
    """The answers the synthetic provider gives a completed run parked for an approval
    (``qualify.fakes.synthetic``'s ``_after_decision``): ``"<answer> (tool <outcome>: <tool>)"``
    for a journaled call it was fed (``ran`` for one that succeeded, else its status), or
    ``"denied: nothing ran"`` once it gives up (denied, it journals no call)."""
    out = set()
    for e in journal:
        status = e.get("status")
        if status in SETTLED:
            outcome = "ran" if status == "succeeded" else str(status)
            out.add(f"{script.answer} (tool {outcome}: {e.get('tool')})")
    return out or {"denied: nothing ran"}


def completed_with_the_scripted_answer(history: Sequence[Event]) -> Check:
    """Every completed run the synthetic provider answered (it recorded a call of it) holds
    exactly the answer its script gives, compared by PostgreSQL's md5 of the stored answer;
    a run parked for an approval, against the answers the provider gives after a decision
    (``approval_answers``), by the same digest. Vacuous without such runs (another provider's scenario)."""
    name = "every completed run holds the answer its script gives"
    asked = {str(e["run_id"]) for e in _of(history, "provider_call")}
    journal: dict[str, list[Event]] = {}
    for e in _of(history, "tool_invocation"):
        journal.setdefault(str(e["run_id"]), []).append(e)
    bad, judged = [], 0
    for run in _of(history, "run"):
        run_id = str(run["run_id"])
        if run.get("state") != "completed" or run_id not in asked or not run.get("prompt"):
            continue
        script = _script(str(run["prompt"]))
        if script is None:
            continue
        judged += 1
        want = scripted_answer(script, journal.get(run_id, []))
        if want is None:
            # Parked for an approval: the answer is one the synthetic provider gives after a
            # decision, built from the journaled call it was fed (``(tool ran: send_email)``,
            # ``(tool denied: send_email)``...), or its giving up after denials. Compared by
            # digest, each candidate in turn: a length alone lets a changed answer through.
            candidates = approval_answers(script, journal.get(run_id, []))
            if run.get("answer_md5") not in {_md5(c) for c in candidates}:
                bad.append(f"{run_id}: the stored answer ({run.get('answer_chars')} characters) is none"
                           f" of the {len(candidates)} answers its script gives after a decision"
                           f" ({sorted(candidates)[0][:60]!r}...)")
        elif run.get("answer_md5") != _md5(want):
            bad.append(f"{run_id}: the stored answer ({run.get('answer_chars')} characters) is not"
                       f" {want[:60]!r}{'...' if len(want) > 60 else ''}")
    return Check(name, not bad, _summary(bad) or f"{judged} completed runs", ("R-EXEC-4", "R-READ-2"),
                 judged=judged)
