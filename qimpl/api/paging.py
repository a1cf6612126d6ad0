"""Keyset pagination of run listings (R-READ-5), pure: the opaque cursor a page ends with
and the merge of several tenants' pages into one.

A cursor is the position of a page's last row, ``(accepted_at, run_id)``, and the order
it was read in, as unpadded URL-safe base64 of a JSON array. It names no tenant and
grants nothing: a listing still reads only what row-level security shows the caller."""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

__all__ = ["decode_cursor", "encode_cursor", "merge_pages"]


def encode_cursor(row: Mapping[str, Any], *, newest_first: bool) -> str:
    """The cursor that continues after ``row`` (a listing row with ``accepted_at`` and
    ``run_id``)."""
    doc = [row["accepted_at"].isoformat(), str(row["run_id"]), "desc" if newest_first else "asc"]
    return base64.urlsafe_b64encode(json.dumps(doc, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(cursor: str, *, newest_first: bool) -> tuple[datetime, str]:
    """``(accepted_at, run_id)`` of a cursor made by ``encode_cursor`` for the same order.
    ValueError for anything else (the route answers 422 ``cursor_invalid``)."""
    if len(cursor) > 200:
        raise ValueError("cursor too long")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        doc = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError) as exc:
        raise ValueError("not a cursor") from exc
    if not (isinstance(doc, list) and len(doc) == 3 and all(isinstance(v, str) for v in doc)):
        raise ValueError("not a cursor")
    if doc[2] != ("desc" if newest_first else "asc"):
        raise ValueError("a cursor of another listing")
    at = datetime.fromisoformat(doc[0])
    if at.tzinfo is None:
        raise ValueError("cursor time without a zone")
    return at, str(uuid.UUID(doc[1]))


def merge_pages(pages: Iterable[list[dict[str, Any]]], *, limit: int,
                newest_first: bool) -> tuple[list[dict[str, Any]], bool]:
    """One page from per-tenant pages (each already ordered and cut at ``limit + 1`` rows):
    the first ``limit`` rows in ``(accepted_at, run_id)`` order, and whether any row is
    left after them (a next page exists)."""
    rows = sorted((r for page in pages for r in page),
                  key=lambda r: (r["accepted_at"], str(r["run_id"])), reverse=newest_first)
    return rows[:limit], len(rows) > limit
