"""Receipts compared whole (R-CREATE-2, R-CREATE-3, R-RESUME-1): a replay must carry the
original receipt, not only its run id; a receipt must say what the database holds."""

from __future__ import annotations

from datetime import datetime
from typing import Any

__all__ = ["RECEIPT_FIELDS", "receipt_against_the_run", "receipt_diff"]

#: Fields whose values a report never shows (a stream key reads a run's events, R-AUTH-3).
_SECRET = frozenset({"stream_key"})
#: What a replay repeats of the original receipt. ``state`` is left out: a replay says
#: where the run is now (``qimpl.api.receipts``).
RECEIPT_FIELDS = ("agent_id", "run_id", "stream_key", "lifecycle_version", "durability", "deadline_at")


def receipt_diff(original: dict[str, Any], replay: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The receipt fields in which ``replay`` differs from ``original`` (pure); {} when the
    same receipt. A field missing from either counts as a difference."""
    return {k: _shown(k, original.get(k), replay.get(k)) for k in RECEIPT_FIELDS
            if k not in original or k not in replay or original[k] != replay[k]}


def _shown(field: str, a: Any, b: Any) -> tuple[Any, Any]:
    return ("<redacted>", "<redacted: another>") if field in _SECRET else (a, b)


def receipt_against_the_run(receipt: dict[str, Any], row: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Where a receipt differs from its run as the database holds it (``row``: ``run_id``,
    ``stream_key`` and ``deadline_t``, epoch seconds); {} when it agrees (pure)."""
    out: dict[str, tuple[Any, Any]] = {}
    for k in ("run_id", "stream_key"):
        if str(receipt.get(k)) != str(row.get(k)):
            out[k] = _shown(k, receipt.get(k), row.get(k))
    try:
        said = datetime.fromisoformat(str(receipt.get("deadline_at"))).timestamp()
    except ValueError:
        said = None
    if said is None or abs(said - float(row["deadline_t"])) > 1e-3:
        out["deadline_at"] = (receipt.get("deadline_at"), row.get("deadline_t"))
    return out
