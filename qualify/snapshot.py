"""``python -m qualify.snapshot``: regenerate ``qimpl/db/schema.sql`` (the head schema in
one file, ``qimpl.db.snapshot``) from a fresh database of a disposable embedded stack."""

from __future__ import annotations

import sys

from qimpl.db.snapshot import SCHEMA_SQL, snapshot
from qualify.stack import EmbeddedStack
from qualify.stack.postgres import embedded_bin_dir

__all__ = ["main"]


def main() -> int:
    """Write ``schema.sql``; returns the exit code (0)."""
    with EmbeddedStack() as stack:
        text = snapshot(str(stack.create_database()), pg_dump=embedded_bin_dir() / "pg_dump")
    SCHEMA_SQL.write_text(text)
    print(f"wrote {SCHEMA_SQL} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
