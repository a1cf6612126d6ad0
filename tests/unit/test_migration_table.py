"""The head schema's state list and transition table are the pure model's, and every
migration revision is self-describing (issue 26)."""

import ast
import re
from pathlib import Path

import pytest

import qimpl.db.migrate as migrate
from qimpl.db.snapshot import SCHEMA_SQL
from qimpl.lifecycle import TRANSITIONS, RunState

_VERSIONS = Path(migrate.__file__).parent / "migrations" / "versions"
#: Version-1 rows may still say ``streaming`` (R-READ-4); the model has no such state.
_LEGACY = "streaming"


def _head_transitions() -> list[tuple[str, str]]:
    rows = re.findall(r"^INSERT INTO public\.run_allowed_transitions VALUES \('(\w+)', '(\w+)'\);$",
                      SCHEMA_SQL.read_text(), re.M)
    assert rows, "schema.sql lists no allowed transitions"
    return rows


@pytest.mark.req("R-STATE-1")
def test_sql_transition_table_mirrors_the_pure_model() -> None:
    rows = [(a, b) for a, b in _head_transitions() if a != _LEGACY]
    assert {(RunState(a), RunState(b)) for a, b in rows} == set(TRANSITIONS)
    assert len(rows) == len(set(rows))


@pytest.mark.req("R-STATE-2")
def test_sql_states_are_the_model_states() -> None:
    check = re.search(r"CONSTRAINT runs_state_check CHECK \(\(\(\(state\)::text = ANY \(\(ARRAY\[(.*?)\]",
                      SCHEMA_SQL.read_text())
    assert check, "schema.sql has no runs_state_check"
    states = re.findall(r"'(\w+)'::character varying", check.group(1))
    assert set(states) == {s.value for s in RunState}


def test_no_revision_loads_another() -> None:
    """Each revision carries the SQL it runs and restores (issue 26): it imports nothing
    but alembic, and never reads another revision's file or constants."""
    files = sorted(_VERSIONS.glob("*.py"))
    assert len(files) >= 19
    for path in files:
        tree = ast.parse(path.read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert imported <= {"alembic", "__future__"}, (path.name, imported)
        names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        assert not names & {"load_revision", "importlib", "open", "__import__"}, path.name
