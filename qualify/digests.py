"""One digest for every comparison the harness makes by fingerprint (pure): what a fake
records of a value (a tool result, a step's state) and what a checker computes from the
database's copy of it must hash alike."""

from __future__ import annotations

import hashlib
import json

__all__ = ["canonical_sha256"]


def canonical_sha256(value: object) -> str:
    """SHA-256 (hex) of ``value``'s canonical JSON (keys sorted, no spaces; ``null`` for None)."""
    doc = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(doc.encode()).hexdigest()
