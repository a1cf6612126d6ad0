"""Checkers of the fence and the owners (R-EXEC-7, R-CREATE-5): no write by a superseded
attempt, every write by its owner, one workflow per generation and its input."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from qualify.checkers._base import Check, _by_run, _of, _summary
from qualify.history import Event

__all__ = [
    "every_write_by_its_owner",
    "no_write_by_a_superseded_attempt",
    "one_workflow_per_generation",
    "workflow_input_matches_its_run",
]


def no_write_by_a_superseded_attempt(history: Sequence[Event]) -> Check:
    """Within a generation, once attempt n owns the run no write carries an attempt < n
    (a paused or partitioned zombie is fenced, R-EXEC-7). Restates the guard's QG008."""
    name = "no write by a superseded attempt"
    bad = []
    judged = 0
    for run, evs in _by_run(_of(history, "transition")).items():
        highest: dict[int, int] = {}
        for e in evs:
            attempt = e.get("owner_attempt")
            if attempt is None:
                continue
            judged += 1
            gen = int(e["generation"])
            if attempt < highest.get(gen, 0):
                bad.append(f"{run}: attempt {attempt} wrote v{e['row_version']} after attempt {highest[gen]}")
            highest[gen] = max(highest.get(gen, 0), int(attempt))
    return Check(name, not bad, _summary(bad) or f"{judged} owned writes", ("R-EXEC-7",),
                 judged=judged, restates="QG008")


def _token(text: str | None) -> tuple[str, int, int] | None:
    """``<run_id>:<generation>:<attempt>`` of a writer token, or None (no owner, or a
    token this harness cannot read: the checker then reports it)."""
    if not text:
        return None
    run, _, rest = str(text).partition(":")
    gen, _, attempt = rest.partition(":")
    try:
        return run, int(gen), int(attempt)
    except ValueError:
        return run, -1, -1


def every_write_by_its_owner(history: Sequence[Event]) -> Check:
    """Every write is checked against the run's owner at that ``row_version``, by the
    writer's identity the writing session itself gave the audit trigger (R-EXEC-7,
    R-EXEC-2): a session holding an owner token (an activity attempt) wrote only its own
    run, in its own generation, while holding the run's advisory lock; a ``running ->
    running`` write (claim, checkpoint, journal) was made by exactly the stored owner
    attempt, any other by that attempt or a later claimer (which may end a run its dead
    predecessor owned); and a ``running -> running`` write by a session with no token
    was made by no owner at all. Histories from before the writer columns carry no
    ``writer_pid`` and are not judged here."""
    name = "every write by its owner"
    bad: list[str] = []
    judged = 0
    for e in _of(history, "transition"):
        if "writer_pid" not in e:
            continue
        judged += 1
        run, version = str(e["run_id"]), e["row_version"]
        token = _token(e.get("writer_token"))
        stay = e.get("old_state") == e["new_state"] == "running"
        if token is None:
            if stay:
                bad.append(f"{run} v{version}: running -> running by pid {e['writer_pid']}"
                           f" ({e.get('writer_role')}), which owns nothing")
            continue
        t_run, t_gen, t_attempt = token
        owner = e.get("owner_attempt")
        if t_run != run or t_gen != int(e["generation"]):
            bad.append(f"{run} v{version}: written by the owner token of {t_run} generation {t_gen}")
        elif owner is not None and (t_attempt != owner if stay else t_attempt < owner):
            bad.append(f"{run} v{version}: written by attempt {t_attempt} while attempt {owner} owns it")
        if not e.get("writer_lock"):
            bad.append(f"{run} v{version}: attempt {t_attempt} wrote without the run's advisory lock")
    return Check(name, not bad, _summary(bad) or f"{judged} writes", ("R-EXEC-7", "R-EXEC-2"),
                 judged=judged)


_WORKFLOW_ID = re.compile(r"^agent-run-(?P<run>[0-9a-f-]{36})-g(?P<gen>[0-9]+)$")


def one_workflow_per_generation(history: Sequence[Event]) -> Check:
    """Temporal holds at most one execution per workflow id, and every durable workflow id
    names a generation its run reached (R-CREATE-5): dispatch identity held under
    retries, reconciler sweeps and faults. Judges every workflow of the namespace the
    listing saw that is the scenario's — on its task queue, or naming one of its runs
    under any id or queue: a workflow naming one of its runs on another task queue is a
    misdirected dispatch (unless a process of the scenario was started on that queue, its
    ``process`` events). An execution whose recorded input names a run and generation is
    that generation's, under whatever id: it must be under the generation's id
    (``agent-run-<run>-g<n>``), and one generation's executions under one id.
    Vacuous without ``workflow`` events."""
    name = "one Temporal workflow per run generation"
    failed = [e["error"] for e in _of(history, "workflow_listing") if e.get("error")]
    if failed:
        return Check(name, None, f"Temporal's executions could not be listed: {failed[0]}",
                     ("R-CREATE-5", "R-Q-5"))
    generations = {str(e["run_id"]): int(e["generation"]) for e in _of(history, "run")}
    ours = [e for e in _of(history, "workflow")
            if e.get("ours", True) or any(run in str(e["workflow_id"]) for run in generations)]
    per_id = Counter(str(e["workflow_id"]) for e in ours)
    bad = [f"{wid}: {n} executions" for wid, n in per_id.items() if n > 1]
    queues = {str(e["settings"]["QIMPL_TASK_QUEUE"]) for e in _of(history, "process")
              if "QIMPL_TASK_QUEUE" in (e.get("settings") or {})}
    bad += [f"{e['workflow_id']}: started on task queue {e.get('task_queue')}, where no process of the"
            " scenario was" for e in ours if e.get("ours") is False and e.get("task_queue") not in queues]
    # The generation an execution was started for is its input's (as Temporal recorded it),
    # whatever its id: a second execution of one generation under another id is a second
    # dispatch of it, and an id other than the generation's dispatch identity is none.
    ids_of: dict[tuple[str, int], set[str]] = {}
    for e in ours:
        given = e.get("input")
        if not isinstance(given, dict) or not given.get("run_id") or given.get("generation") is None:
            continue
        try:
            key = (str(given["run_id"]), int(given["generation"]))
        except (TypeError, ValueError):
            bad.append(f"{e['workflow_id']}: started with generation {given.get('generation')!r}")
            continue
        ids_of.setdefault(key, set()).add(str(e["workflow_id"]))
        if str(e["workflow_id"]) != f"agent-run-{key[0]}-g{key[1]}":
            bad.append(f"{e['workflow_id']}: started for run {key[0]} generation {key[1]}, whose dispatch"
                       f" identity is agent-run-{key[0]}-g{key[1]}")
    bad += [f"{run} generation {gen}: executions under {len(ids)} workflow ids ({', '.join(sorted(ids))})"
            for (run, gen), ids in sorted(ids_of.items()) if len(ids) > 1]
    for wid in per_id:
        m = _WORKFLOW_ID.match(wid)
        if m is None:
            continue  # the version-1 workflow type and other ids are not generations
        if int(m["gen"]) > generations.get(m["run"], 0):
            bad.append(f"{wid}: no such generation (run at {generations.get(m['run'])})")
    return Check(name, not bad, _summary(bad) or f"{len(per_id)} workflows", ("R-CREATE-5", "R-Q-5"),
                 judged=len(per_id))


def workflow_input_matches_its_run(history: Sequence[Event]) -> Check:
    """Every generation's workflow was started with its own run, generation and the run's
    ``deadline_at`` as Temporal recorded the input (R-EXEC-8, R-RESUME-1): a resume or an
    approval keeps the deadline, and a reused or stale input (another run's, an older
    generation's) is caught where the worker would act on it. Judges the version-2
    workflows of the listing whose input was read (``input``) and whose run is in the
    history; vacuous without them."""
    from datetime import datetime

    name = "each workflow started with its own run, generation and deadline_at"
    deadlines = {str(e["run_id"]): float(e["deadline_t"]) for e in _of(history, "run") if e.get("deadline_t")}
    bad, judged = [], 0
    for wf in _of(history, "workflow"):
        m = _WORKFLOW_ID.match(str(wf["workflow_id"]))
        given = wf.get("input")
        if m is None or not isinstance(given, dict) or m["run"] not in deadlines:
            continue
        judged += 1
        try:
            deadline = datetime.fromisoformat(str(given.get("deadline_at"))).timestamp()
        except ValueError:
            deadline = float("nan")
        if given.get("run_id") != m["run"] or int(given.get("generation") or 0) != int(m["gen"]):
            bad.append(f"{wf['workflow_id']}: input names run {given.get('run_id')} g{given.get('generation')}")
        if not abs(deadline - deadlines[m["run"]]) <= 0.001:
            bad.append(f"{wf['workflow_id']}: input deadline_at {given.get('deadline_at')}, the run's is "
                       f"{deadlines[m['run']]:.3f} (epoch s)")
    return Check(name, not bad, _summary(bad) or f"{judged} workflows", ("R-EXEC-8", "R-RESUME-1"),
                 judged=judged)
