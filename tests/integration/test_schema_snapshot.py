"""``qimpl/db/schema.sql`` is what the migrations build (issue 22, item 4)."""

from __future__ import annotations

import difflib
from typing import Any

import pytest

from qimpl.db.snapshot import SCHEMA_SQL, normalise, snapshot
from qualify.stack.postgres import embedded_bin_dir


@pytest.mark.req("R-STATE-1")
def test_schema_sql_is_the_migrated_head(stack: Any) -> None:
    fresh = snapshot(str(stack.create_database()), pg_dump=embedded_bin_dir() / "pg_dump")
    committed = SCHEMA_SQL.read_text()
    diff = "".join(difflib.unified_diff(committed.splitlines(True), fresh.splitlines(True),
                                        "qimpl/db/schema.sql", "migrated head", n=1))
    assert fresh == committed, f"regenerate with `python -m qualify.snapshot`:\n{diff[:4000]}"
    assert "CREATE TRIGGER runs_transition_guard BEFORE INSERT OR UPDATE" in committed


def test_normalise_drops_what_is_not_schema() -> None:
    dump = "--\n-- PostgreSQL dump\n\\restrict abc\nSET x = 1;\n\n\n\nCREATE TABLE t ();\n\\unrestrict abc\n"
    assert normalise(dump).endswith("\nCREATE TABLE t ();\n")
    assert "restrict" not in normalise(dump) and "SET x" not in normalise(dump)
