"""Checkers: pure functions of a history (R-Q-5). No I/O; each returns a ``Check``.

One module per concern: ``lifecycle``, ``owners`` (the fence), ``events`` (the event
journal and streams), ``tools`` (the tool journal) and ``usage``; ``_base`` holds
``Check``. Every checker has a unit test with a bad history it must catch
(``tests/unit/test_checkers.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from qualify.checkers._base import TERMINAL, Check, accepted_runs
from qualify.checkers.answers import completed_with_the_scripted_answer
from qualify.checkers.events import (
    event_journal_matches_run_record,
    event_prunes_bounded,
    stream_events_consistent,
    writes_committed_whole,
)
from qualify.checkers.lifecycle import (
    ASK_BOUND,
    CLAIMS_WITHOUT_PROGRESS,
    PROVIDER_CLOCK_SLACK_S,
    SLOT_STATES,
    checkpoints_one_per_step,
    deadline_from_acceptance,
    deadline_respected,
    every_run_ended,
    no_crash_loop,
    no_step_repeated_after_checkpoint,
    no_write_after_terminal,
    one_terminal_state,
    row_version_strictly_increasing,
    slot_holders,
    slot_limit_respected,
    state_restored_at_every_step,
    transition_audit_matches_run_record,
)
from qualify.checkers.owners import (
    every_write_by_its_owner,
    no_write_by_a_superseded_attempt,
    one_workflow_per_generation,
    workflow_input_matches_its_run,
)
from qualify.checkers.tools import (
    SINK_CLOCK_SLACK_S,
    no_execution_without_intent,
    no_side_effect_repeated,
    no_unapproved_effect,
    provider_fed_the_journal,
)
from qualify.checkers.usage import (
    RECORD_CLOCK_SLACK_S,
    provider_calls_recorded,
    token_total,
    usage_events_match_the_record,
)
from qualify.history import Event

__all__ = [
    "ASK_BOUND",
    "CLAIMS_WITHOUT_PROGRESS",
    "GENERIC_CHECKERS",
    "PROVIDER_CLOCK_SLACK_S",
    "RECORD_CLOCK_SLACK_S",
    "SINK_CLOCK_SLACK_S",
    "SLOT_STATES",
    "TERMINAL",
    "Check",
    "accepted_runs",
    "checkpoints_one_per_step",
    "completed_with_the_scripted_answer",
    "deadline_from_acceptance",
    "deadline_respected",
    "event_journal_matches_run_record",
    "event_prunes_bounded",
    "every_run_ended",
    "every_write_by_its_owner",
    "no_crash_loop",
    "no_execution_without_intent",
    "no_side_effect_repeated",
    "no_step_repeated_after_checkpoint",
    "no_unapproved_effect",
    "no_write_after_terminal",
    "no_write_by_a_superseded_attempt",
    "one_terminal_state",
    "one_workflow_per_generation",
    "provider_calls_recorded",
    "provider_fed_the_journal",
    "row_version_strictly_increasing",
    "run_checks",
    "slot_holders",
    "slot_limit_respected",
    "state_restored_at_every_step",
    "stream_events_consistent",
    "token_total",
    "transition_audit_matches_run_record",
    "usage_events_match_the_record",
    "workflow_input_matches_its_run",
    "writes_committed_whole",
]


GENERIC_CHECKERS: tuple[Callable[[Sequence[Event]], Check], ...] = (
    every_run_ended,
    one_terminal_state,
    row_version_strictly_increasing,
    no_write_after_terminal,
    no_step_repeated_after_checkpoint,
    checkpoints_one_per_step,
    state_restored_at_every_step,
    no_write_by_a_superseded_attempt,
    every_write_by_its_owner,
    deadline_respected,
    stream_events_consistent,
    event_journal_matches_run_record,
    usage_events_match_the_record,
    writes_committed_whole,
    event_prunes_bounded,
    no_side_effect_repeated,
    no_execution_without_intent,
    no_unapproved_effect,
    provider_fed_the_journal,
    completed_with_the_scripted_answer,
    transition_audit_matches_run_record,
    deadline_from_acceptance,
    one_workflow_per_generation,
    workflow_input_matches_its_run,
    provider_calls_recorded,
    no_crash_loop,
)


def run_checks(
    history: Sequence[Event], checkers: Iterable[Callable[[Sequence[Event]], Check]]
) -> list[Check]:
    """Run each checker; one that raises gives ``ok=None`` (verdict ``unknown``), never green."""
    out = []
    for checker in checkers:
        try:
            out.append(checker(history))
        except Exception as exc:  # noqa: BLE001 - attached to the report as unknown
            out.append(Check(getattr(checker, "__name__", "checker"), None,
                             f"checker raised {type(exc).__name__}: {exc}"))
    return out
